"""The skeleton of every service that consumes Kafka: it owns start and stop,
the clients, the reconnecting database connection, the leased assignment of
per-tenant topics, and the Kafka plumbing (poison records and their dead
letters, produce retries, paced commits, the hand-over of partitions, lag), so
that a service holds only what a record means to it. River's
`internal/startstop` and `internal/baseservice` are the model.

Two ways to use it:

- `ConsumerService`, a base for a loop on a thread of its own (dispatcher,
  workflow, executor): the subclass gives `turn` (one pass: consume and handle
  what came) and, where it holds state per partition, `forget`; `run` does the
  rest in this order, each pass: follow the assignment, the turn, commit
  (paced), report lag; and on the way out: `stopping`, a final synchronous
  commit, hand back the leases, close the consumer, the watch, the producer
  (flushed) and the database.
- The pieces on their own (`Poison`, `expect_owned`, `DeadLetters`,
  `produce`, `cronwheel.consuming.TrackedOffsets` and `take`, `shut_down`),
  for a service whose loop is not a thread's (the webhook service runs
  asyncio, its consumer on a thread of its own).

A poison record is never lost, never crashes a consumer and never stalls its
partition: it goes to the dead-letter topic as a `DeadLetter` record
(schemas/DeadLetter.v1.avsc, the source's exact bytes), is counted in
`cronwheel_dead_letters_total{consumer, reason}`, and its offset is committed
once the broker has acknowledged the dead letter.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Container, Iterable
from typing import Protocol

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from cronwheel import consuming, kafka, metrics, runtime
from cronwheel.assignment import LeasedAssignment
from cronwheel.core.avro import UndecodableRecord, default_registry
from cronwheel.core.clock import now_ms
from cronwheel.fetch_nudge import FetchNudge, ensurer
from cronwheel.fetch_watch import DeliveryWatch, EndsAsked, FetchWatch
from cronwheel.kafka import Placement, Topics
from cronwheel.producer_shards import HOT_RATE, ShardedProducer, produce
from cronwheel.store.db import Reconnecting
from cronwheel.store.leases import Leases
from cronwheel.topic_watch import TopicWatch
from cronwheel.topics_met import RenewingProducer

RECORD_HEADER = "record"  # the Avro record a produced value holds (`RunReady`, `DeadLetter`)
# Error events logged at debug only: a topic assigned before the broker knows
# it, or deleted, is expected (topics come and go with tenants).
QUIET = (KafkaError.UNKNOWN_TOPIC_OR_PART,)
# The metadata refresh of a consumer that assigns its partitions by name (open).
ASSIGNED_METADATA_REFRESH_MS = 60_000
# A topic just made: a first fetch of one of its partitions can fail with
# "leader epoch is newer than broker epoch" (the broker has not yet applied
# the leader epoch the client read in its metadata), and librdkafka then
# leaves the partition out of its fetches for fetch.error.backoff.ms, 500 ms
# by default: a new tenant's first run waited ~500 ms about once in 60-100
# (librdkafka's debug log, docs/dispatcher.md). At 50 ms, a partition that
# keeps failing (a topic deleted while still assigned) costs a fetch every
# 50 ms until it is unassigned, where it cost one every 500 ms. (The
# assignment also asks a new partition's leader until it serves it before
# assigning it, assignment.until_served, so such errors are now rare.)
NEW_TOPIC_FETCH_ERROR_BACKOFF_MS = 50
# Closing a consumer librdkafka left stuck is waited on this long at most.
CLOSE_WAIT_S = 10.0


class ClientsWedged(Exception):
    """This service's Kafka clients hold work they do not do (cronwheel.fetch_watch):
    `run` ends with it, and whoever runs the service starts it again with new
    clients (`run_restarting`), or the process exits for its supervisor to."""


class Poison(Exception):
    """A record this consumer cannot handle: it is dead-lettered, not retried.
    `kind` labels the dead-letter metric, `reason` says why (in the record)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def expect(value: bytes | None, record: str) -> dict:
    """The datum of the `record` (an Avro record's name) that `value` holds;
    Poison if it holds something else or nothing that decodes."""
    try:
        name, datum = default_registry().decode(value)
    except UndecodableRecord as exc:
        raise Poison("undecodable", exc.reason) from None
    if name != record:
        raise Poison("wrong_record", f"expected {record}, got {name}")
    return datum


