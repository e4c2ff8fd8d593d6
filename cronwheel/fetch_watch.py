"""Partitions a hand-assigned consumer holds, has not paused, and does not
read although the broker has records for them: librdkafka sometimes stops
fetching for good after a broker restart, with no error event and no log
line (docs/reliability.md, "A dispatcher that stopped reading"; reported
upstream for consumers that assign(): confluentinc/librdkafka#5153,
fede1024/rust-rdkafka#597). Nothing inside the client can be asked about it,
so the service compares its own position with the broker's end offsets and,
when a partition stands still behind records that were there at the last
look, replaces its consumer (cronwheel.consumer.ConsumerService).

What holds:

- Only partitions the service reads are judged: assigned, not paused (for a
  class, a quota or a full executor) and not dozing (cronwheel.dozing); and
  only those whose position the service knows (`position` gives None for one
  with nothing committed, assigned at offset 0, and not read yet: nothing to
  compare; librdkafka's own position is unknown until its first record, even
  after a reset where retention moved the log's start). A position is one
  the consumer can be at: one assigned at a commit that the log's start
  has since passed is given as the start, where librdkafka reads from
  (the dispatcher's `_consumed_to`; docs/reliability.md).
- A partition is stuck when, at two looks `every_s` apart, its position was
  the same and the broker's end was past it at the first look: records that
  were there the whole interval were not read. A backlog being worked moves
  the position; an idle partition has nothing past it.
- A look more than twice `every_s` after the last one starts over: the loop
  was away (the database down, a long batch) and did not read, rightly.
- The broker's end offsets come from another client (an admin, one
  ListOffsets request per broker); when it cannot be asked, nothing is
  judged.

The same happens to producers (`DeliveryWatch`): after a broker restart a
relay's and a dispatcher's producers held records that were neither
acknowledged nor failed for minutes, while the broker answered new clients
at once (docs/reliability.md, "Producers that stopped delivering"). What
holds there:

- A producer is stuck when, at two looks `every_s` apart, it held records
  (queued or awaiting an answer) at both, not one delivery report
  (acknowledged or failed) came between them, and a new client of the
  process got an answer from the broker at both. A broker that is down
  answers nobody; a busy producer reports deliveries; a producer waiting out
  its reconnect backoff (at most 2 s, kafka.LOST_LINK_MS) after the broker
  came back has done so within the `every_s` (15 s) the broker answered
  throughout.
- A look more than twice `every_s` after the last starts over, as above.

The broker's end offsets are asked off the consumer's loop (`EndsAsked`):
the positions are taken on the loop when a look is due, the ends asked on a
thread of the ask's own, and the look made on the loop's first pass after
the answer. Asked on the loop, the ask held it a round trip per 500
partitions every look, and the first look of a process also made the
asking client, a connection and its SASL handshake: a record that came
meanwhile waited (docs/dispatcher.md, "The fetch watch's ask, off the
loop"). The asking client is not the consumer, so
confluent-kafka does not serialise the two (docs/dispatcher.md). An end
asked a moment after the positions were taken can only be further on; a
partition is still judged stuck only when its position stood still a
whole look later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("cronwheel.fetch_watch")

Where = tuple[str, int]


class FetchWatch:
    def __init__(self, every_s: float = 15.0, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._next = clock() + every_s
        self._last = 0.0  # when the last look was
        self._seen: dict[Where, tuple[int, int]] = {}  # (position, broker end) at the last look
        self.stuck_total = 0  # partitions found stuck
        self.looks = 0

    def due(self) -> bool:
        return self._clock() >= self._next

    def look(
        self,
        watched: Iterable[Where],
        position: Callable[[Where], int | None],
        ends: Callable[[list[Where]], dict[Where, int | None] | None],
    ) -> list[Where]:
        """Once due: the partitions of `watched` that stood still behind
        records since the last look. `ends(keys)` asks the broker's end
        offsets (cronwheel.kafka.end_offsets: None where it could not)."""
        now = self._clock()
        self._next = now + self.every_s
        fresh = now - self._last <= 2 * self.every_s
        self._last = now
        self.looks += 1
        known = {key: at for key in watched if (at := position(key)) is not None and at >= 0}
        got = ends(sorted(known)) if known else {}
        if got is None:
            self._seen = {}
            return []
        seen = {key: (known[key], end) for key, end in got.items() if end is not None}
        stuck = [
            key
            for key, (at, _end) in seen.items()
            if fresh and (before := self._seen.get(key)) and before[0] == at and before[1] > at
        ]
        self._seen = seen
        self.stuck_total += len(stuck)
        return stuck

    def forget(self) -> None:
        """The consumer was replaced: positions start over."""
        self._seen = {}


class EndsAsked:
    """A look's end offsets, asked on a thread of their own through `ends`
    (a RenewingAsker's `end_offsets`, whose client no other thread uses but
    a diagnosis): `ask` starts one, `answered` gives it once it came."""

    def __init__(self, ends: Callable[[list[Where]], dict[Where, int | None] | None]):
        self._ends = ends
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fetch-watch")
        self._asked: Future | None = None
        self._at: dict[Where, int] = {}

    @property
    def asking(self) -> bool:
        return self._asked is not None

    def ask(self, at: dict[Where, int]) -> None:
        """Ask the ends of the partitions of `at`, their positions now."""
        assert self._asked is None, "one ask at a time"
        self._at = at
        self._asked = self._pool.submit(self._ends, sorted(at))

    def answered(self) -> tuple[dict[Where, int], dict[Where, int | None] | None] | None:
        """(the positions asked with, their ends; None where the ask
        failed) once the answer came; None while it has not."""
        if self._asked is None or not self._asked.done():
            return None
        asked, self._asked = self._asked, None
        try:
            ends = asked.result()
        except Exception as exc:  # a client that could not be made: nothing is judged
            log.warning("end offsets for the fetch watch not asked: %s", exc)
            ends = None
        return self._at, ends

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class DeliveryWatch:
    def __init__(self, every_s: float = 15.0, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._next = clock() + every_s
        self._last = 0.0
        # At the last look: (records held, reports) per producer watched, and
        # whether the broker answered.
        self._seen: tuple[dict[int, tuple[int, int]], bool] | None = None
        self.stuck_total = 0

    def due(self) -> bool:
        return self._clock() >= self._next

    def look(self, held: int, reports: int, broker_answers: Callable[[], bool]) -> bool:
        """Once due: whether the producer is stuck. `held`: records it holds
        (len(producer)); `reports`: delivery reports it has given so far (a
        count that only grows); `broker_answers()` asks the broker through a
        new client (asked only while records wait with no report)."""
        return self.look_each({0: (held, reports)}, broker_answers)

    def look_each(
        self, producers: dict[int, tuple[int, int]], broker_answers: Callable[[], bool]
    ) -> bool:
        """`look` for several producers at once (cronwheel.producer_shards),
        each (records held, its reports so far) under a key that names that
        very producer: one stuck while the others deliver is stuck (a sum
        would hide it behind their reports). A key not seen at the last look
        (a producer made since) starts afresh."""
        now = self._clock()
        self._next = now + self.every_s
        fresh = now - self._last <= 2 * self.every_s
        self._last = now
        before, answered_before = self._seen if fresh and self._seen else ({}, False)

        def still(key: int, reports: int) -> bool:
            return key in before and before[key][1] == reports

        waiting = any(
            held > 0 and (key not in before or still(key, reports))
            for key, (held, reports) in producers.items()
        )
        answered = waiting and broker_answers()
        self._seen = (dict(producers), answered)
        stuck = (
            answered_before
            and answered
            and any(
                held > 0 and still(key, reports) and before[key][0] > 0
                for key, (held, reports) in producers.items()
            )
        )
        if not stuck:
            return False
        self._seen = None  # judged: the next verdict needs two new looks
        self.stuck_total += 1
        return True
