"""What every Kafka consumer of the platform does the same way with its
offsets: commit those of finished records (only of partitions it still holds),
paced, hand over revoked partitions cleanly, report its lag, and set aside the
client's error events. `Offsets` holds a consumer's; the services' skeleton
(cronwheel.consumer) is built on it. The services (dispatcher, workflow,
executor, webhook) differ in what a record means, not in this.

Offsets are bookmarks here, never the idempotency record (that is the
database), so a failed commit only means records come again and are skipped.

Rebalance callbacks (on_assign, on_revoke) run inside the consumer's own
consume() or poll(). They may commit and read committed offsets, which do not
touch the client's call state, but they must not call list_topics, consume,
poll or close on the same consumer. confluent-kafka keeps one call state per
client and thread, and a nested call clears it. The next callback of the same
consume() (on_commit, the other half of a cooperative rebalance) then aborts
the whole process with "CallState_get: Assertion `cs != NULL' failed".
Ask another client (the service's producer) for metadata instead.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Container, Iterable, MutableMapping

from confluent_kafka import (
    OFFSET_INVALID,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cronwheel import kafka, metrics
from cronwheel.core.offsets import OffsetTracker

log = logging.getLogger("cronwheel.consuming")

Where = tuple[str, int]  # (topic, partition)

COMMIT_EVERY_S = 0.2  # asynchronous offset commits from a poll loop at most this often
LAG_EVERY_S = 5.0  # consumer lag published at most this often


class Pacer:
    """Says yes at most once per `every_s`, the first time `every_s` after it
    was made: paces a poll loop's asynchronous offset commits. Committing on
    every poll or batch cost the broker a commit per record at a trickle (at
    200 runs/s, with the consumers' 10 ms fetches, 60% of a core); a record
    consumed again after a crash is skipped by the database, so committing a
    little later loses nothing. Counting from the start, a service killed
    within its first interval has committed nothing yet
    (tests/e2e/test_workflow_faults.py kills the workflow service, which
    commits every 5 s there, and expects its records to come again)."""

    def __init__(self, every_s: float = COMMIT_EVERY_S):
        self.every_s = every_s
        self._last = time.monotonic()

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True


def commit_assigned(
    consumer: Consumer,
    done: MutableMapping[Where, int],
    *,
    asynchronous: bool,
    assigned: Container[Where] | None = None,
) -> None:
    """Commit `done` (next offset per partition) for the partitions still
    assigned: a revoked partition's new owner commits its own. `assigned`:
    the consumer's assignment as its owner keeps it (cronwheel.assignment);
    without it, librdkafka's is asked, a list of every assigned partition
    made anew at each commit (at 3,000 tenants, five times a second through
    a minute's herd: a cost that grew with the square of the tenants)."""
    if not done:
        return
    if assigned is None:
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    offsets = [TopicPartition(t, p, o) for (t, p), o in done.items() if (t, p) in assigned]
    if not offsets:
        return
    try:
        consumer.commit(offsets=offsets, asynchronous=asynchronous)
    except KafkaException as exc:
        log.warning("commit failed (the records come again and are skipped): %s", exc)


def commit_revoked(
    consumer: Consumer,
    done: MutableMapping[Where, int],
    partitions: Iterable[TopicPartition],
    confirmed: MutableMapping[Where, int],
) -> set[Where]:
    """On revoke: commit what was finished of these partitions, but where the
    broker already confirmed that very offset (`confirmed`), forget them, and
    return them (the caller drops its own state of them)."""
    revoked = {(tp.topic, tp.partition) for tp in partitions}
    offsets = [
        TopicPartition(t, p, o)
        for (t, p), o in done.items()
        if (t, p) in revoked and confirmed.get((t, p)) != o
    ]
    if offsets:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit on revoke failed: %s", exc)
    for key in revoked:
        done.pop(key, None)
        confirmed.pop(key, None)
    return revoked


FIRST_OFFSET = 0  # where a partition with nothing committed is assigned (starting_points)


def starting_points(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float = 10.0
) -> list[TopicPartition] | None:
    """Where to start reading each of `partitions` in an assignment: its own
    offset where it has one, else the group's committed offset, else offset 0.
    None if the group's coordinator did not answer: the caller assigns none
    of them and asks again later.

    Offset 0 rather than OFFSET_BEGINNING: a logical offset is looked up
    first (a ListOffsets request on the leader's connection, which the broker
    answers only after the fetch outstanding there, up to fetch.wait.max.ms),
    and the partition joins the fetches only after that; a new tenant's first
    run waited for it. 0 is the beginning of every log whose start has not
    moved; where retention moved it, the fetch at 0 is out of range and
    librdkafka resets to the earliest record (auto.offset.reset,
    cronwheel.kafka.consumer): the same place, a round trip later.

    Why never assign without an offset and let librdkafka fetch the committed
    one: when that fetch fails as a whole (NOT_COORDINATOR while a new group's
    coordinator is being placed, a broker restarting), librdkafka 2.x neither
    retries it nor starts the partitions (rdkafka_assignment.c,
    rd_kafka_assignment_apply_offsets: "Do nothing for request-level
    errors"); they stay assigned and are never read. A `committed()` that
    failed is asked again here, and its failure makes librdkafka look up the
    coordinator again."""
    ask = [
        TopicPartition(tp.topic, tp.partition)
        for tp in partitions
        if tp.offset in (OFFSET_INVALID, OFFSET_STORED)
    ]
    start = {(tp.topic, tp.partition): tp.offset for tp in partitions}
    if ask:
        try:
            got = consumer.committed(ask, timeout=timeout_s)
            why = next((tp.error for tp in got if tp.error is not None), None)
        except KafkaException as exc:
            why = exc
        if why is not None:
            log.warning("committed offsets of %d partitions unavailable: %s", len(ask), why)
            return None
        for tp in got:
            start[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else FIRST_OFFSET
    return [
        TopicPartition(tp.topic, tp.partition, start[(tp.topic, tp.partition)]) for tp in partitions
    ]


def positions(consumer: Consumer, keys: list[Where]) -> dict[Where, int]:
    """Where `consumer` read each of `keys` to (the next offset), where known."""
    got = consumer.position([TopicPartition(t, p) for t, p in keys])
    return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}


def report_lag(
    consumer: Consumer,
    label: str,
    skip: Container[Where] = (),
    *,
    assigned: Iterable[Where] | None = None,
    position: Callable[[list[Where]], dict] | None = None,
) -> int:
    """Records behind the end of the assigned partitions but `skip`, from the
    watermarks the last fetches brought (no extra requests); published as
    consumer lag. `skip`: partitions left unfetched on purpose, whose
    watermarks say nothing (dozing ones). Each partition asked of librdkafka
    costs a lookup by name, a walk over every topic it knows (so N lookups
    of N topics at N tenants): `assigned` and `position` (where each was
    consumed to, where known), when the caller keeps them, leave only the
    watermark's lookup to librdkafka."""
    if assigned is None:
        assigned = [(tp.topic, tp.partition) for tp in consumer.assignment()]
    keys = [key for key in assigned if key not in skip]
    if position is None:
        position = functools.partial(positions, consumer)
    at = position(keys) if keys else {}
    total = 0
    for (topic, partition), offset in at.items():
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        if offset is not None and offset >= 0 and high is not None and high >= 0:
            total += max(high - offset, 0)
    metrics.CONSUMER_LAG.labels(label).set(total)
    return total


def describe(consumer: Consumer, *, asker=None, detail: int = 50, timeout_s: float = 5.0) -> dict:
    """A consumer's state, for a diagnosis (cronwheel.runtime, SIGUSR2): how
    many partitions are assigned, which have records past their position
    (`behind`, by the watermarks the last fetches brought), how many no fetch
    has answered yet (`unfetched`), whether the group's coordinator gives the
    committed offsets, and each partition's position, high watermark and
    committed offset (the first `detail` of them: at 3,000 tenants the whole
    list is a megabyte). Asks the broker once (`committed`, up to
    `timeout_s`), and with `asker` (another client) the end offsets of those
    shown, beside the watermarks: a partition the consumer stopped fetching
    shows its cached watermark stale. Never raises."""
    try:
        parts = consumer.assignment()
        positions = consumer.position(parts) if parts else []
    except KafkaException as exc:
        return {"error": str(exc)}
    rows: dict[str, dict] = {}
    behind: list[str] = []
    unfetched = 0
    for tp in positions:
        name = f"{tp.topic}[{tp.partition}]"
        try:
            low, high = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            low = high = None
        if high is None or high < 0:
            unfetched += 1
        elif high > (tp.offset if tp.offset >= 0 else max(low or 0, 0)):
            behind.append(name)
        rows[name] = {"position": tp.offset, "high": high}
    state: dict = {"assigned": len(parts), "unfetched": unfetched, "behind": behind[:detail]}
    if parts:
        try:
            for tp in consumer.committed(parts, timeout=timeout_s):
                row = rows[f"{tp.topic}[{tp.partition}]"]
                row["committed"] = str(tp.error) if tp.error else tp.offset
            state["coordinator"] = "answers"
        except KafkaException as exc:
            state["coordinator"] = f"no answer: {exc}"
    shown = [tp for tp in positions if f"{tp.topic}[{tp.partition}]" in rows][:detail]
    if asker is not None and shown:
        ends = kafka.end_offsets(asker, [(tp.topic, tp.partition) for tp in shown])
        for (t, p), end in ends.items():
            rows[f"{t}[{p}]"]["end"] = end
    state["partitions"] = {
        f"{tp.topic}[{tp.partition}]": rows[f"{tp.topic}[{tp.partition}]"] for tp in shown
    }
    return state


def on_commit(err, _partitions) -> None:
    """The `on_commit` callback: an asynchronous commit that failed is logged."""
    if err is not None and err.code() != KafkaError._NO_OFFSET:
        log.warning("offset commit failed (the records come again and are skipped): %s", err)


def take(
    consumer: Consumer,
    batch: int,
    wait_s: float,
    more_s: float,
    quiet: tuple[int, ...] = (),
    first: Callable[[list[Message]], list[Message]] | None = None,
) -> list[Message]:
    """Up to `batch` records: block up to `wait_s` for one, then take what
    else arrives within `more_s`, so batches grow under load and a lone
    record waits little. Error events handled as by `records`. `first`, if
    given, sees the first record before the wait for more and returns what
    stays in the batch (the dispatcher acts on a wake at once)."""
    raw = consumer.consume(1, timeout=wait_s)
    msgs = records(raw, quiet)
    if msgs and first is not None:
        msgs = first(msgs)
    if raw and batch > 1:
        msgs += records(consumer.consume(batch - 1, timeout=more_s), quiet)
    return msgs


def records(msgs: Iterable[Message], quiet: tuple[int, ...] = ()) -> list[Message]:
    """The records among what `consume` returned: a fatal error event raises,
    end-of-partition events are dropped, other events are logged (at debug for
    the codes in `quiet`)."""
    good = []
    for m in msgs:
        err = m.error()
        if err is None:
            good.append(m)
        elif err.fatal():
            raise KafkaException(err)
        elif err.code() in quiet:
            log.debug("consume: %s", err)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("consume: %s", err)
    return good


class Offsets:
    """One consumer's finished offsets (the next offset to read, per
    partition), committed paced and only where something finished since, and
    its lag, reported every `lag_every_s`. A record counts as finished once
    its effect is durable (in the database, or acknowledged by the broker).

    A paced (asynchronous) commit names only the partitions that finished a
    record since the last commit: naming every partition with an offset, as
    it did, made each commit cost the client a lookup of every topic it knows
    per partition named (librdkafka finds a topic by walking them all) and
    the broker a record each in __consumer_offsets, five times a second, so
    a dispatcher firing 3,000 tenants at one instant committed ~60,000
    offsets for 3,000 runs. An asynchronous commit that fails is not tried
    again for partitions that finish nothing more: their offsets go with
    that partition's next synchronous commit (a stop; for the dispatcher also
    a hand-over or the partition dozing), and after a crash their records
    come again and are skipped, as any record consumed again is."""

    def __init__(
        self,
        label: str,
        *,
        commit_every_s: float = COMMIT_EVERY_S,
        lag_every_s: float = LAG_EVERY_S,
    ):
        self.label = label
        self.done: dict[Where, int] = {}
        self.lag_every_s = lag_every_s
        self._pacer = Pacer(commit_every_s)
        self._changed: set[Where] = set()  # finished since the last commit
        self.confirmed: dict[Where, int] = {}  # stored by the broker (on_commit)
        self._next_lag = 0.0

    def on_commit(self, err, partitions: list[TopicPartition]) -> None:
        """The consumer's `on_commit` callback (on the thread that consumes):
        a failure is logged; offsets the broker stored are kept as confirmed,
        so a partition handed over or dozing is not committed again at the
        offset its last paced commit already stored (at 3,000 tenants, half
        the dispatcher's commits: one paced, one as each partition dozed).
        A coordinator answers a client's commits in the order they were
        sent, so the last confirmed offset is the one the broker holds."""
        on_commit(err, partitions)
        if err is not None:
            return
        for tp in partitions:
            if tp.error is None and tp.offset >= 0:
                self.confirmed[(tp.topic, tp.partition)] = tp.offset

    def finished(self, m: Message) -> None:
        """`m` and every record before it in its partition are done."""
        key = (m.topic(), m.partition())
        self.done[key] = m.offset() + 1
        self._changed.add(key)

    def committable(self) -> MutableMapping[Where, int]:
        return self.done

    def commit(
        self,
        consumer: Consumer,
        *,
        asynchronous: bool,
        assigned: Container[Where] | None = None,
    ) -> None:
        """Commit on partitions still assigned (`assigned`, if the caller
        keeps the assignment; else librdkafka's): asynchronously only when
        something finished and the pacer allows (a record consumed again is
        skipped by the database), and then only the partitions that did;
        synchronously always, every partition (a stop, a hand-over)."""
        if asynchronous and not (self._changed and self._pacer.due()):
            return
        # Taken before the offsets are read: a record finished meanwhile (the
        # webhook finishes on another thread) is named by the next commit.
        changed, self._changed = self._changed, set()
        done = self._moved(changed) if asynchronous else self.committable()
        commit_assigned(consumer, done, asynchronous=asynchronous, assigned=assigned)

    def _moved(self, changed: set[Where]) -> MutableMapping[Where, int]:
        """The offsets of the partitions in `changed`."""
        done = self.committable()
        return {key: done[key] for key in changed if key in done}

    def give_up(self, consumer: Consumer, partitions: Iterable[TopicPartition]) -> set[Where]:
        """These partitions go (revoked, or their lease moved): commit what was
        finished of them and forget them; returns them."""
        return commit_revoked(consumer, self.committable(), partitions, self.confirmed)

    def report_lag(
        self,
        consumer: Consumer,
        skip: Container[Where] = (),
        *,
        assigned: Iterable[Where] | None = None,
        position: Callable[[list[Where]], dict] | None = None,
    ) -> None:
        """The lag (of the partitions but `skip`), when `lag_every_s` passed
        since it was last reported (module function's `assigned`, `position`)."""
        now = time.monotonic()
        if now >= self._next_lag:
            report_lag(consumer, self.label, skip, assigned=assigned, position=position)
            self._next_lag = now + self.lag_every_s


class TrackedOffsets(Offsets):
    """Offsets of a consumer that finishes records out of order (the webhook
    service's concurrent deliveries): a partition's offset moves only past
    records that are all finished (cronwheel.core.offsets)."""

    def __init__(self, label: str, **kwargs):
        super().__init__(label, **kwargs)
        self.tracker = OffsetTracker()

    def begin(self, topic: str, partition: int, offset: int) -> None:
        self.tracker.begin(topic, partition, offset)

    def finish(self, topic: str, partition: int, offset: int) -> None:
        self.tracker.finish(topic, partition, offset)
        self._changed.add((topic, partition))

    def committable(self) -> MutableMapping[Where, int]:
        return self.tracker.committable()

    def _moved(self, changed: set[Where]) -> MutableMapping[Where, int]:
        # The tracker hands out only what moved since it last did, once: a
        # filter here would drop, for good, a partition finished between
        # the swap of `_changed` and this call.
        return self.committable()

    def give_up(self, consumer: Consumer, partitions: Iterable[TopicPartition]) -> set[Where]:
        gone = super().give_up(consumer, partitions)
        for topic, partition in gone:
            self.tracker.forget(topic, partition)
        return gone
