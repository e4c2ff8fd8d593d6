"""What every Kafka consumer of the platform does the same way: commit the
offsets of finished records (only of partitions it still holds), hand over
revoked partitions cleanly, report its lag, and set aside the client's error
events. The services (dispatcher, workflow, executor, webhook) differ in what
a record means, not in this.

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

import logging
import time
from collections.abc import Iterable, MutableMapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from cronwheel import metrics

log = logging.getLogger("cronwheel.consuming")

Where = tuple[str, int]  # (topic, partition)

COMMIT_EVERY_S = 0.2  # asynchronous offset commits from a poll loop at most this often


class Pacer:
    """Says yes at most once per `every_s`: paces a poll loop's asynchronous
    offset commits. Committing on every poll or batch cost the broker a commit
    per record at a trickle (at 200 runs/s, with the consumers' 10 ms fetches,
    60% of a core); a record consumed again after a crash is skipped by the
    database, so committing a little later loses nothing."""

    def __init__(self, every_s: float = COMMIT_EVERY_S):
        self.every_s = every_s
        self._last = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True


def commit_assigned(
    consumer: Consumer, done: MutableMapping[Where, int], *, asynchronous: bool
) -> None:
    """Commit `done` (next offset per partition) for the partitions still
    assigned: a revoked partition's new owner commits its own."""
    if not done:
        return
    assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    offsets = [TopicPartition(t, p, o) for (t, p), o in done.items() if (t, p) in assigned]
    if not offsets:
        return
    try:
        consumer.commit(offsets=offsets, asynchronous=asynchronous)
    except KafkaException as exc:
        log.warning("commit failed (the records come again and are skipped): %s", exc)


def commit_revoked(
    consumer: Consumer, done: MutableMapping[Where, int], partitions: Iterable[TopicPartition]
) -> set[Where]:
    """On revoke: commit what was finished of these partitions, forget them,
    and return them (the caller drops its own state of them)."""
    revoked = {(tp.topic, tp.partition) for tp in partitions}
    offsets = [TopicPartition(t, p, o) for (t, p), o in done.items() if (t, p) in revoked]
    if offsets:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit on revoke failed: %s", exc)
    for key in revoked:
        done.pop(key, None)
    return revoked


def report_lag(consumer: Consumer, label: str) -> int:
    """Records behind the end of the assigned partitions, from the watermarks
    the last fetches brought (no extra requests); published as consumer lag."""
    total = 0
    assigned = consumer.assignment()
    for tp in consumer.position(assigned) if assigned else []:
        _low, high = consumer.get_watermark_offsets(tp, cached=True)
        if tp.offset >= 0 and high >= 0:
            total += max(high - tp.offset, 0)
    metrics.CONSUMER_LAG.labels(label).set(total)
    return total


def on_commit(err, _partitions) -> None:
    """The `on_commit` callback: an asynchronous commit that failed is logged."""
    if err is not None and err.code() != KafkaError._NO_OFFSET:
        log.warning("offset commit failed (the records come again and are skipped): %s", err)


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
