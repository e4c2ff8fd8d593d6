"""The dispatcher: reads every tenant's run topic and forwards each RunReady, byte
for byte and under the same key, to where its target executes (the queue topic,
the webhook service's topic or the managed executor's topic).

Each batch goes through these steps, in this order, so a crash never loses a
record: consume up to `batch` records, skip those already in `processed`
(run_id:attempt) or on their way, produce the rest (higher priority classes
first); once the broker acknowledged every record of the batch, record them as
processed in one statement, then commit the offsets. A crash before the record
is written forwards again; a duplicate on a queue topic is harmless because
only one worker wins StartRun. Records that cannot be routed go to the
dead-letter topic, acknowledged before their offset is committed, so a poison
record neither crashes the service nor stalls its partition.

Batches are pipelined: up to `in_flight` of them wait for their acks while the
next is consumed and produced, and they are settled (marked, their offsets
made committable) strictly in the order they were produced, so a critical
record that arrives meanwhile waits for no herd's round trip through the
broker (docs/priority.md).

Priority under a backlog (docs/priority.md): the relay puts each class in its
own quarter of a run topic's partitions (cronwheel.store.outbox), so the
dispatcher can tell a partition's class by its number. While any assigned
partition of a class has records it has not read (the broker's high watermark,
as the last fetch brought it, is past what it consumed), every partition of a
lower class is paused: librdkafka drops what it prefetched from them, and the
next records consumed are the higher class's. They resume when the higher
classes are drained, or if a class shows records but none arrive for
`stall_ms` (a watermark that is stale must not starve the rest).

Per-tenant dispatch quotas (cronwheel.store.quotas, kind `dispatch`): records
beyond what the tenant's bucket grants are held in memory, their partitions
paused, and dispatched first once it refills; offsets are not committed past
them, so a crash reads them again.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from cronwheel import kafka, metrics
from cronwheel.config import Processed as ProcessedSettings
from cronwheel.config import ProducerRenewal
from cronwheel.consumer import RECORD_HEADER, ConsumerService, Poison, expect_owned, produce
from cronwheel.consuming import FIRST_OFFSET
from cronwheel.core.clock import now_ms
from cronwheel.core.runs import NORMAL_RANK, PRIORITY_RANK, priority_rank
from cronwheel.dozing import NUDGE, Dozing, wake_in_ms
from cronwheel.fetch_watch import DeliveryWatch, FetchWatch
from cronwheel.kafka import Placement, Topics, class_of_partition
from cronwheel.logs import run_fields
from cronwheel.store.dispatch import Processed, Pruner, message_key, run_of
from cronwheel.store.quotas import Buckets
from cronwheel.topic_watch import announce
from cronwheel.topics_met import topics_met
from services.dispatcher.settings import DispatcherSettings

log = logging.getLogger("cronwheel.dispatcher")

CONSUMER = "dispatcher"
_DEAD_LETTER_RANK = len(PRIORITY_RANK)
# Destinations laid out by class (kafka.partition_for), as run topics are: the
# topics of the platform's own workers, which admit by class and find a
# record's class by its partition. Queue topics keep the producer's partitioner
# (their consumers are the tenants' workers).
CLASS_LAID_OUT = frozenset({"webhook", "managed"})


def route(topics: Topics, m: Message) -> tuple[str, dict]:
    """(destination topic, decoded RunReady) for a record read from a run topic.

    Raises Poison for anything else: undecodable bytes, another record type, a
    tenant that does not own the topic it came from, an unknown target type.
    """
    # Never let one tenant's topic deliver into another tenant's queue.
    datum = expect_owned(m, "RunReady", topics.runs)
    return destination(topics, datum["tenant_id"], datum["target_type"], datum["queue"]), datum


def destination(topics: Topics, tenant: str, target_type: str, queue: str | None) -> str:
    """The topic where a run of this target executes; Poison if there is none."""
    try:
        return topics.destination(tenant, target_type, queue)
    except kafka.UnknownTarget as e:
        raise Poison("unknown_target", str(e)) from None
    except ValueError:
        if target_type != "queue":
            raise
        raise Poison("bad_queue", f"queue target with queue {queue!r}") from None


class Pause(enum.Enum):
    """Why a run-topic partition is paused; it resumes when no reason is left."""

    CLASS = "a class above it has records waiting"
    HELD = "records held for the tenant's quota"
    DOZE = "idle: it dozes until a wake (cronwheel/dozing.py)"


@dataclass
class _Out:
    """One record to produce: a forward (`done_key` set) or a dead letter (`poison`)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    rank: int
    done_key: str | None = None
    poison: Poison | None = None
    by_class: bool = False  # placed in its class's partitions (CLASS_LAID_OUT)


@dataclass
class _Batch:
    """A batch produced and not yet settled: settled once every record is
    acknowledged (`unacked` 0) and none failed, records that failed produced
    again after `backoff`."""

    msgs: list[Message]
    outs: list[_Out]
    unacked: int = 0
    failed: list[_Out] = field(default_factory=list)
    retry_at: float = 0.0
    backoff: float = 0.1

    @cached_property
    def keys(self) -> list[str]:
        """The forwards' done keys (not the dead letters'): marked when settled."""
        return [o.done_key for o in self.outs if o.done_key]