def expect_owned(m: Message, record: str, topic_of: Callable[[str], str]) -> dict:
    """As `expect`, for a record read from a per-tenant topic: Poison unless
    the datum's `tenant_id` owns the topic it was read from (`topic_of`
    names a tenant's), so one tenant's topic never acts for another."""
    datum = expect(m.value(), record)
    tenant = datum["tenant_id"]
    try:
        owner = topic_of(tenant)
    except ValueError:
        owner = None
    if owner != m.topic():
        raise Poison("wrong_tenant", f"tenant_id {tenant!r} does not own {m.topic()}")
    return datum


def make_known(producer: Producer, topic: str, make: Callable[[str], None]) -> None:
    """Make `topic` (`make`: where the caller's role may create it; the broker
    creates none on a produce) and have `producer` learn it, before its first
    record there: a producer not yet told a topic is missing takes the record,
    holds it 30 s and fails it, and a flush waits that long (the relay's first
    wake once held its whole batch so)."""
    make(topic)
    _learn_topic(producer, topic)


def _learn_topic(producer: Producer, topic: str, timeout: float = 10.0) -> None:
    """Refresh the producer's metadata of a topic just made: it remembers the
    topic as unknown, and refuses a produce to it, until its metadata says
    otherwise. Bounded by `timeout` (then the produce's error stands)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            meta = producer.list_topics(topic, timeout=2).topics.get(topic)
        except KafkaException:
            continue  # asked again until the deadline
        if meta is not None and meta.error is None and meta.partitions:
            return


class DeadLetters:
    """Sets poison records aside on the dead-letter topic, as `DeadLetter`
    records keyed by the source's key, and counts them per consumer."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        consumer: str,
        log: logging.Logger,
        make_topic: Callable[[str], None] | None = None,
    ):
        self.producer = producer
        self.make_topic = make_topic  # for a dead-letter topic not made yet (`make_known`)
        self._made = False  # make_topic called and the topic learned
        self.topic = topic
        self.consumer = consumer
        self.log = log
        self.total = 0  # counted (`count`): each poison record once

    def record(self, m: Message, p: Poison) -> dict:
        """produce()'s arguments for `m`'s dead letter (no delivery callback)."""
        self.log.warning(
            "dead-lettering %s[%d]@%d: %s", m.topic(), m.partition(), m.offset(), p.reason
        )
        value = default_registry().encode(
            "DeadLetter",
            {
                "source_topic": m.topic(),
                "source_partition": m.partition(),
                "source_offset": m.offset(),
                "key": m.key(),
                "value": m.value(),
                "reason": p.reason,
                "consumer": self.consumer,
                "at": now_ms(),
            },
        )
        return {
            "topic": self.topic,
            "key": m.key(),
            "value": value,
            "headers": [(RECORD_HEADER, b"DeadLetter")],
        }

    def produce(self, m: Message, p: Poison, on_delivery: Callable | None = None) -> None:
        """Produce `m`'s dead letter; `on_delivery(err, msg)` says whether the
        broker has it (only then may `m`'s offset be committed)."""
        if self.make_topic is not None and not self._made:
            make_known(self.producer, self.topic, self.make_topic)
            self._made = True
        produce(self.producer, **self.record(m, p), on_delivery=on_delivery)

    def count(self, p: Poison) -> None:
        self.total += 1
        metrics.DEAD_LETTERS.labels(self.consumer, p.kind).inc()

    def send(
        self, dead: list[tuple[Message, Poison]], stop: threading.Event, grace_s: float
    ) -> bool:
        """Produce each one and wait until the broker has them all, producing
        again (after a pause doubling to 5 s) what it refused; then count them.
        False if `stop` came first: after `grace_s` of it, what is still queued
        is purged, and nothing is counted (the records come again)."""
        pending = dead
        backoff = 0.1
        while pending:
            failed: list[tuple[Message, Poison]] = []
            for item in pending:

                def on_delivery(err, _msg, item=item, failed=failed):
                    if err is not None:
                        self.log.warning("dead letter not delivered: %s", err)
                        failed.append(item)

                self.produce(*item, on_delivery=on_delivery)
            if not flush(self.producer, stop, grace_s):
                return False
            if failed:
                if stop.wait(backoff):
                    return False
                backoff = min(backoff * 2, 5.0)
            pending = failed
        for _m, p in dead:
            self.count(p)
        return True


