"""When a producer has met enough quiet topics to be worth a fresh one.

librdkafka's broker thread walks every partition its producer has met each
time it wakes, about once per record at the relay's linger of 1 ms, whether
the partition has records or not, and a producer forgets none while it
lives. A relay that has published once to each of 3,000 tenants' run topics
spends 41% of a core on 1,000 records/s to ten of them, against 11% for a
producer that met only those ten (bench/bench_producer_topics.py;
docs/architecture.md). So the relay's cost would grow with tenants that fire
once a day. `TopicsMet` counts what the producer met and what it used since
the last look, every `every_s`; a producer that has met at least
`at_least` topics, at most half of them used since the last look, is worth
replacing: the new one meets only the topics that are in use.
`RenewingProducer` is that producer, replaced in place: whoever holds it (a
placement, the relay's waker, a service's dead letters and topic watch) goes
on with the new one.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer

from cronwheel import metrics
from cronwheel.config import ProducerRenewal
from cronwheel.producer_shards import produce_all


@dataclass(frozen=True)
class Verdict:
    met: int  # topics the producer has met since it was made
    used: int  # of them, used since the last look
    renew: bool


class TopicsMet:
    def __init__(
        self, every_s: float, at_least: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self.at_least = at_least
        self._clock = clock
        self._met: set[str] = set()
        self._used: set[str] = set()
        self._next = clock() + every_s

    def used(self, topic: str) -> None:
        """The producer was given a record for `topic`."""
        self._used.add(topic)

    def due(self) -> bool:
        return self._clock() >= self._next

    def look(self) -> Verdict:
        """Whether to renew the producer; the count of what was used starts
        again either way. A caller that renews says so (`renewed`)."""
        self._met |= self._used
        verdict = Verdict(
            len(self._met),
            len(self._used),
            len(self._met) >= self.at_least and 2 * len(self._used) <= len(self._met),
        )
        self._used = set()
        self._next = self._clock() + self.every_s
        return verdict

    def renewed(self) -> None:
        """A new producer, which has met nothing yet."""
        self._met = set()


def topics_met(renewal: ProducerRenewal | None) -> TopicsMet | None:
    """What a RenewingProducer counts with the settings given (None: their
    defaults); None when renewal is off."""
    renewal = renewal or ProducerRenewal()
    return TopicsMet(renewal.every_s, renewal.at_least_topics) if renewal.every_s else None


class RenewingProducer:
    """A producer (`make()`) that counts the topics it is given records for
    in `topics_met` and is made anew, in place, by `renew_if_quiet`. Every
    other call goes to the producer of the moment."""

    def __init__(self, make: Callable[[], Producer], topics_met: TopicsMet | None = None):
        self._make = make
        self._producer = make()
        self.topics_met = topics_met
        self.renewed_total = 0

    def produce(self, *args, **kwargs) -> None:
        if self.topics_met is not None:
            self.topics_met.used(kwargs["topic"] if "topic" in kwargs else args[0])
        self._producer.produce(*args, **kwargs)

    def produce_all(self, records: list[dict]) -> None:
        """producer_shards.produce_all through the producer of the moment,
        each topic counted once."""
        if self.topics_met is not None:
            for topic in {record["topic"] for record in records}:
                self.topics_met.used(topic)
        produce_all(self._producer, records)

    def __len__(self) -> int:
        return len(self._producer)

    def __getattr__(self, name: str):
        return getattr(self._producer, name)

    def renew_if_quiet(
        self,
        service: str,
        log: logging.Logger,
        flush_s: float = 10,
        producing: contextlib.AbstractContextManager | None = None,
    ) -> bool:
        """At each look (`topics_met.due()`), a new producer if the look says
        so. What the old one holds is delivered first: its delivery reports
        come inside this flush, on the caller's thread, as at any flush. One
        that cannot deliver it all in `flush_s` is kept, and the next look
        asks again. `producing`: held by whoever else produces (another
        thread): the flush waits outside it, and what that thread produced
        meanwhile is flushed again under it (a few milliseconds of its
        records in flight, not the whole backlog) before the producer is
        replaced."""
        if self.topics_met is None or not self.topics_met.due():
            return False
        verdict = self.topics_met.look()
        if not verdict.renew:
            return False
        if not self._delivered_all(service, log, flush_s):
            return False
        with producing or contextlib.nullcontext():
            if not self._delivered_all(service, log, flush_s):
                return False
            self._producer = self._make()
        self.topics_met.renewed()
        self.renewed_total += 1
        metrics.PRODUCERS_RENEWED.labels(service).inc()
        log.info(
            "%s: a new producer; the last had met %d topics, %d of them used in the last %.0f s",
            service, verdict.met, verdict.used, self.topics_met.every_s,
        )  # fmt: skip
        return True

    def _delivered_all(self, service: str, log: logging.Logger, flush_s: float) -> bool:
        if left := self._producer.flush(flush_s):
            log.warning("%s: kept its producer: %d records not delivered in %.0f s",
                        service, left, flush_s)  # fmt: skip
            return False
        return True
