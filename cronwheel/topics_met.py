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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


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