def flush(producer: Producer, stop: threading.Event, grace_s: float) -> bool:
    """Wait until the producer has an answer for every record; once `stop` is
    set, at most `grace_s` more, then purge what is left and return False."""
    give_up: float | None = None
    while len(producer) > 0:
        producer.flush(0.5)
        if stop.is_set():
            give_up = give_up or time.monotonic() + grace_s
            if time.monotonic() >= give_up:
                producer.purge()
                producer.flush(0)
                return False
    return True


def watch_fetching(
    watch: FetchWatch,
    watched: Callable[[], list[consuming.Where]],
    position: Callable[[list[consuming.Where]], dict],
    asked: EndsAsked,
) -> None:
    """A fetch watch's look (cronwheel.fetch_watch) at the partitions a
    consumer holds and means to read (`watched()`), on every pass of its
    loop: when a look is due, their positions now and their ends asked of
    the broker off the loop (`asked`); at the pass after the answer, those
    not read for a whole look though the broker has records for them raise
    ClientsWedged, for new clients to take over."""
    answer = asked.answered()
    if answer is not None:
        at, ends = answer
        stuck = watch.look(list(at), at.get, lambda keys: ends)
        if stuck:
            (t, p), every = stuck[0], watch.every_s
            raise ClientsWedged(
                f"{len(stuck)} partitions not read for {every:.0f} s though the broker has "
                f"records for them ({t}[{p}] at {at[(t, p)]})"
            )
    elif not asked.asking and watch.due():
        keys = watched()
        at = position(keys) if keys else {}
        known = {key: v for key, v in at.items() if v is not None and v >= 0}
        if known:
            asked.ask(known)
        else:  # nothing to ask of the broker: the look notes as much at once
            watch.look([], known.get, lambda keys: {})


def watch_delivering(
    watch: DeliveryWatch, producer: Producer, reports: int, broker_answers: Callable[[], bool]
) -> None:
    """A delivery watch's look (cronwheel.fetch_watch) at `producer`, which
    has given `reports` delivery reports so far: stuck raises ClientsWedged."""
    producer.poll(0)
    # A sharded producer is watched shard by shard (cronwheel.producer_shards).
    watched = getattr(producer, "watched", None)
    each = watched() if watched is not None else {0: (len(producer), reports)}
    if watch.look_each(each, broker_answers):
        raise ClientsWedged(
            f"{len(producer)} records held by the producer with no delivery report for "
            f"{watch.every_s:.0f} s, though the broker answers a new client"
        )


class Restartable(Protocol):
    """What run_restarting runs: a service whose `run` ends with
    ClientsWedged when its Kafka clients are stuck."""

    name: str
    log: logging.Logger

    def run(self, stop: threading.Event) -> None: ...


def run_restarting(make: Callable[[], Restartable], stop: threading.Event) -> None:
    """Run the service `make` makes until `stop`; when its Kafka clients are
    stuck (ClientsWedged), say why, count it, and run a new one: new clients,
    the same leases handed back and taken again, the records read again from
    the committed offsets and skipped where already done (as after a
    restart, without the process's start-up)."""
    while True:
        service = make()
        runtime.freeze_heap()
        try:
            service.run(stop)
            return
        except ClientsWedged as exc:
            service.log.error("its Kafka clients are stuck; starting new ones: %s", exc)
            metrics.KAFKA_CLIENTS_RESTARTED.labels(service.name).inc()


def shut_down(
    consumer: Consumer,
    offsets: consuming.Offsets,
    db: Reconnecting,
    assignment: LeasedAssignment | None = None,
    watch: TopicWatch | None = None,
) -> None:
    """A consumer's way out: commit what finished (synchronously), hand the
    leases back (the others take the tenants at their next renewal), close
    the consumer and the topic watch."""
    offsets.commit(consumer, asynchronous=False)
    if assignment is not None:
        assignment.leave(db)
    # Bounded: a consumer librdkafka left stuck may not close (ClientsWedged).
    closing = threading.Thread(target=consumer.close, daemon=True, name="cronwheel-close")
    closing.start()
    closing.join(CLOSE_WAIT_S)
    if watch is not None:
        watch.close()


