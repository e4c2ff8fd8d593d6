"""The outbox relay: publishes outbox rows of its leased partitions to Kafka and
deletes them only after the broker acknowledged them.

Order (docs/priority.md): each pass reads by priority class, then an equal
share per lane (a tenant's run topic) round-robin, oldest first within a lane,
and publishes in that order, so a tenant's flood delays neither critical runs
nor another tenant's. Each RunReady goes to its class's partitions of the run
topic (kafka.partition_for), which lets the dispatcher pause lower classes. A
run topic starts as one partition (one lane, read as normal); the first record
of another class grows it to one partition per class (kafka.Placement), and
the relay announces it on cw_topics so that the dispatchers and the other
relays look at its partitions again.

A run the timer service fired ahead of its instant (docs/architecture.md,
"Firing ahead") has a RunReady row that says when it may be published: the
relay reads such rows up to `hold_ms` before then, holds them in memory (a heap
by publishing time, then class), and produces each at its millisecond. Held
rows stay in the outbox until acknowledged, like any other: a crash loses
nothing, and the new owner of a partition reads them again.

Held rows are released by a thread of their own (`_releasing`), so a row
whose time comes while the loop waits on the database (a read, a delete, a
lease tick, a short reconnect) is produced at its time, not after the round
trip. The loop also releases what a read finds due already (no hand-over for
a run due now). What the two threads share is guarded by one lock (`_lock`):
the heap, the rows in flight, and releasing itself (pop and produce()), so
held records reach the producer in the heap's order whichever thread
releases them (what is due at once goes as a batch per class, a topic's
records together: `_produce`). Delivery callbacks run on whichever thread
polls, and only append to deques: never the lock, since a flush under the
lock waits for those very callbacks. The releaser publishes only while the leases' last
renewal is fresh (`_release_until`): a relay cut off from the database stops
releasing before its leases can lapse and another relay read the same rows.

A crash between produce and delete publishes those rows again on restart, so a
topic may hold duplicates; every consumer is idempotent by run_id (and attempt),
and the database never holds two runs for one instant. The producer is
idempotent, so retries inside one session neither duplicate nor reorder.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable

import psycopg

from cronwheel import kafka, metrics
from cronwheel.config import Firing, ProducerRenewal
from cronwheel.consumer import ClientsWedged, make_known, produce, watch_delivering
from cronwheel.dozing import Waker
from cronwheel.fetch_watch import DeliveryWatch
from cronwheel.producer_shards import ShardedProducer, produce_all
from cronwheel.store import outbox
from cronwheel.store.db import LOST, connect, keep_connected
from cronwheel.store.leases import Leases
from cronwheel.topic_watch import announce
from cronwheel.topics_met import RenewingProducer, topics_met
from services.relay.settings import RelaySettings

log = logging.getLogger("cronwheel.relay")

# The releaser publishes for this share of the lease TTL after a renewal
# began (the rest is margin for the clocks); ticks come every third of it.
RELEASE_TTL_SHARE = 0.8
RELEASE_RECHECK_S = 0.05  # with the leases stale, how often the releaser looks again


class Relay:
    name = "relay"  # run_restarting's
    log = log

    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        *,
        batch: int = RelaySettings.batch,
        lease_ttl_ms: int = Firing.lease_ttl_ms,
        idle_ms: int = 500,
        hold_ms: int = 1_000,
        instance: str | None = None,
        wake_every_ms: int = RelaySettings.wake_every_ms,
        delivery_watch_s: float = RelaySettings.delivery_watch_s,
        renewal: ProducerRenewal | None = None,  # the settings' defaults
    ):
        self.dsn = dsn
        self.bootstrap = bootstrap
        # linger 1 ms: the relay already batches by reading the outbox in bulk.
        # Made anew when most topics it met went quiet (cronwheel.topics_met:
        # librdkafka walks every topic a producer has met).
        # Through several producers (cronwheel.producer_shards): librdkafka
        # puts one partition in each request, so a minute's herd of tenants
        # went through one connection one request at a time.
        # The busiest topics through one more producer of their own.
        shards = renewal or ProducerRenewal()
        self.producer = RenewingProducer(
            lambda: ShardedProducer(
                lambda: kafka.producer(bootstrap, principal="relay", **{"linger.ms": 1}),
                shards.shards,
                hot_topics=shards.hot_topics,
                hot_rate=shards.hot_rate,
            ),
            topics_met(renewal),
        )
        self.leases = Leases("relay", ttl_ms=lease_ttl_ms)
        if instance:
            self.leases.owner = instance
        # A row's not_before is the database's time (the timer's clock): it is
        # held until then by that clock, synced at every lease tick, not this
        # host's (a relay 2 s ahead published runs 2 s early: clock_skew_relay).
        self.clock = self.leases.clock
        self.batch = batch
        self.idle_ms = idle_ms
        self.published_total = 0
        self.more = False  # the last pass left rows in some lane
        self._turn = 0
        self._backlog = False  # the last pass left rows behind: read by lanes
        # Produced and not yet deleted (acknowledged or not); guarded by _lock.
        self._inflight: set[int] = set()
        # Filled by delivery callbacks, on whichever thread polls: appends only.
        self._acked: collections.deque[int] = collections.deque()
        self._refused: collections.deque[int] = collections.deque()  # delivery failed
        self._deleting: list[int] = []  # acknowledged, taken from _acked, not yet deleted
        self.hold_ms = hold_ms  # how far ahead of its publishing time a row is read
        # heap: (publish at, class, read order, id, partition, produce()'s arguments)
        self._held: list[tuple] = []
        self._seq = itertools.count()
        self._held_ids: set[int] = set()
        self._settled_at = 0.0  # monotonic time of the last delete
        self._read_at = 0.0  # monotonic time of the last read
        # The heap, the rows in flight and producing (module docstring).
        self._lock = threading.RLock()
        self._due = threading.Condition(self._lock)  # a row pushed: the releaser looks again
        self._release_stop = threading.Event()
        self._releaser: threading.Thread | None = None
        self._release_error: BaseException | None = None
        self._release_until = 0.0  # monotonic: the leases renewed at the last tick hold till then
        self.barrier_s = 1.0  # at most this long for a higher class's acks (_release_due)
        # With rows in flight, a turn's longest wait: how much later than its
        # acknowledgement a row may be deleted (nothing waits on that delete;
        # each turn costs a wake of this thread, docs/architecture.md).
        self.ack_wait_ms = 50
        # Class partitions of run topics; grows a topic a first non-normal record comes to.
        self._placement = kafka.Placement(self.producer, kafka.admin(bootstrap, principal="relay"))
        # Wakes the dispatcher's dozing partitions of a run topic before its records.
        self._wake_topics: set[str] = set()  # made and known to the producer
        # A row read under a wake is published within wake_every_ms + hold_ms
        # of it; one later than that gets a wake of its own (Waker.published).
        self.waker = Waker(
            self.producer,
            every_ms=wake_every_ms,
            produce=self._produce_wake,
            late_ms=wake_every_ms + hold_ms,
        )
        # A producer librdkafka left holding records it neither delivers nor
        # fails ends the run for a new relay (cronwheel.fetch_watch, main.py's
        # run_restarting); `_delivered` counts the reports.
        self.delivery_watch = DeliveryWatch(delivery_watch_s) if delivery_watch_s else None
        self.delivery_reports = 0

    def run(self, stop: threading.Event) -> None:
        """Publish until `stop`. A lost database (a restart, a terminated
        session) ends only the pass: the loop connects again (the services'
        reconnect policy, cronwheel.store.db) and goes on with what it holds:
        rows in flight, acknowledged and held stay in memory, and the leases
        are renewed first."""
        self._placement.prime()  # every run topic's count, before the first pass
        self._start_releasing()
        try:
            keep_connected(self._run_connected, stop, log)
        finally:
            self._stop_releasing()

    def _start_releasing(self) -> None:
        self._release_stop.clear()
        self._releaser = threading.Thread(target=self._releasing, name="relay-release", daemon=True)
        self._releaser.start()

    def _stop_releasing(self, timeout_s: float = 10.0) -> None:
        """The releaser stopped and joined: nothing produced by it after this,
        unless it is stuck in produce() (a full local queue on a wedged
        producer), which is logged and left to the purge that follows."""
        with self._due:
            self._release_stop.set()
            self._due.notify()
        releaser, self._releaser = self._releaser, None
        if releaser is not None and releaser is not threading.current_thread():
            releaser.join(timeout_s)
            if releaser.is_alive():
                log.error("the releasing thread did not stop within %.0f s", timeout_s)

    def _releasing(self) -> None:
        """Produce each held row at its time until stopped. An error ends the
        thread, is logged here and raised by the loop at its next turn
        (`_check_releaser`), which ends the run with it."""
        try:
            while True:
                with self._due:
                    if self._release_stop.is_set():  # under the lock: no stop missed
                        return
                    wait = self._until_held() / 1000
                    if time.monotonic() >= self._release_until:
                        wait = max(wait, RELEASE_RECHECK_S)  # leases stale: hold everything
                    if wait > 0:
                        # Woken early by a row pushed ahead of the first, or a stop.
                        self._due.wait(min(wait, self.idle_ms / 1000))
                        continue
                self._release_due()
        except BaseException as exc:
            log.exception("the releasing thread failed")
            self._release_error = exc

    def _check_releaser(self) -> None:
        if self._release_error is not None:
            error, self._release_error = self._release_error, None
            raise error

    def _run_connected(self, stop: threading.Event) -> None:
        with (
            connect(self.dsn, idle_tx_timeout_ms=self.leases.ttl_ms) as conn,
            connect(self.dsn) as listen,
        ):
            listen.execute("LISTEN cw_outbox")
            listen.execute("LISTEN cw_topics")  # topics grown: their counts asked again
            next_lease = 0.0
            read = True  # look for new rows this turn (else only settle acks)
            lost = False
            try:
                while not stop.is_set():
                    self._check_releaser()
                    if time.monotonic() >= next_lease:
                        began = time.monotonic()
                        # A partition given up is forgotten before the release
                        # commits: no held row of it is produced after.
                        self.leases.tick(conn, on_release=self._forget_partitions)
                        self._forget_unowned()
                        # Renewed no earlier than `began`: they hold a TTL from
                        # then; the releaser stops well before (a tick is due
                        # every third of it).
                        self._release_until = began + self.leases.ttl_ms * RELEASE_TTL_SHARE / 1000
                        metrics.OWNED_PARTITIONS.labels("relay").set(len(self.leases.owned))
                        next_lease = time.monotonic() + self.leases.ttl_ms / 3000
                        read = True
                    if read:
                        n = self.relay_once(conn)
                        self._announce_grown(conn)
                        if n >= self.batch or self.more:
                            continue
                    else:
                        self._settle(conn, lazy=True)
                    # Held rows come due on the releaser: this loop waits only
                    # for acknowledgements, notifications and the leases.
                    if self._inflight:
                        # Take the acknowledgements come so far and wait for a
                        # notification, up to ack_wait_ms: read again only when
                        # a commit announced new rows (no query per turn
                        # otherwise). Not woken by each acknowledgement: one
                        # comes every millisecond at 1,000 runs/s, the releaser's
                        # polls take them as it produces, and acknowledged rows
                        # are deleted about once a turn (`_settle`).
                        self.producer.poll(0)
                        wait = self.ack_wait_ms / 1000
                    else:
                        # Wait for a notification or the next renewal of the
                        # leases (a late one loses them).
                        renew = max(0.0, next_lease - time.monotonic())
                        wait = min(self.idle_ms / 1000, renew)
                    notified = self._notified(listen, wait)
                    if self.delivery_watch is not None and self.delivery_watch.due():
                        watch_delivering(
                            self.delivery_watch, self.producer, self.delivery_reports,
                            lambda: kafka.answers(self.bootstrap, principal="relay"),
                        )  # fmt: skip
                    self.producer.renew_if_quiet("relay", log, producing=self._lock)
                    # Read anyway every idle_ms, whatever the notifications said.
                    read = notified or time.monotonic() - self._read_at >= self.idle_ms / 1000
            except LOST:
                lost = True  # connected again by run(); nothing here is given up
                raise
            except ClientsWedged:
                # Its rows in flight stay in the outbox, read and published
                # again by the next relay; the stuck producer must not publish
                # them later as well.
                self._stop_releasing()
                self.producer.purge()
                raise
            finally:
                if not lost:
                    self._wind_down(conn)

    def _wind_down(self, conn: psycopg.Connection) -> None:
        """Leaving: wait for what is in flight, delete what was acknowledged,
        hand the leases back."""
        self._stop_releasing()
        self.producer.flush(10)
        try:
            self._settle(conn)
            self.leases.release_all(conn)
        except psycopg.Error:
            log.warning("could not delete acknowledged rows or release leases")

    def _notified(self, listen: psycopg.Connection, wait: float) -> bool:
        """Wait up to `wait` s for a notification; True if new outbox rows
        were announced. A grown topic's partition count is forgotten."""
        notified = False
        for note in listen.notifies(timeout=wait, stop_after=1):
            if note.channel == "cw_topics":
                self._placement.forget(note.payload)
            else:
                notified = True
        return notified

    def _announce_grown(self, conn: psycopg.Connection) -> None:
        if self._placement.grown:
            announce(conn, self._placement.grown)
            self._placement.grown = []

    def relay_once(self, conn: psycopg.Connection) -> int:
        """Publish pending rows not already in flight, and delete the rows Kafka
        has acknowledged since the last call; returns rows read.

        Without a backlog this pipelines: a pass produces and goes on, the
        acknowledgements arrive while the next pass reads, so a row waits for
        one read and its own acknowledgement rather than a whole pass before
        it. Rows in flight are excluded from the read (`read_small`), never
        deleted before their acknowledgement. Under a backlog the fair read
        (`read_fair`) needs nothing in flight: the pass waits for the
        acknowledgements first, as a batch of thousands amortises that wait."""
        self.more = False
        self._settle(conn)
        if not self.leases.owned:
            return 0
        self._turn += 1
        self._read_at = time.monotonic()
        owned = self.leases.owned_array()
        hold_until = self.clock() + self.hold_ms
        fair = None
        if not self._backlog and len(self._inflight) < self.batch:
            fair = outbox.read_small(
                conn, owned, self.batch, exclude=self._excluded(), hold_until=hold_until
            )
        if fair is None:
            self._drain(conn)
            fair = outbox.read_fair(conn, owned, self.batch, self._turn, hold_until=hold_until)
        self._backlog = fair.more or len(fair.rows) >= self.batch
        rows = fair.rows
        if not rows:
            return 0
        self.more = fair.more
        if fair.lanes > 1:
            metrics.FAIR_LANES.labels("relay").set(fair.lanes)
        # Every row goes through the heap, so what is published now goes by
        # time, then class: at a storm's instant, the critical rows held since
        # before it are produced ahead of normal ones this read found already
        # due. produce()'s arguments are made now, so that releasing a thousand
        # rows due at one instant costs only the calls.
        # The fair read excludes nothing: a row held, or released by the
        # releaser since the read, is not pushed again (looked up here to skip
        # making its record, decided under the lock below).
        made = []
        read_at = self.clock()
        for row in rows:
            if row[0] not in self._held_ids and row[0] not in self._inflight:
                made.append((row, self._record(row)))
                # The wake says when the row comes (by this relay's clock, the
                # database's): the dispatcher resumes the partition just before.
                self.waker.read(row[1], None if row[6] is None else row[6] - read_at)
        with self._due:
            # A row due now is stamped now, under the lock: none the releaser
            # produced while the records were made is behind it in the heap.
            now = self.clock()
            for row, record in made:
                row_id, not_before = row[0], row[6]
                if row_id in self._held_ids or row_id in self._inflight:
                    continue
                at = now if not_before is None else not_before
                # Within a time and class, the order read (the fair read's lanes).
                heapq.heappush(self._held, (at, row[5], next(self._seq), row_id, row[7], record))
                self._held_ids.add(row_id)
            self._due.notify()  # a row ahead of the releaser's first
        self._release_due()  # what is due already, here rather than handed over
        if self._backlog:
            self._drain(conn)
        else:
            self.producer.poll(0)
            self._settle(conn)
        return len(rows)

    def _record(self, row: tuple) -> dict:
        """produce()'s arguments for an outbox row."""
        _row_id, topic, key, value, headers, rank = row[:6]
        hdrs = (
            list(headers.items())
            if isinstance(headers, dict)
            else (list(json.loads(headers).items()) if headers else None)
        )
        return {
            "topic": topic,
            "value": bytes(value),
            "key": bytes(key) if key is not None else None,
            "headers": hdrs,
            **self._placement(topic, rank, key),
        }

    def _produce(self, rows: list[tuple[int, dict]]) -> None:
        """Under _lock (the caller's): the rows' records (of one class) as
        one batch (producer_shards.produce_all: the producers' bookkeeping
        once per topic, not once a record, so a herd of 1,000 due at one
        instant goes out in about the client's own time), grouped by topic
        in the order of each topic's first row: a partition's records of a
        herd are then given together and leave in about one produce request,
        not one per partition per millisecond of the loop (linger 1 ms); a
        topic's own records keep the heap's order. A topic's wake, when due,
        before its first record."""
        by_topic: dict[str, list[dict]] = {}
        for row_id, record in rows:
            self._inflight.add(row_id)
            record["on_delivery"] = functools.partial(self._delivered, row_id)
            by_topic.setdefault(record["topic"], []).append(record)
        for topic in by_topic:
            if self.waker.published(topic):
                metrics.LATE_WAKES.inc()
        # A full local queue is waited out, never dropped. A topic the
        # broker does not have was made by the placement first.
        produce_all(self.producer, [record for group in by_topic.values() for record in group])

    def _produce_wake(self, producer, **record) -> None:
        """A wake, produced as any record (a full local queue waited out); the
        wake topic is made before this process's first wake to it (make_known:
        with no dispatcher to have made it, the first wake held the relay's
        whole backlog 30 s)."""
        wake = record["topic"]
        if wake not in self._wake_topics:
            make_known(producer, wake, self._make_wake_topic)
            self._wake_topics.add(wake)
        produce(producer, **record)

    def _make_wake_topic(self, name: str) -> None:
        kafka.ensure_topics([name], partitions=1, client=self._placement.admin)

    def _release_due(self) -> int:
        """Produce the held rows whose time has come (by time, then class),
        under the lock: from either thread, the heap's order is the producer's
        (a batch per class, each topic's records together within it)."""
        if not self._held:
            return 0
        with self._lock:
            n = self._release_due_locked()
        if n:
            self.producer.poll(0)  # acknowledgements so far (callbacks: deques only)
        return n

    def _release_due_locked(self) -> int:
        now = self.clock()
        n = 0
        last: int | None = None
        batch: list[tuple[int, dict]] = []
        while self._held and self._held[0][0] <= now:
            if last is not None and self._held[0][1] != last:
                # A batch is one class (`_produce` groups its records by
                # topic, which keeps the classes' order only within one).
                self._produce(batch)
                n += len(batch)
                batch = []
                if last < outbox.NORMAL and self._held[0][1] > last:
                    # A class above normal goes to the broker on its own: its
                    # acknowledgements first, then the lower classes due with
                    # it. Produced together they would share produce requests,
                    # and the broker appends a herd's normal records before it
                    # answers (docs/priority.md, "A class above normal goes to
                    # the broker alone", tells what bench/bench_storm.py
                    # measured).
                    self.producer.flush(self.barrier_s)
                    metrics.CLASS_BARRIERS.inc()
            _at, last, _seq, row_id, _p, record = heapq.heappop(self._held)
            self._held_ids.discard(row_id)
            batch.append((row_id, record))
        if batch:
            self._produce(batch)
        return n + len(batch)

    def _until_held(self) -> int:
        """Milliseconds until the first held row is due (a large number if none)."""
        return max(0, self._held[0][0] - self.clock()) if self._held else 3_600_000

    def _excluded(self) -> list[int]:
        """Rows a read must not return: held, or produced and not yet deleted
        (acknowledged ones stay in _inflight until deleted)."""
        with self._lock:
            if not self._held_ids:
                return list(self._inflight)
            return list(self._inflight | self._held_ids)

    def _forget_unowned(self) -> None:
        """After a lease change: drop held rows of partitions no longer ours (their
        new owner reads them from the outbox)."""
        owned = self.leases.owned
        self._keep_held(lambda partition: partition in owned)

    def _forget_partitions(self, partitions: list[int]) -> None:
        """Leases.tick's on_release: the partitions given up, before they are."""
        gone = set(partitions)
        self._keep_held(lambda partition: partition not in gone)

    def _keep_held(self, keep: Callable[[int], bool]) -> None:
        with self._lock:
            if not all(keep(item[4]) for item in self._held):
                self._held = [item for item in self._held if keep(item[4])]
                heapq.heapify(self._held)
                self._held_ids = {item[3] for item in self._held}

    def _delivered(self, row_id: int, err, _msg) -> None:
        """Delivery callback (inside producer.poll/flush, on the thread that
        called it): appends only, no lock (module docstring). The count is the
        delivery watch's sign of progress, exact enough for that."""
        self.delivery_reports += 1
        (self._acked if err is None else self._refused).append(row_id)

    def _drain(self, conn: psycopg.Connection) -> None:
        """Wait until nothing is in flight, then delete what was acknowledged.
        The releaser waits meanwhile (the flush is under the lock), or the
        flush would wait for its records too, as long as rows keep coming due."""
        if self._inflight:
            with self._lock:
                remaining = self.producer.flush(30)
            if remaining:
                log.warning(
                    "%d records not acknowledged within 30 s; they stay in the outbox", remaining
                )
        self._settle(conn)

    def _settle(self, conn: psycopg.Connection, lazy: bool = False) -> None:
        """Delete the acknowledged rows (one statement) and count the outcome.
        `lazy`: only once 256 are waiting or 20 ms have passed, so rows released
        one at a time from the hold do not cost a statement each."""
        if lazy and len(self._acked) < 256 and time.monotonic() - self._settled_at < 0.02:
            return
        self._settled_at = time.monotonic()
        self._deleting.extend(_take(self._acked))
        if self._deleting:
            # Forgotten only once deleted: after a lost connection they are
            # deleted on the next one, not read and published again.
            outbox.delete_delivered(conn, self._deleting)
            deleted, self._deleting = self._deleting, []
            with self._lock:
                self._inflight.difference_update(deleted)
            self.published_total += len(deleted)
            metrics.OUTBOX_PUBLISHED.inc(len(deleted))
        if refused := _take(self._refused):
            with self._lock:
                self._inflight.difference_update(refused)  # read and produced again later
            metrics.OUTBOX_FAILED.inc(len(refused))
            log.warning("%d outbox rows failed to publish; retrying on a later pass", len(refused))
        with self._lock:  # the releaser produces under it: none between the two
            # len() first: librdkafka counts a record until its callback has
            # returned, so at 0 every report is in the deques (tested after).
            if len(self.producer) == 0 and not self._acked and not self._refused:
                # Nothing queued, awaiting an answer or reported and not yet
                # taken: a row still marked in flight was lost without a
                # callback (it cannot be), so read it again.
                self._inflight.clear()

    def close(self) -> None:
        self.producer.flush(10)


def _take(reports: collections.deque) -> list:
    """What a deque of delivery reports holds now (others may append meanwhile)."""
    return [reports.popleft() for _ in range(len(reports))]