class Dispatcher(ConsumerService):
    name = CONSUMER

    def __init__(
        self,
        *args,  # ConsumerService's: dsn, bootstrap, topics
        batch: int = DispatcherSettings.batch,
        in_flight: int = DispatcherSettings.in_flight,
        max_wait_ms: int = DispatcherSettings.max_wait_ms,
        class_pausing: bool = True,
        stall_ms: int = 1_000,
        quotas: Buckets | None = None,
        processed_retention_ms: int = ProcessedSettings.retention_ms,
        topic_scan_s: float = 30.0,
        lease_ttl_ms: int = 10_000,
        doze_after_ms: int = DispatcherSettings.doze_after_ms,
        doze_sweep_ms: int = DispatcherSettings.doze_sweep_ms,
        wake_holds_ms: int = DispatcherSettings.wake_holds_ms,
        resume_ahead_ms: int = DispatcherSettings.resume_ahead_ms,
        fetch_watch_s: float = DispatcherSettings.fetch_watch_s,
        renewal: ProducerRenewal | None = None,  # the settings' defaults
        **skeleton,  # ConsumerService's: group_id, idle_ms, lag_every_ms, ...
    ):
        # Through several producers (cronwheel.producer_shards): librdkafka
        # puts one partition in each request, so a minute's herd of tenants
        # went out through one connection one request at a time.
        # The busiest queue topics through one more producer of their own.
        shards = renewal or ProducerRenewal()
        super().__init__(
            *args,
            batch=batch,
            max_wait_ms=max_wait_ms,
            producer_shards=shards.shards,
            producer_hot_topics=shards.hot_topics,
            producer_hot_rate=shards.hot_rate,
            **skeleton,
        )
        self.in_flight = max(1, in_flight)
        self.processed = Processed(CONSUMER)
        self.pruner = Pruner(self.processed, processed_retention_ms)
        self._placement = Placement(self.producer)
        self.forwarded_total = 0
        self.duplicates_total = 0
        self.unplaced_acks_total = 0  # acknowledged without an offset (_produce)
        self._batches: deque[_Batch] = deque()  # produced, not yet settled, oldest first
        self._on_way: set[str] = set()  # their done keys (not yet in `processed`)
        self._known_topics: set[str] = set()  # destinations known to exist
        # Priority: where each partition was
        # consumed to (next offset; committed offsets until the first record),
        # what is paused for a higher class, and since when a class waits.
        self.class_pausing = class_pausing
        self.stall_ms = stall_ms
        self._classes: dict[tuple[str, int], int | None] = {}  # _class_of's answers
        self._next: dict[tuple[str, int], int] = {}
        # Those whose `_next` is still the committed offset they were assigned
        # at, nothing read since: retention may have moved the log's start
        # past it, and librdkafka then reads from the start (_consumed_to).
        self._at_commit: set[tuple[str, int]] = set()
        self._class_paused: set[tuple[str, int]] = set()
        self._waiting_since: dict[int, float] = {}
        self._progress: dict[int, float] = {}
        self._top: int | None = None  # the class the last pass paused the lower ones for
        self._by_rank: dict[int, list[tuple[str, int]]] | None = None  # assigned, by class
        self._by_rank_version = -1  # the assignment's version it was made at
        # Idle partitions out of the fetches until a wake (cronwheel.dozing).
        self.dozing = (
            Dozing(
                self.topics.wake,
                after_ms=doze_after_ms,
                sweep_ms=doze_sweep_ms,
                wake_holds_ms=wake_holds_ms,
                resume_ahead_ms=resume_ahead_ms or None,
            )
            if doze_after_ms
            else None
        )
        # Where each dozing one was consumed to: the sweep wakes it once the
        # broker's end is past that.
        self._dozed_at: dict[tuple[str, int], int] = {}
        # The broker asked about dozing partitions, on the dozing's own thread
        # (cronwheel.dozing), through a client of its own: made anew when it
        # gets no answer (one left stuck after a broker restart), and never
        # one whose calls the loop's fetch watch would wait behind.
        self._doze_asker = kafka.RenewingAsker(
            self.bootstrap, principal=self.name, group=f"{self.group_id}.ask"
        )
        # Dispatch quotas: records held per partition (paused) until `_held_until`.
        self.quotas = quotas or Buckets("dispatch")
        self._held: dict[tuple[str, int], list[Message]] = {}
        self._held_until: dict[tuple[str, int], int] = {}
        self._admin = kafka.admin(self.bootstrap, principal=self.name)
        # The run topics, by name: one per tenant, created when the tenant is;
        # read are those of the tenants whose partitions this instance leases.
        self.lease_tenant_topics(
            "runs",
            ttl_ms=lease_ttl_ms,
            nudge=False,  # it ends its fetches with the wake topic (end_fetch)
            placement=self._placement,
            tenant_topic=self.topics.runs,
            ensure=lambda names: kafka.ensure_topics(
                names, partitions=kafka.RUN_PARTITIONS, client=self._admin
            ),
            on_destinations=self._new_destinations,
            # A new tenant's topic made: the loop's wait for records ends (a
            # nudge on the wake topic, which only a dozing dispatcher reads).
            on_change=functools.partial(self._nudge, on_loop=False),
            scan_every_s=topic_scan_s,
        )
        # A consumer librdkafka stopped fetching for, or a producer it stopped
        # delivering for, ends the run for new clients (cronwheel.fetch_watch,
        # main.py's run_restarting).
        self.fetch_watch = FetchWatch(fetch_watch_s) if fetch_watch_s else None
        self.delivery_watch = DeliveryWatch(fetch_watch_s) if fetch_watch_s else None
        # Its producer meets every tenant's queue topics: made anew when most
        # went quiet (cronwheel.topics_met).
        self.producer.topics_met = topics_met(renewal)

    # -- the loop -------------------------------------------------------------

    def turn(self, consumer: Consumer, stop: threading.Event) -> bool:
        # Pruned before reading: the first pass comes at the start, before this
        # instance has recorded anything, so what it records in its first turn
        # is kept a whole retention even when that turn's sends outlast it
        # (replay_retention's check of what a replay forwarded again); the
        # later passes on the pruner's thread, never holding this loop.
        self.pruner.start_once(self.dsn, stop, self.log)
        read = self._released(consumer) + self._consume(consumer)
        msgs = self._within_quota(consumer, read, stop) if read else read
        if msgs and not self._send(msgs, stop):
            return False  # stopping mid-batch: uncommitted, so consumed again later
        if not self._settle(stop, until=self.in_flight - 1):
            return False
        if read or self._class_paused or self._waiting_since:
            # Idle (nothing read, nothing held back for a class): no class can
            # be waiting behind another.
            self._prioritise(consumer)
        if self.dozing is not None:
            self._doze(consumer)
        return True

    def held_back(self) -> set[tuple[str, int]]:
        """Paused for a class or a quota, or dozing: not read on purpose."""
        return self._class_paused | set(self._held) | self.asleep()

    def asleep(self) -> set[tuple[str, int]]:
        return self.dozing.dozing if self.dozing is not None else set()

    def position(self, consumer: Consumer, keys: list[tuple[str, int]]) -> dict:
        """Where each was consumed to, or assigned at (`_next`) before its
        first record (_consumed_to)."""
        at = {key: self._consumed_to(consumer, key) for key in keys}
        return {key: offset for key, offset in at.items() if offset is not None}

    def _consumed_to(
        self, consumer: Consumer, key: tuple[str, int], low: int | None = None
    ) -> int | None:
        """`_next[key]`, None where unknown. One assigned at its committed
        offset and not read since stands at the log's start if that is
        further on: retention moved it past the commit (the dispatcher was
        away longer than the topic keeps records), librdkafka's fetch there
        was out of range and reset to the start. Kept at the commit, the
        partition never looked caught up, so it never dozed, and the fetch
        watch saw it stand still behind the broker's end and replaced the
        clients again and again while no record came. `low`: the cached
        low watermark, where the caller has it; else it is looked up (only
        for such a partition: each lookup walks every topic the client knows)."""
        at = self._next.get(key)
        if at is None or key not in self._at_commit:
            return at
        if low is None:
            low, _high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
        if low is not None and low > at:
            self._next[key] = at = low
        return at

    def _reached(self, consumer: Consumer, key: tuple[str, int], low: int | None) -> int:
        """Where it was consumed to; where that is unknown (nothing committed,
        nothing read), its log's start, the cached low watermark `low`."""
        at = self._consumed_to(consumer, key, low)
        return at if at is not None else max(low or 0, 0)

    def describe(self, consumer: Consumer) -> dict:
        """ConsumerService's, and what this dispatcher holds back: batches on
        their way (produced, not all acknowledged), partitions paused for a
        class or held for a quota, dozing ones and where each resumes."""
        state = super().describe(consumer)
        state["batches_on_their_way"] = [
            {"records": len(b.outs), "unacked": b.unacked, "failed": len(b.failed)}
            for b in self._batches
        ]
        state["class_paused"] = len(self._class_paused)
        state["held"] = {f"{t}[{p}]": len(ms) for (t, p), ms in self._held.items()}
        if self.dozing is not None:
            dozing = sorted(self.dozing.dozing)
            state["dozing"] = len(dozing)
            state["dozing_waiting_to_resume"] = self.dozing.waiting_to_resume
            state["dozing_resume_at"] = {
                f"{t}[{p}]": self._dozed_at.get((t, p)) for t, p in dozing[:50]
            }
        return state

    def stopping(self, stop: threading.Event) -> None:
        if self._batches and stop.is_set():
            self._settle(stop, until=0)  # within the shutdown grace

    def close(self) -> None:
        if self.dozing is not None:
            self.dozing.close()
        self.pruner.stop()
        super().close()

    def _consume(self, consumer: Consumer) -> list[Message]:
        """Block until one record arrives, then take what else comes within
        `max_wait_ms`: batches under load, little added latency when quiet."""
        wait_ms = self.idle_ms
        if self._batches:  # come back soon to settle them
            wait_ms = self.max_wait_ms
        if self._held_until:
            wait_ms = max(1, min(wait_ms, min(self._held_until.values()) - now_ms()))
        if self.dozing is not None and (resume_s := self.dozing.next_due_s()) is not None:
            wait_ms = max(1, min(wait_ms, round(resume_s * 1000)))
        if self.dozing is None:
            good = self.take(consumer, wait_ms)
        else:
            # A wake is acted on as soon as it is read, not after the wait for
            # more: the partition it resumes must be in the next fetch request
            # (cronwheel.dozing), and the second wake may be in this batch.
            wakes = lambda ms: self._wakes(consumer, ms)  # noqa: E731
            good = wakes(self.take(consumer, wait_ms, first=wakes))
        for m in good:
            self._next[(m.topic(), m.partition())] = m.offset() + 1
            if self._at_commit:
                self._at_commit.discard((m.topic(), m.partition()))
            rank = self._class_of(m.topic(), m.partition())
            if rank is not None:
                self._progress[rank] = time.monotonic()
        return good

    # -- one batch ------------------------------------------------------------

    def dispatch(self, msgs: list[Message], stop: threading.Event) -> bool:
        """Forward and dead-letter one batch and record it, waiting for that;
        True when done (the offsets may be committed), False if `stop`
        interrupted it first. The loop does the same pipelined (_send, _settle)."""
        return self._send(msgs, stop) and self._settle(stop, until=0)

    def _send(self, msgs: list[Message], stop: threading.Event) -> bool:
        """Route a batch and produce what is not already forwarded or on its way;
        False if `stop` came while the database was away."""
        outs: list[_Out] = []
        for m in msgs:
            try:
                dest, datum = route(self.topics, m)
            except Poison as p:
                outs.append(self._dead_letter(m, p))
                continue
            key = m.key() if m.key() is not None else datum["run_id"].encode()
            rank = priority_rank(datum["priority"])
            outs.append(
                _Out(
                    dest,
                    key,
                    m.value(),
                    _headers(m, "RunReady"),
                    rank,
                    done_key=message_key(datum["run_id"], datum["attempt"], datum["created_at"]),
                    by_class=datum["target_type"] in CLASS_LAID_OUT,
                )
            )
        keys = [o.done_key for o in outs if o.done_key and o.done_key not in self._on_way]
        seen = self.with_db(lambda c: self.processed.seen(c, keys), stop)
        if seen is None:
            return False
        seen |= self._on_way
        todo: list[_Out] = []
        for o in outs:
            if o.done_key is not None:
                if o.done_key in seen:
                    self.duplicates_total += 1
                    continue
                seen.add(o.done_key)  # a duplicate inside the batch goes once
            todo.append(o)
        todo.sort(key=lambda o: o.rank)  # stable: equal classes keep their order
        self._ensure_topics({o.topic for o in todo})
        batch = _Batch(msgs, todo)
        self._on_way.update(batch.keys)
        self._batches.append(batch)
        for o in todo:
            self._produce(batch, o)
        self.producer.poll(0)
        return True

    def _settle(self, stop: threading.Event, *, until: int | None = None) -> bool:
        """Record the batches whose records are all acknowledged, oldest first,
        and make their offsets committable; with `until`, wait until no more
        than that many are left (on stop, `shutdown_grace_ms` more, then what
        is left is purged and comes again). False if `stop` cut it short."""
        give_up: float | None = None
        while True:
            self.producer.poll(0)
            ready: list[_Batch] = []
            for b in self._batches:
                if b.unacked or b.failed:
                    break
                ready.append(b)
            if ready and not self._record(ready, stop):
                return False
            head = self._batches[0] if self._batches else None
            if head is not None and head.failed and not head.unacked:
                self._retry(head)
            if until is None or len(self._batches) <= until:
                return True
            if stop.is_set():
                give_up = give_up or time.monotonic() + self.shutdown_grace_ms / 1000
                if time.monotonic() >= give_up:
                    self.producer.purge()
                    self.producer.flush(0)
                    self._forget_unsettled()
                    return False
            self.producer.flush(0.05)
            self.watch_delivery()  # a stuck producer ends the wait (ClientsWedged)

    def _retry(self, batch: _Batch) -> None:
        """Records the broker refused go again after a pause (doubling to 5 s)."""
        now = time.monotonic()
        if not batch.retry_at:
            batch.retry_at = now + batch.backoff
        elif now >= batch.retry_at:
            log.warning("%d records not acknowledged; retrying", len(batch.failed))
            again, batch.failed = batch.failed, []
            for o in again:
                self._produce(batch, o)
            batch.retry_at = 0.0
            batch.backoff = min(batch.backoff * 2, 5.0)

    def _record(self, ready: list[_Batch], stop: threading.Event) -> bool:
        """Mark settled batches processed in one statement; their offsets done."""
        forwarded = [k for b in ready for k in b.keys]
        if self.with_db(lambda c: self.processed.mark(c, forwarded), stop) is None:
            return False
        for b in ready:
            self._batches.popleft()
            self._on_way.difference_update(b.keys)
            for m in b.msgs:
                self.offsets.finished(m)
            self.forwarded_total += len(b.keys)
            for o in b.outs:
                if o.poison is not None:
                    self.dead_letters.count(o.poison)
        return True

    def _forget_unsettled(self) -> None:
        """Stopping with batches unsettled: their offsets are not committed, so
        their records are consumed again (and skipped where already forwarded)."""
        self._batches.clear()
        self._on_way.clear()

    def _ensure_topics(self, names: set[str]) -> None:
        """Create destination topics on first use (a destination no job
        announced, such as a workflow node's queue), so routing does not depend
        on the broker auto-creating topics."""
        created = self._create_destinations(names)
        if created:
            # The webhook service and the executor subscribe to their topics by name.
            self.with_db(lambda c: announce(c, sorted(created)), self._stop)

    def _new_destinations(self, destinations: list[tuple[str, str, str]]) -> None:
        """Jobs were created or retargeted (or the watch started listening):
        their destination topics exist before their first runs come (created
        now, not in a run's path). Runs on the watch's thread, so it touches
        neither the loop's database connection nor its consumer."""
        names = set()
        for tenant, target_type, queue in destinations:
            try:
                names.add(destination(self.topics, tenant, target_type, queue))
            except (Poison, ValueError):
                continue  # not a target this dispatcher routes; its runs say so when they come
        created = self._create_destinations(names)
        if created:
            self.watch.announce(sorted(created))
        self._learn_destinations(names)

    def _learn_destinations(self, names: set[str]) -> None:
        """The producer asks for each destination's metadata now, on the
        watch's thread: a run's first forward to a topic the producer has not
        met asked for it in the loop (Placement.partitions, a round trip to
        the broker before the produce), and an unplaced record waits for
        librdkafka's own ask. Many at once (every job's, when the watch starts
        listening) are one cluster-wide request. The first that is not
        answered (a broker away, a topic it does not know yet) stops the
        asks, so a broker away holds the watch's thread one ask's timeout,
        not one per job; the rest are asked at their first forward, as
        before. (Asking the producer's metadata from this thread does not
        wait for the loop's produce or poll: confluent-kafka serialises only
        calls such as list_topics across threads.)"""
        missing = sorted(n for n in names if self._placement.known(n) is None)
        if len(missing) >= kafka.BULK_TOPICS:
            self._placement.learn(missing)
            return
        for name in missing:
            if self._placement.partitions(name) is None:
                return

    def _create_destinations(self, names: set[str]) -> set[str]:
        """Those of `names` not known to exist, created with their kind's
        partition count (Topics.partitions); empty if none was new or the
        broker refused (produce retries until the topic exists)."""
        missing = names - self._known_topics
        if len(missing) > 1:
            # Many at once (every job's, when the watch starts listening): one
            # metadata request leaves out those that exist rather than asking
            # the controller to create thousands of topics it has.
            try:
                existing = missing & set(self._admin.list_topics(timeout=10).topics)
            except Exception as exc:
                log.warning("could not list topics: %s", exc)
                existing = set()
            self._known_topics |= existing
            missing -= existing
        if not missing:
            return set()
        try:
            kafka.ensure_sized(missing, self.topics, self._admin)
        except Exception as exc:
            log.warning("could not create topics %s: %s", sorted(missing), exc)
            return set()
        self._known_topics |= missing
        return missing

    def _dead_letter(self, m: Message, p: Poison) -> _Out:
        r = self.dead_letters.record(m, p)
        return _Out(r["topic"], r["key"], r["value"], r["headers"], _DEAD_LETTER_RANK, poison=p)

    def _produce(self, batch: _Batch, o: _Out) -> None:
        def on_delivery(err, msg, o=o):
            batch.unacked -= 1
            self.delivery_reports += 1
            if err is None and msg.offset() >= 0:
                return
            if err is None:
                # librdkafka's "delivered" for a retry the broker called a
                # duplicate (DUPLICATE_SEQUENCE_NUMBER): written by an earlier
                # send, it says, at an offset it does not know. Counted and
                # named, so that a forward the queue lacks can be traced here.
                self.unplaced_acks_total += 1
                metrics.UNPLACED_ACKS.inc()
                what = "acknowledged without an offset"
            else:
                batch.failed.append(o)
                what = f"failed: {err}"
            run_id, attempt = run_of(o.done_key or "") or (None, None)  # a forward's run
            log.warning(
                "delivery to %s %s", o.topic, what, extra=run_fields(run_id=run_id, attempt=attempt)
            )

        batch.unacked += 1
        # After _ensure_topics: the topic exists, its partition count is known.
        placement = self._placement(o.topic, o.rank, o.key) if o.by_class else {}
        produce(
            self.producer,
            topic=o.topic,
            value=o.value,
            key=o.key,
            headers=o.headers,
            on_delivery=on_delivery,
            **placement,
        )

    # -- what this instance reads ---------------------------------------------

    def open(self) -> Consumer:
        consumer = super().open()
        if self.dozing is not None:
            try:
                kafka.ensure_topics([self.topics.wake], partitions=1, client=self._admin)
                self.dozing.start(consumer)
            except Exception as exc:  # no wake can come: every partition stays fetched
                log.warning("no dozing: the wake topic is unavailable (%s)", exc)
                self.dozing = None
        return consumer

    def _nudge(self, *, on_loop: bool = True) -> bool:
        """A record on the wake topic, which every fetch of a dozing
        dispatcher names: it ends the fetch outstanding now, which does not
        name what was just resumed or assigned (cronwheel.dozing), so the
        next one does at once rather than after up to fetch.wait.max.ms
        (500 ms). Whether it was written; without dozing (off, or turned off
        at open() without a wake topic) no fetch names the topic, and none is.
        Off the loop (`on_loop=False`: the topic watch's `on_change`, on its
        thread) the producer's callbacks are not served (the batches'
        acknowledgements are the loop's) and a full local queue skips it
        (the loop then sees the change after its wait); one made while the
        loop renews its producer may go to the old one and be lost with it,
        at the same cost."""
        if self.dozing is None:
            return False
        try:
            if on_loop:
                produce(self.producer, topic=self.topics.wake, key=NUDGE, value=b"")
                self.producer.poll(0)
            else:
                self.producer.produce(topic=self.topics.wake, key=NUDGE, value=b"")
            return True
        except (BufferError, KafkaException) as exc:  # the fetch ends at fetch.wait.max.ms
            log.warning("could not nudge the wake topic: %s", exc)
            return False

    def end_fetch(self) -> bool:
        """A new tenant's first run may be due now. The consumer's ask for
        its partition's leader (learn_leaders) goes on the connection of the
        fetch outstanding, and the broker answers a connection's requests in
        order, so it waited for that fetch to end (up to fetch.wait.max.ms):
        the nudge ends it. The fetch sent next does not name the partition
        either: the assignment ends it again, once assigned."""
        return self._nudge()

    def assigned(self, partitions: list[TopicPartition]) -> None:
        if self.dozing is not None:
            self.dozing.assigned((tp.topic, tp.partition) for tp in partitions)
        for topic in {tp.topic for tp in partitions}:
            # New, or grown from one lane to a partition per class: the
            # classes of its partitions are read again (_class_of).
            for p in range(self._placement.known(topic) or 0):
                self._classes.pop((topic, p), None)
        for tp in partitions:
            # Where the group left off, so a class's waiting records are seen
            # before the first one is read (_prioritise). None committed
            # (FIRST_OFFSET): unknown until the first record, as librdkafka's
            # own position is; a log whose start retention moved past 0 has
            # no record there, and the fetch watch would judge it stuck.
            key = (tp.topic, tp.partition)
            if tp.offset > FIRST_OFFSET and key not in self._next:
                self._next[key] = tp.offset
                self._at_commit.add(key)

    def give_up(self, partitions: list[TopicPartition]) -> None:
        """Hand over cleanly (a lease moved): settle what is on its way first,
        so that what this instance forwarded is committed."""
        if self._batches:
            self._settle(self._stop, until=0)
        # A dozing one is paused; it leaves paused, and is resumed if it is
        # assigned here again (cronwheel.assignment).
        super().give_up(partitions)

    def forget(self, where: tuple[str, int]) -> None:
        if self.dozing is not None:
            self.dozing.forget(where)
        self._next.pop(where, None)
        self._at_commit.discard(where)
        self._dozed_at.pop(where, None)
        self._class_paused.discard(where)
        self._held.pop(where, None)  # its new owner reads them again
        self._held_until.pop(where, None)

    # -- priority classes -----------------------------------------------------

    def _class_of(self, topic: str, partition: int) -> int | None:
        """Cached: asked for every assigned partition on every pass of the loop."""
        key = (topic, partition)
        try:
            return self._classes[key]
        except KeyError:
            pass
        n = self._placement.known(topic)
        if n is None:
            return None  # not asked yet: the count comes with the next assignment
        rank = self._classes[key] = class_of_partition(partition, n)
        return rank

    def _prioritise(self, consumer: Consumer) -> None:
        """Pause every partition of a class lower than the highest class with
        records waiting; resume them when it has none (or stalls).

        Only what can change the answer is looked at. The lowest class
        present is never the top of anything. A class is examined only while
        a lower class has records waiting (else pausing below it would hold
        nothing back), and of the two questions (does this class wait, does
        anything below it wait) the cheaper is asked first. So a dispatcher
        with thousands of one-lane tenants (all normal) and a few laid out by
        class looks at the few critical, high and low partitions on a pass,
        and at the normal ones only while a low one has records waiting."""
        if not self.class_pausing:
            return
        by_rank = self._partitions_by_rank(consumer)
        ranks = sorted(by_rank)  # critical (0) first
        examined: dict[int, bool] = {}

        def waits(rank: int) -> bool:
            if rank not in examined:
                examined[rank] = self._has_waiting(consumer, by_rank[rank])
            return examined[rank]

        def below_waits(rank: int) -> bool:
            # What the last pass paused for a class at or below this one waits
            # still: paused partitions are not fetched, their watermarks stale.
            if self._top is not None and rank <= self._top:
                return True
            return any(waits(r) for r in reversed(ranks) if r > rank)  # the lowest first

        now = time.monotonic()
        top = None
        for i, rank in enumerate(ranks[:-1]):
            below = sum(len(by_rank[r]) for r in ranks[i + 1 :])
            if len(by_rank[rank]) <= below:
                contended = waits(rank) and below_waits(rank)
            else:
                contended = below_waits(rank) and waits(rank)
            if not contended:
                continue
            since = max(self._waiting_since.setdefault(rank, now), self._progress.get(rank, 0))
            if now - since < self.stall_ms / 1000:
                top = rank
                break
        for rank in list(self._waiting_since):
            if not examined.get(rank):
                del self._waiting_since[rank]
        want = set() if top is None else {k for r in ranks if r > top for k in by_rank[r]}
        pause = want - self._class_paused
        resume = self._class_paused - want
        if pause:
            # One dozing is paused already, and stays so when it wakes (_resume_dozed).
            awake = [TopicPartition(t, p) for t, p in pause if not self._dozes((t, p))]
            if awake:
                consumer.pause(awake)
            metrics.CLASS_PAUSES.inc()
        if resume:
            back = [
                TopicPartition(t, p) for t, p in resume if not self._paused_else(t, p, Pause.CLASS)
            ]
            if back:
                consumer.resume(back)
        self._class_paused = want
        self._top = top
        metrics.CLASS_PAUSED.set(len(want))

    def _partitions_by_rank(self, consumer: Consumer) -> dict[int, list[tuple[str, int]]]:
        """The assigned partitions by class, made again only when the
        assignment changed or a class was unknown (a count not asked yet)."""
        version = self.assignment.version
        if self._by_rank is None or self._by_rank_version != version:
            by_rank: dict[int, list[tuple[str, int]]] = {}
            complete = True
            for key in self.assignment.assigned:
                rank = self._class_of(*key)
                if rank is None:
                    complete = False
                    continue
                by_rank.setdefault(rank, []).append(key)
            self._by_rank = by_rank
            self._by_rank_version = version if complete else -1
        return self._by_rank

    def _has_waiting(self, consumer: Consumer, keys: list[tuple[str, int]]) -> bool:
        """Whether one of these partitions has records past what was consumed,
        by the watermarks the last fetches brought (paused or held ones are
        not fetched: their watermarks are stale)."""
        for key in keys:
            if key in self._class_paused or key in self._held or self._dozes(key):
                continue
            low, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            if high is None or high < 0:
                continue
            if high > self._reached(consumer, key, low):
                return True
        return False

    # -- dozing (cronwheel.dozing) ------------------------------------------

    def _dozes(self, key: tuple[str, int]) -> bool:
        return self.dozing is not None and key in self.dozing.dozing

    def _paused_else(self, topic: str, partition: int, reason: Pause) -> bool:
        """Whether the partition stays paused for a reason other than `reason`:
        a partition resumes only when none is left."""
        key = (topic, partition)
        return (
            (reason is not Pause.CLASS and key in self._class_paused)
            or (reason is not Pause.HELD and key in self._held)
            or (reason is not Pause.DOZE and self._dozes(key))
        )

    def _wakes(self, consumer: Consumer, msgs: list[Message]) -> list[Message]:
        """The records without the wakes among them; the partitions those
        wake are resumed (unless paused for another reason too)."""
        assert self.dozing is not None
        records, back = [], []
        for m in msgs:
            if self.dozing.is_wake(m.topic()):
                topic = (m.key() or b"").decode(errors="replace")
                # Since the relay sent it, by its clock: with a clock behind
                # the relay's, this is 0 and the wake's own delay counts.
                kind, sent_ms = m.timestamp()
                waited = now_ms() - sent_ms if kind == TIMESTAMP_CREATE_TIME else 0
                back.extend(self.dozing.woken(topic, wake_in_ms(m.value(), waited)))
            else:
                self.dozing.read((m.topic(), m.partition()))
                records.append(m)
        self._resume_dozed(consumer, back)
        return records

    def _doze(self, consumer: Consumer) -> None:
        """Pause what has been quiet long enough; resume what the sweep found
        records in although no wake came."""
        assert self.dozing is not None
        soon = self.dozing.due()  # woken earlier for rows that come now
        if soon:
            self._resume_dozed(consumer, soon)

        def caught_up(key: tuple[str, int]) -> bool:
            low, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            if high is None or high < 0:
                return False  # not fetched yet: nothing known
            return high <= self._reached(consumer, key, low)

        def busy(key: tuple[str, int]) -> bool:
            return key in self._class_paused or key in self._held

        def position(key: tuple[str, int]) -> int | None:
            # Where it was consumed to; else its start, as `caught_up` reads it.
            if (at := self._consumed_to(consumer, key)) is not None:
                return at
            low, _high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            return low

        quiet = self.dozing.to_doze(caught_up, busy, self._doze_asker.end_offsets, position)
        if quiet:
            self._fall_asleep(consumer, quiet)
        moved = self.dozing.sweep(self._doze_asker.end_offsets, self._dozed_at.get)
        if moved:
            log.info("%d dozing partitions had records no wake announced", len(moved))
            metrics.MISSED_WAKES.inc(len(moved))
            self._resume_dozed(consumer, moved)
        if quiet or moved:
            metrics.DOZING.set(len(self.dozing.dozing))

    def _fall_asleep(self, consumer: Consumer, keys: list[tuple[str, int]]) -> None:
        """Paused (cronwheel.dozing: not unassigned, whose undoing wakes
        librdkafka's fetcher once per partition), its finished offsets
        committed first, and where it was consumed to kept for the sweep,
        which wakes it once the broker's end is past that. librdkafka resumes
        it from its consumed position. Neither read nor given an offset since
        it was assigned (`_next` holds the committed offset it was assigned
        at) means none was committed (assigned at offset 0,
        consuming.starting_points): the log's start is where it stands."""
        tps = [TopicPartition(t, p) for t, p in keys]
        self.offsets.give_up(consumer, tps)
        # librdkafka is asked only where this instance does not know (each
        # partition asked is a lookup by name, a walk over every topic).
        at = {key: self._next[key] for key in keys if key in self._next}
        unknown = [tp for tp in tps if (tp.topic, tp.partition) not in at]
        for tp in consumer.position(unknown) if unknown else ():
            at[(tp.topic, tp.partition)] = tp.offset
        for key, offset in at.items():
            if offset is None or offset < 0:
                # Nothing read: it stands at its log's start, as `caught_up`
                # found it (the fetch brought it); 0 would be wrong where
                # retention moved that start, and every sweep would wake it.
                low, _high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                offset = low if low is not None and low >= 0 else OFFSET_BEGINNING
            self._dozed_at[key] = offset
        consumer.pause(tps)

    def _resume_dozed(self, consumer: Consumer, keys: list[tuple[str, int]]) -> None:
        """Resumed, but for those a class above them or their quota still
        holds paused; then a nudge, for the fetch to name them at once."""
        for key in keys:
            self._dozed_at.pop(key, None)
        back = [TopicPartition(t, p) for t, p in keys if not self._paused_else(t, p, Pause.DOZE)]
        if back:
            consumer.resume(back)
            self._nudge()
        if keys:
            metrics.DOZING.set(len(self.dozing.dozing))

    # -- dispatch quotas ------------------------------------------------------

    def _tenant_of(self, topic: str) -> str | None:
        head = f"{self.topics.prefix}.runs."
        return topic[len(head) :] if topic.startswith(head) else None

    def _within_quota(
        self, consumer: Consumer, msgs: list[Message], stop: threading.Event
    ) -> list[Message]:
        """The records the tenants' dispatch buckets allow now; the rest of each
        partition from its first refused record is held and the partition paused."""
        now = now_ms()
        limited = self.with_db(lambda c: self.quotas.limited(c, now), stop)
        if not limited:
            return msgs
        wants: dict[str, int] = {}
        for m in msgs:
            tenant = self._tenant_of(m.topic())
            if tenant in limited:
                wants[tenant] = wants.get(tenant, 0) + 1
        if not wants:
            return msgs
        grants = self.with_db(lambda c: self.quotas.take(c, wants, now), stop)
        if grants is None:
            return msgs  # stopping: dispatch() will give up too
        left = {t: g.granted for t, g in grants.items()}
        holding: set[tuple[str, int]] = set()
        held: set[int] = set()

        def order(m: Message):
            rank = self._class_of(m.topic(), m.partition())
            return (NORMAL_RANK if rank is None else rank, m.topic(), m.partition(), m.offset())

        for m in sorted(msgs, key=order):
            tenant = self._tenant_of(m.topic())
            if tenant not in left:
                continue
            key = (m.topic(), m.partition())
            if key in holding or left[tenant] <= 0:
                holding.add(key)
                held.add(id(m))
            else:
                left[tenant] -= 1
        if not held:
            return msgs
        for m in msgs:
            if id(m) in held:
                key = (m.topic(), m.partition())
                self._held.setdefault(key, []).append(m)
                grant = grants[self._tenant_of(m.topic())]
                self._held_until[key] = grant.resume_ms or now + 100
        consumer.pause([TopicPartition(t, p) for t, p in holding])
        metrics.QUOTA_THROTTLED.labels("dispatch").inc(sum(1 for g in grants.values() if g.held))
        metrics.QUOTA_HELD.labels("dispatch").set(sum(len(v) for v in self._held.values()))
        return [m for m in msgs if id(m) not in held]

    def _released(self, consumer: Consumer) -> list[Message]:
        """Held records whose bucket has refilled, their partitions resumed."""
        if not self._held_until:
            return []
        now = now_ms()
        due = [k for k, until in self._held_until.items() if until <= now]
        out: list[Message] = []
        for key in due:
            del self._held_until[key]
            out.extend(self._held.pop(key, []))
            if not self._paused_else(*key, Pause.HELD):
                consumer.resume([TopicPartition(*key)])
        if due:
            metrics.QUOTA_HELD.labels("dispatch").set(sum(len(v) for v in self._held.values()))
        return out


def _headers(m: Message, record: str) -> list[tuple[str, bytes]]:
    """The source headers, with the record name set."""
    kept = [(k, v) for k, v in (m.headers() or []) if k != RECORD_HEADER]
    return [*kept, (RECORD_HEADER, record.encode())]