class ConsumerService:
    """The base of a consuming service whose loop runs on a thread: see the
    module's docstring. `name` labels its metrics and dead letters and ends
    its group id (`<prefix>.<name>`, which also names its leases)."""

    name = ""

    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        topics: Topics,
        *,
        group_id: str | None = None,
        batch: int = 500,
        idle_ms: int = 200,
        max_wait_ms: int = 0,
        lag_every_ms: int = 5_000,
        shutdown_grace_ms: int = 10_000,
        commit_every_s: float = consuming.COMMIT_EVERY_S,
        producer_shards: int = 1,
        producer_hot_topics: int = 0,
        producer_hot_rate: float = HOT_RATE,
    ):
        """`producer_shards`: producers its records go out through
        (cronwheel.producer_shards), a topic always through the same one;
        `producer_hot_topics`: how many of the busiest topics (at
        `producer_hot_rate` records a second or more) get one more."""
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id or f"{topics.prefix}.{self.name}"
        self.batch = batch  # records taken at most per consume
        self.idle_ms = idle_ms  # how long a consume blocks for a first record
        self.max_wait_ms = max_wait_ms  # then, how long for more
        self.lag_every_ms = lag_every_ms
        self.shutdown_grace_ms = shutdown_grace_ms
        self.log = logging.getLogger(f"cronwheel.{self.name}")
        # Made anew in place when a subclass gives it a TopicsMet and most
        # topics it met went quiet (cronwheel.topics_met).
        self.producer = RenewingProducer(
            lambda: ShardedProducer(
                lambda: kafka.producer(bootstrap, principal=self.name),
                producer_shards,
                hot_topics=producer_hot_topics,
                hot_rate=producer_hot_rate,
            )
        )
        self.dead_letters = DeadLetters(
            self.producer, topics.dead_letter, self.name, self.log, self.make_topic
        )
        self.offsets = consuming.Offsets(
            self.name, commit_every_s=commit_every_s, lag_every_s=lag_every_ms / 1000
        )
        self._db = Reconnecting(dsn, self.log)
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        self.assignment: LeasedAssignment | None = None
        self.watch: TopicWatch | None = None
        self.fetch_nudge: FetchNudge | None = None  # lease_tenant_topics'
        # Hand-assigned consumers: partitions librdkafka stopped fetching
        # (cronwheel.fetch_watch), asked of the broker through `asker`, a
        # client of the watch's own (made when first asked, renewed when it
        # gets no answer), on a thread of the ask's own (`_ends_asked`).
        self.fetch_watch: FetchWatch | None = None
        self.asker = kafka.RenewingAsker(
            bootstrap, principal=self.name, group=f"{self.group_id}.ask"
        )
        self._ends_asked = EndsAsked(self.asker.end_offsets)  # its thread made at the first ask
        # A producer that holds records and reports no delivery while the
        # broker answers a new client (cronwheel.fetch_watch): a subclass that
        # sets it counts its delivery reports in `delivery_reports`.
        self.delivery_watch: DeliveryWatch | None = None
        self.delivery_reports = 0

    @property
    def dead_lettered_total(self) -> int:
        return self.dead_letters.total

    def lease_tenant_topics(
        self,
        kind: str,
        *,
        ttl_ms: int = 10_000,
        placement: Placement | None = None,
        nudge: bool = True,
        **watch,
    ) -> None:
        """Read the per-tenant topics `<prefix>.<kind>.<tenant>` by name, those
        of the tenants whose partitions this instance leases
        (cronwheel.assignment), rather than by a group's rebalance. `watch`:
        TopicWatch's options. `nudge`: end the consumer's fetch when topics
        are assigned through a topic of the service's own
        (cronwheel.fetch_nudge); False for a service that has another."""
        prefix = f"{self.topics.prefix}.{kind}."
        if nudge:
            self.fetch_nudge = FetchNudge(
                self.topics.nudge(self.name),
                self.producer,
                ensurer(self.bootstrap, self.name),
            )
            # An announced topic ends the wait for records at once (TopicWatch).
            watch.setdefault("on_change", self.fetch_nudge.wake)
            watch.setdefault("wake_on_announce", True)
        self.watch = TopicWatch(self.dsn, self.producer, prefix, **watch)
        self.assignment = LeasedAssignment(
            Leases(self.group_id, ttl_ms=ttl_ms),
            prefix,
            placement or Placement(self.producer),
            end_fetch=self.end_fetch,
        )

    def watch_delivery(self) -> None:
        """The delivery watch's look, when one is due: ClientsWedged if the
        producer holds records it neither delivers nor fails. Between turns,
        and inside a turn's own wait for acknowledgements (the dispatcher's
        `_settle`), which a stuck producer would otherwise make endless: a
        dispatcher with as many batches in flight as it allows waits there,
        and a producer left stuck by a broker restart never acknowledges
        them."""
        if self.delivery_watch is not None and self.delivery_watch.due():
            watch_delivering(
                self.delivery_watch, self.producer, self.delivery_reports,
                lambda: kafka.answers(self.bootstrap, principal=self.name),
            )  # fmt: skip

    # -- start and stop ---------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self._stop = stop
        self._dead_letter_topic()
        consumer = self._consumer = self.open()
        try:
            self._warm()
            while not stop.is_set():
                if self.assignment is not None and not self._follow(consumer, stop):
                    break  # stopping while the database is away
                if not self.turn(consumer, stop):
                    break  # stopping mid-batch: uncommitted, so consumed again later
                self.offsets.commit(
                    consumer,
                    asynchronous=True,
                    assigned=self.assignment.assigned if self.assignment is not None else None,
                )
                self.offsets.report_lag(
                    consumer,
                    skip=self.asleep(),
                    assigned=self.assignment.assigned if self.assignment is not None else None,
                    position=lambda keys: self.position(consumer, keys),
                )
                if self.fetch_watch is not None:
                    self._watch_clients(consumer)
                self.watch_delivery()
                self.producer.renew_if_quiet(self.name, self.log)
                # Serves what the producer queued for this thread (delivery
                # reports, librdkafka's statistics: cronwheel.kafka_stats),
                # which a service that produces rarely would otherwise pile up.
                self.producer.poll(0)
                if runtime.describe_requested():
                    state = json.dumps(self.describe(consumer), default=str)
                    self.log.warning("state, as asked (SIGUSR2): %s", state)
        except ClientsWedged:
            # What the stuck producer holds is not waited for: those records'
            # offsets were not committed, so they are read and produced again.
            self.producer.purge()
            raise
        finally:
            self.stopping(stop)
            shut_down(consumer, self.offsets, self._db, self.assignment, self.watch)
            self._consumer = None
            self.close()

    def _dead_letter_topic(self) -> None:
        """The dead-letter topic, made before the first dead letter needs it: a
        producer that sends to a topic the broker does not have holds the
        record for 30 s, then fails it. A broker away now: made when needed."""
        try:
            kafka.ensure_topics(
                [self.topics.dead_letter], bootstrap=self.bootstrap, principal=self.name
            )
        except Exception as exc:  # KafkaException, RuntimeError: DeadLetters makes it later
            self.log.warning("could not make %s yet: %s", self.topics.dead_letter, exc)

    def make_topic(self, name: str) -> None:
        """Create a platform topic this service writes (its role's ACLs allow it)."""
        kafka.ensure_topics([name], bootstrap=self.bootstrap, principal=self.name)
        self.log.info("created %s: it did not exist", name)

    def open(self) -> Consumer:
        """The consumer (a subclass that subscribes does it here)."""
        overrides = {}
        if self.assignment is not None:
            # It assigns by name what its topic watch names, and a grown topic
            # is announced (and found by the watch's broker scan), so nothing
            # waits on the periodic metadata refresh; librdkafka refreshes on a
            # leader error by itself. Every 2 s (kafka.consumer's default, for
            # subscribers) it asked for every tenant's topic: at 3,000 tenants
            # most of an idle dispatcher's CPU, in librdkafka's main thread.
            overrides["topic.metadata.refresh.interval.ms"] = ASSIGNED_METADATA_REFRESH_MS
            overrides["fetch.error.backoff.ms"] = NEW_TOPIC_FETCH_ERROR_BACKOFF_MS
        consumer = kafka.consumer(
            self.group_id,
            self.bootstrap,
            principal=self.name,
            on_commit=self.offsets.on_commit,
            **overrides,
        )
        if self.fetch_nudge is not None:
            self.fetch_nudge.start(consumer)
        return consumer

    def warm(self, conn: psycopg.Connection) -> None:
        """Run once on the service's connection as it starts: the statements
        its first record will need (a subclass's; none here)."""

    def _warm(self) -> None:
        try:
            self._db.call(self.warm, None, tries=1)
        except Exception as exc:  # the database away: the first record pays instead
            self.log.info("statements not warmed at the start: %s", exc)

    def describe(self, consumer: Consumer) -> dict:
        """What this service reads and holds, for a diagnosis (SIGUSR2,
        cronwheel.runtime): its consumer's state (consuming.describe) and its
        leases; a subclass adds what it holds back."""
        asker = self.asker.client if self.assignment else None
        state = consuming.describe(consumer, asker=asker)
        if self.assignment is not None:
            state["leases"] = len(self.assignment.owned)
            state["tenant_topics"] = len(self.assignment.names)
            state["assignment_pending"] = self.assignment.pending
        return state

    def turn(self, consumer: Consumer, stop: threading.Event) -> bool:
        """One pass of the loop; False if `stop` interrupted it."""
        raise NotImplementedError

    def stopping(self, stop: threading.Event) -> None:
        """On the way out, before the last commit: finish what is under way."""

    def close(self) -> None:
        """Flush the producer and close the database connection (run() does this)."""
        self.producer.flush(self.shutdown_grace_ms / 1000)
        self._db.close()
        self._ends_asked.close()

    # -- a consumer that does not read -------------------------------------------

    def held_back(self) -> set[consuming.Where]:
        """Assigned partitions this service does not read now on purpose
        (paused, or out of the assignment while they doze): not judged by
        the fetch watch. A subclass that pauses says which."""
        return set()

    def asleep(self) -> Container[consuming.Where]:
        """Assigned partitions left unfetched because nothing is due in them
        (the dispatcher's dozing ones): caught up when they went to sleep, and
        their watermarks are stale since, so no lag is reported of them."""
        return ()

    def position(self, consumer: Consumer, keys: list[consuming.Where]) -> dict:
        """Where each of `keys` was read to (the next offset), where known."""
        return consuming.positions(consumer, keys)

    def _watch_clients(self, consumer: Consumer) -> None:
        """The fetch watch, each pass (cronwheel.fetch_watch): partitions held
        and not read though the broker has records for them end the run
        (ClientsWedged), for new clients to take over."""
        assert self.fetch_watch is not None and self.assignment is not None
        assignment = self.assignment

        def watched() -> list[consuming.Where]:
            held = self.held_back()
            return [key for key in assignment.assigned if key not in held]

        watch_fetching(
            self.fetch_watch, watched, lambda keys: self.position(consumer, keys), self._ends_asked
        )

    # -- the database -----------------------------------------------------------

    def with_db(self, fn, stop: threading.Event, stopped=None):
        """`fn(conn)` on the loop's connection, waiting out a database that is
        away (the reconnect policy); `stopped` if `stop` came meanwhile."""
        return self._db.call(fn, stop, stopped)

    # -- what this instance reads -----------------------------------------------

    def _follow(self, consumer: Consumer, stop: threading.Event) -> bool:
        assert self.assignment is not None and self.watch is not None
        added = self.assignment.follow(consumer, self.watch, self._db, stop, self.give_up)
        if added is None:
            return False
        self.assigned(added)
        return True

    def end_fetch(self) -> bool:
        """End the consumer's outstanding fetch now, so that a request queued
        behind it on the same connection is answered at once; whether it
        could: a nudge (cronwheel.fetch_nudge). Where it could not, new
        topics' leaders are asked and not waited for
        (cronwheel.assignment.ask_unwaited), as a waited ask would hold the
        loop up to fetch.wait.max.ms each."""
        return self.fetch_nudge is not None and self.fetch_nudge.nudge()

    def assigned(self, partitions: list[TopicPartition]) -> None:
        """These partitions were just assigned, at these (committed) offsets."""

    def give_up(self, partitions: list[TopicPartition]) -> None:
        """Hand these over (their lease moved, or they were revoked): commit
        what this instance finished of them, then `forget` each."""
        assert self._consumer is not None
        for key in self.offsets.give_up(self._consumer, partitions):
            self.forget(key)

    def forget(self, where: consuming.Where) -> None:
        """Drop what is held of this partition: its next owner reads it again."""

    # -- records ----------------------------------------------------------------

    def take(self, consumer: Consumer, wait_ms: float | None = None, first=None) -> list[Message]:
        """Up to `batch` records: block up to `wait_ms` (default `idle_ms`)
        for one, then take what else arrives within `max_wait_ms`
        (`first`: consuming.take's)."""
        wait_ms = self.idle_ms if wait_ms is None else wait_ms
        got = consuming.take(
            consumer, self.batch, wait_ms / 1000, self.max_wait_ms / 1000, QUIET, first
        )
        return self.fetch_nudge.drop(got) if self.fetch_nudge is not None else got

    def records(self, msgs: Iterable[Message]) -> list[Message]:
        """The records among what was consumed, without nudges; error events
        handled."""
        got = consuming.records(msgs, QUIET)
        return self.fetch_nudge.drop(got) if self.fetch_nudge is not None else got
