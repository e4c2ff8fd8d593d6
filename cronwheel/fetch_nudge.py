"""A topic of a service's own that its consumer always fetches and that it
writes to, to end the fetch outstanding: `<p>.nudge.<service>`, one partition.

Why: a fetch names the partitions assigned when it was sent, and the broker
holds it until a record arrives for one of them or `fetch.wait.max.ms` (500
ms) passes. A partition assigned meanwhile (a new tenant's topic) is fetched
only by the next fetch, and a request queued on the same connection (the
new topic's metadata, `assignment.learn_leaders`) is answered only after
that fetch. So a new tenant's first run waited up to a whole fetch wait: the
webhook service's first deliveries, p99 ~520 ms (docs/dispatcher.md, "New
tenants and new destinations"). A record on a partition the outstanding
fetch names ends it at once. The dispatcher writes its nudges to the wake
topic it reads anyway (cronwheel.dozing); a service without one reads this.

What holds:

- The partition is read from its end as it was when the consumer started
  (asked of the broker, `assign_from_end`), never paused, never committed:
  a nudge carries nothing, and one missed costs at most one fetch wait.
- A nudge ends the fetch of every instance of the service (they all read
  the topic); each then sends the next fetch at once: one fetch more each,
  per assignment that added partitions anywhere.
- Nudge records never reach a service's handling (`drop`); they are neither
  decoded nor dead-lettered.
- Without the topic (the broker away at the start, a deployment whose ACLs
  predate it) the service runs as before: new topics' leaders are asked and
  not waited for (assignment.ask_unwaited), first runs wait up to one fetch.
  The start is tried again at a nudge `RETRY_S` later, on the consumer's
  thread (a nudge is made there), warned of once.
- One broker: a nudge ends the fetch on the connection to the nudge topic's
  leader. With several brokers a new topic's leader may be another, whose
  fetch it does not end (the dispatcher's wake topic has the same limit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Message, Producer, TopicPartition

from cronwheel.kafka import ensure_topics

log = logging.getLogger("cronwheel.fetch_nudge")

RETRY_S = 60.0  # a failed start is tried again this long after, at a nudge


def assign_from_end(consumer: Consumer, topic: str, timeout_s: float = 10.0) -> None:
    """Add partition 0 of `topic` to the assignment at its end as it is now.
    The end is asked of the broker here, not left to librdkafka (OFFSET_END),
    which resolves it only when it first fetches the partition: on a busy
    machine or a topic just made that can be after a record meant for this
    instance was written, and the record would be skipped."""
    where = TopicPartition(topic, 0)
    try:
        _low, where.offset = consumer.get_watermark_offsets(where, timeout=timeout_s)
    except KafkaException as exc:
        log.warning("%s's end unknown (%s): read from where librdkafka finds it", topic, exc)
        where.offset = OFFSET_END
    consumer.incremental_assign([where])


def ensurer(bootstrap: str, principal: str) -> Callable[[list[str]], None]:
    """Makes nudge topics (one partition) as `principal`, where they do not exist."""
    return lambda names: ensure_topics(
        names, partitions=1, bootstrap=bootstrap, principal=principal
    )


class FetchNudge:
    def __init__(
        self,
        topic: str,
        producer: Producer,
        ensure: Callable[[list[str]], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        """`ensure`: makes the topic where it does not exist (`ensurer`)."""
        self.topic = topic
        self.producer = producer
        self.ensure = ensure
        self.active = False  # started: the consumer fetches the topic
        self.sent_total = 0
        self._clock = clock
        self._retry: Consumer | None = None  # the consumer a failed start is tried again for
        self._retry_at = 0.0
        self._warned = False

    def start(self, consumer: Consumer) -> bool:
        """Make the topic where it does not exist and read it from its end;
        whether nudges can now end this consumer's fetches. A failure is
        warned of (once) and tried again at a nudge RETRY_S later; meanwhile
        no nudges."""
        try:
            self.ensure([self.topic])
            assign_from_end(consumer, self.topic)
        except Exception as exc:  # KafkaException, RuntimeError: no nudges, as before
            if not self._warned:
                log.warning("no fetch nudges: %s is unavailable (%s); tried again every"
                            " %.0f s", self.topic, exc, RETRY_S)  # fmt: skip
                self._warned = True
            self.active = False
            self._retry, self._retry_at = consumer, self._clock() + RETRY_S
            return False
        if self._warned:
            log.info("fetch nudges through %s from now on", self.topic)
        self.active, self._retry = True, None
        return True

    def nudge(self) -> bool:
        """End the consumer's outstanding fetch (and every other instance's):
        whether a nudge was sent. Thread-safe, as producing is; the delivery
        is not waited for, and a full local queue skips it (the fetch then
        ends at fetch.wait.max.ms). Not polled here: the producer's
        callbacks stay on the thread that serves them."""
        if not self.active:
            if self._retry is None or self._clock() < self._retry_at:
                return False
            if not self.start(self._retry):
                return False
        return self._send()

    def _send(self) -> bool:
        try:
            self.producer.produce(topic=self.topic, value=b"")
        except (BufferError, KafkaException) as exc:
            log.warning("could not nudge %s: %s", self.topic, exc)
            return False
        self.sent_total += 1
        return True

    def wake(self) -> None:
        """A nudge from another thread (a topic watch's, on an announcement):
        only when started, since a start is made on the consumer's thread."""
        if self.active:
            self._send()

    def is_nudge(self, m: Message) -> bool:
        return m.topic() == self.topic

    def drop(self, msgs: Iterable[Message]) -> list[Message]:
        """What was consumed, without the nudges."""
        return [m for m in msgs if m.topic() != self.topic]
