"""Idle run-topic partitions are left out of the dispatcher's fetches
("dozing"), and the relay wakes a tenant's run topic before its records come.

Why: librdkafka has no incremental fetch sessions (KIP-227), so every fetch
request names every partition its consumer has assigned, twice a second at
`fetch.wait.max.ms` 500, and the broker answers for each of them. At 3,000
tenants the dispatcher's fetches named 6,000 partitions, and most of its CPU
and much of the broker's went there while nothing was due
(docs/dispatcher.md, "Idle tenants"). A dozing partition is paused (so
named in no fetch) and resumed when it wakes, from where it was consumed to.
It is not unassigned: librdkafka walks every partition of every topic its
client knows on each wake-up of its fetcher, assigned or not, so leaving the
assignment saves no walk, and assigning a partition again wakes the fetcher
once for it, a walk over all of them per partition woken (at the top of a
minute at 3,000 tenants, 3,000 walks of 3,000; docs/dispatcher.md, "Paused,
not unassigned"). A resumed partition does not wake the fetcher: the nudge
below does, once per batch of wakes.

What holds:

- A partition dozes only when it is caught up (its high watermark, as the
  last fetch brought it, is the next offset to read), has had no record for
  `after_ms` and no wake for `wake_holds_ms`; what was finished of it is
  committed before it is paused.
- The relay wakes a run topic when it reads an outbox row for it after
  `every_ms` without one: a record keyed by the topic's name on `<p>.wake`
  (one partition), which every dispatcher instance reads whole, from its end,
  and never pauses. A run fired ahead of its instant is read up to a second
  before it is published, so its partition is fetched again before its record
  exists.
- A wake announces every row the relay reads for that topic in the next
  `every_ms`, each published by its instant, at most the fire-ahead lead
  later: so a wake holds its partition awake for `wake_holds_ms`, which must
  exceed the relay's `every_ms` plus the lead, while a record read holds it
  only `after_ms`. A relay that publishes a row later than that after its
  topic's last wake (`late_ms`: its releaser behind a lease renewal, a class
  barrier's flush, a full local queue) wakes the topic again just before the
  record (best effort, as every wake), so a late record is woken again
  rather than left to the sweep. A partition woken
  whose record has not been read since is held longer (`unread_holds_ms`).
  A tenant firing once a minute is thus out of the fetches a few seconds
  after its wake, not ten seconds after its run (docs/dispatcher.md, "A
  minute's firing at 3,000 tenants"): every fetch names every awake
  partition, so at the top of a minute, when thousands of such tenants fire,
  the fetches shrink as their runs go through.
- A wake says in how many milliseconds its row is published (its value;
  empty: now), so a dozing partition is resumed `resume_ahead_ms` before
  then, not as the wake is read: a run fired ahead is read up to a second
  before its instant, and every fetch in that second named the partition
  (at the top of a minute at 3,000 tenants, about half the partitions the
  dispatcher's fetches named; docs/dispatcher.md, "Resumed just before").
  The delay is relative, so the relay's and the dispatcher's clocks need
  not agree; a row due sooner than its topic's last wake said gets a wake
  of its own. The hold counts from the wake as before, and a partition
  resumed late is held awake until its record is read, as any woken one.
- A partition resumed while a fetch is outstanding is first fetched when
  that fetch returns: after up to `fetch.wait.max.ms` (500 ms) if nothing else
  comes. So the dispatcher, having resumed what a wake names, writes a nudge
  (an empty key) to the wake topic: it arrives after the resume was made,
  ends the outstanding fetch, and the next one names the partition. A run due
  at once then waits milliseconds, not half a second (bench_dozing.py
  --latency: p50 514 ms when the relay sent a second wake instead, measured
  and replaced).
- Nothing depends on a wake arriving. Every `sweep_ms` the dispatcher asks for
  the end offsets of its dozing partitions (requests of up to 500, one after
  another, on a thread of its own: with thousands dozing the answer takes
  tens of milliseconds, and a broker that does not answer, the request's
  whole timeout; the loop reads on meanwhile) and wakes those that moved, counted in
  `cronwheel_dispatcher_missed_wakes_total`: a lost wake costs at most
  `sweep_ms` of lateness, never a run.
- The wake topic says which tenants are busy, so no tenant may read it
  (cronwheel/principals.py): the relay and the dispatcher write it, the
  dispatcher reads it.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer

from cronwheel.fetch_nudge import assign_from_end

log = logging.getLogger("cronwheel.dozing")

Where = tuple[str, int]
# The broker's end offset of each partition asked
# (kafka.RenewingAsker.end_offsets), None for one not answered; None
# altogether from a caller that could not ask.
Ends = Callable[[list[Where]], "dict[Where, int | None] | None"]

NUDGE = b""  # the key of a dispatcher's nudge: it names no topic
NEVER = float("-inf")  # no wake yet


def wake_topic_of(run_topic: str) -> str | None:
    """`<p>.wake` for a run topic `<p>.runs.<tenant>`; None for another topic.
    The relay publishes every prefix's rows, so it learns the prefix here."""
    prefix, sep, tenant = run_topic.rpartition(".runs.")
    if not sep or not prefix or not tenant or "." in tenant:
        return None
    return f"{prefix}.wake"


def wake_in_ms(value: bytes | None, waited_ms: int = 0) -> int | None:
    """In how many ms a wake's row comes (Waker._send), less `waited_ms` (how
    long the wake took to arrive, by its timestamp: a loaded broker's delay
    does not make the resume late); None for now, and for a value not
    understood (a partition resumed at once is never late)."""
    try:
        in_ms = int(value) if value else None
    except ValueError:
        return None
    if in_ms is None:
        return None
    in_ms -= max(waited_ms, 0)
    return in_ms if in_ms > 0 else None


class Waker:
    """The relay's side: wake a run topic when a row for it is read, and again
    when its record is published later than a wake can be counted on to hold."""

    def __init__(
        self,
        producer: Producer,
        *,
        every_ms: int,
        produce: Callable[..., None],
        late_ms: int | None = None,
    ):
        """`produce(producer, **record)`: how the relay produces (it waits out
        a full local queue, and makes the wake topic when it is missing).
        `late_ms`: a record published this long after its topic's last wake
        gets a wake of its own first (`published`); None: never. The relay
        passes `every_ms` plus how far ahead it reads a row: the longest a
        row read under a wake waits for its instant, so only a late relay
        (its releaser behind a lease renewal, a class barrier's flush, a
        full local queue) sends one."""
        self.producer = producer
        self.every_s = every_ms / 1000
        self.late_s = None if late_ms is None else late_ms / 1000
        self._produce = produce
        # topic -> when its last wake was sent, and when it said the row comes
        self._woken: dict[str, tuple[float, float]] = {}
        # `read` runs on the relay's loop, `published` on whichever thread
        # releases the row.
        self._lock = threading.Lock()
        self.sent_total = 0
        self.late_total = 0  # wakes sent at publishing: a row released late

    def read(self, topic: str, in_ms: int | None = None) -> None:
        """A row for `topic` was read, to be published in `in_ms` (None or
        not above 0: now). Woken at most once per `every_ms`, but again for
        a row due sooner than the last wake said (the dispatcher resumes the
        partition just before what the wake said, Dozing.woken)."""
        now = time.monotonic()
        at = now if in_ms is None or in_ms <= 0 else now + in_ms / 1000
        self._wake_if(topic, now, self.every_s, at)

    def published(self, topic: str) -> bool:
        """A record for `topic` is about to be produced: if its topic's last
        wake is older than `late_ms`, the dispatcher may have let the
        partition doze again, so it is woken first (the wake lands before the
        record, which the dispatcher reads from where the partition dozed).
        Whether it was."""
        if self.late_s is None:
            return False
        now = time.monotonic()
        if not self._wake_if(topic, now, self.late_s, None):
            return False
        self.late_total += 1
        return True

    def _wake_if(self, topic: str, now: float, than_s: float, at: float | None) -> bool:
        """Woken when its last wake is `than_s` old or more, or (a row read,
        `at` when it is published) said a later time than `at`. A wake's
        value: in how many ms its row comes, empty for now."""
        if wake_topic_of(topic) is None:
            return False
        with self._lock:
            last = self._woken.get(topic)
            if last is not None and now - last[0] < than_s and (at is None or at >= last[1]):
                return False
            self._woken[topic] = (now, now if at is None else at)
            if len(self._woken) > 100_000:  # forget topics quiet for a while
                cutoff = now - max(self.every_s, self.late_s or 0.0)
                self._woken = {t: w for t, w in self._woken.items() if w[0] >= cutoff}
        in_ms = 0 if at is None else round((at - now) * 1000)
        self._send(topic, in_ms)
        return True

    def _send(self, topic: str, in_ms: int) -> None:
        # Best effort: a wake that fails is the sweep's to make up for.
        wake = wake_topic_of(topic)
        value = str(in_ms).encode() if in_ms > 0 else b""
        try:
            self._produce(self.producer, topic=wake, key=topic.encode(), value=value)
        except Exception as exc:  # KafkaException, RuntimeError: the sweep makes up for it
            log.warning("could not wake %s: %s", topic, exc)
            return
        self.sent_total += 1


class Dozing:
    """The dispatcher's side: which assigned partitions doze, and waking them."""

    def __init__(
        self,
        wake_topic: str,
        *,
        after_ms: int,
        sweep_ms: int,
        wake_holds_ms: int | None = None,
        unread_holds_ms: int = 10_000,
        check_ms: int = 250,
        asker: Executor | None = None,
        resume_ahead_ms: int | None = None,
    ):
        """`wake_holds_ms`: how long a wake keeps its partition awake once a
        record was read after it; by default `after_ms` (a wake then counts as
        a record read). `unread_holds_ms`: how long while none was.
        `resume_ahead_ms`: a wake whose row comes later resumes its dozing
        partition this long before (`due`); None: at once."""
        self.wake_topic = wake_topic
        self.after_s = after_ms / 1000
        self.wake_holds_s = (after_ms if wake_holds_ms is None else wake_holds_ms) / 1000
        self.unread_holds_s = max(unread_holds_ms / 1000, self.wake_holds_s)
        self.sweep_s = sweep_ms / 1000
        self.check_s = check_ms / 1000
        self.resume_ahead_s = None if resume_ahead_ms is None else resume_ahead_ms / 1000
        # Dozing partitions woken for rows that come later: when each resumes,
        # and the same as a heap (entries no longer in the dict are stale).
        self._resume_at: dict[Where, float] = {}
        self._resume_heap: list[tuple[float, Where]] = []
        self.dozing: set[Where] = set()
        self._last: dict[Where, float] = {}  # a record read (or assigned), per partition
        self._woke: dict[Where, float] = {}  # the last wake, per partition
        self._by_topic: dict[str, set[Where]] = {}
        # Woken and not read since (or swept awake, or paused meanwhile): the
        # record the wake announced may be on the broker while the watermark
        # the last fetch brought is older (a partition resumed is not
        # fetched at once; a paused one not at all), so "caught up" is asked
        # of the broker before such a partition dozes again.
        # Each such partition, and when it last became one.
        self.unread: dict[Where, float] = {}
        self._next_check = 0.0
        self._next_sweep = time.monotonic() + self.sweep_s
        # Broker asks run on a thread of their own (`_ask`), one of each kind
        # out at a time; `asker`: an executor to run them on instead.
        self._asker: Executor | None = asker
        self._unsure_ask: _Ask | None = None
        self._sweep_ask: _Ask | None = None
        self.missed_total = 0  # wakes the sweep made up for

    def start(self, consumer: Consumer, timeout_s: float = 10.0) -> None:
        """Read the wake topic from its end as it is now: what came before this
        instance's start is covered by its partitions starting awake. The end
        is asked of the broker here, not left to librdkafka (OFFSET_END), which
        resolves it only when it first fetches the partition: on a busy
        machine or a topic just made that can be after a wake was written,
        and the wake would be skipped (to the sweep's cost, `sweep_ms`)."""
        assign_from_end(consumer, self.wake_topic, timeout_s)

    def is_wake(self, topic: str) -> bool:
        return topic == self.wake_topic

    # -- the assignment ---------------------------------------------------------

    def assigned(self, keys: Iterable[Where]) -> None:
        """Held as if woken (`wake_holds_ms`): a wake read before the lease
        came here names a partition this instance did not have, and the rows
        it announced are published within that hold."""
        now = time.monotonic()
        for key in keys:
            self._last[key] = now
            self._woke[key] = now
            self._by_topic.setdefault(key[0], set()).add(key)

    def forget(self, key: Where) -> None:
        self._last.pop(key, None)
        self._woke.pop(key, None)
        self._stop_dozing(key)
        self.unread.pop(key, None)
        same = self._by_topic.get(key[0])
        if same is not None:
            same.discard(key)
            if not same:
                del self._by_topic[key[0]]

    # -- activity ---------------------------------------------------------------

    def read(self, key: Where) -> None:
        self._last[key] = time.monotonic()
        self.unread.pop(key, None)

    def woken(self, topic: str, in_ms: int | None = None) -> list[Where]:
        """A wake for `topic`, its row published in `in_ms` (None: now): its
        partitions are held awake (`wake_holds_ms`, `unread_holds_ms` until
        a record is read); returns those that dozed, to be resumed now. One
        whose row comes later than `resume_ahead_ms` from now stays paused
        until then (`due`), or until a wake says sooner."""
        now = time.monotonic()
        later = None
        if in_ms is not None and self.resume_ahead_s is not None:
            at = now + in_ms / 1000 - self.resume_ahead_s
            later = at if at > now else None
        back = []
        for key in self._by_topic.get(topic, ()):
            self._woke[key] = now
            self._unsure(key, now)
            if key not in self.dozing:
                continue
            if later is None:
                self._stop_dozing(key)
                back.append(key)
            elif later < self._resume_at.get(key, float("inf")):
                self._resume_at[key] = later
                heapq.heappush(self._resume_heap, (later, key))
        return back

    def due(self) -> list[Where]:
        """The dozing partitions whose wake's rows come within
        `resume_ahead_ms`: to be resumed now, held as woken now while no
        record is read (the row may have been read far ahead)."""
        now = time.monotonic()
        heap, out = self._resume_heap, []
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            if self._resume_at.get(key) != at:
                continue  # resumed sooner, or forgotten
            # Still dozing: whatever ended its doze dropped its resume (_stop_dozing).
            self._stop_dozing(key)
            self._unsure(key, now)
            self._woke[key] = max(
                self._woke.get(key, NEVER), now - self.unread_holds_s + self.wake_holds_s
            )
            out.append(key)
        return out

    def _stop_dozing(self, key: Where) -> None:
        """Out of `dozing`, and so no resume waits for it: every way a
        partition stops dozing comes through here."""
        self.dozing.discard(key)
        self._resume_at.pop(key, None)

    @property
    def waiting_to_resume(self) -> int:
        """Dozing partitions woken for rows that come later (`due`)."""
        return len(self._resume_at)

    def next_due_s(self) -> float | None:
        """Seconds until the first resume `due` has waiting, None for none."""
        heap = self._resume_heap
        while heap and self._resume_at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale
        return max(0.0, heap[0][0] - time.monotonic()) if heap else None

    def to_doze(
        self,
        caught_up: Callable[[Where], bool],
        busy: Callable[[Where], bool],
        ends: Ends | None = None,
        position: Callable[[Where], int | None] = lambda _key: None,
    ) -> list[Where]:
        """At most once per `check_ms`: the partitions to doze now (no record
        for `after_ms`, no wake for `wake_holds_ms`, caught up, and not
        paused or held for another reason).
        One woken and not read since is caught up only once the broker's end
        offset (`ends`, asked off the caller's thread) was found not past
        `position`; until the answer comes, or with no `ends`, it stays
        awake."""
        now = time.monotonic()
        if now < self._next_check:
            return []
        self._next_check = now + self.check_s
        quiet = now - self.after_s
        unwoken = {False: now - self.wake_holds_s, True: now - self.unread_holds_s}
        out = []
        for key, last in self._last.items():
            if (
                key in self.dozing
                or last > quiet
                or self._woke.get(key, NEVER) > unwoken[key in self.unread]
            ):
                continue
            if busy(key):
                # Paused, so not fetched: when it resumes, what the last fetch
                # said of it is stale, and the broker is asked before it dozes.
                self._unsure(key, now)
            elif caught_up(key):
                out.append(key)
        unsure = [key for key in out if key in self.unread]
        if unsure:
            for key in self._nothing_left(unsure, ends, position, now):
                del self.unread[key]
            out = [key for key in out if key not in self.unread]
        self.dozing.update(out)
        return out

    def _nothing_left(
        self,
        unsure: list[Where],
        ends: Ends | None,
        position: Callable[[Where], int | None],
        now: float,
    ) -> set[Where]:
        """Of `unsure`, those the broker has answered have nothing left to
        read. One ask at a time: asked now if none is out; those it says
        have records are held `after_ms` more, and those it did not name
        (or could not answer) stay awake and are asked again."""
        if self._unsure_ask is None and ends is not None:
            self._unsure_ask = self._ask(unsure, ends, position)
        ask = self._unsure_ask
        if ask is None or not ask.future.done():
            return set()
        self._unsure_ask = None
        past = self._answer(ask)
        if past is None:
            return set()
        # An answer asked before the partition was last woken, paused or swept
        # is not about what may have come since: those are asked again.
        still = {key for key in ask.at.keys() & set(unsure) if self.unread[key] <= ask.asked_at}
        for key in still & past:
            self._last[key] = now  # awake: its record is on the way
        return still - past

    def sweep(self, ends: Ends, position: Callable[[Where], int | None]) -> list[Where]:
        """Every `sweep_ms`: the dozing partitions whose end offset is past
        what was read (a wake lost, or never sent); they wake. Asked off the
        caller's thread: returned by the first call after the answer came."""
        now = time.monotonic()
        ask = self._sweep_ask
        if ask is None:
            if now < self._next_sweep or not self.dozing:
                return []
            self._next_sweep = now + self.sweep_s
            ask = self._sweep_ask = self._ask(list(self.dozing), ends, position)
        if not ask.future.done():
            return []
        self._sweep_ask = None
        # Still dozing where it dozed when asked: one woken since (and perhaps
        # dozing again, further on) is not the answer's.
        moved = [
            key
            for key in self._answer(ask) or ()
            if key in self.dozing and position(key) == ask.at[key]
        ]
        for key in moved:
            self._stop_dozing(key)
            # Held as if woken, its records not read yet: resumed, it is
            # not fetched at once, and its watermark is stale until it is.
            self._last[key] = self._woke[key] = now
            self._unsure(key, now)
        self.missed_total += len(moved)
        return moved

    def close(self) -> None:
        """Drops what is being asked (a service run again asks anew)."""
        if self._asker is not None:
            self._asker.shutdown(wait=False, cancel_futures=True)
            self._asker = None
        self._unsure_ask = self._sweep_ask = None

    # -- asking the broker --------------------------------------------------------

    def _unsure(self, key: Where, now: float) -> None:
        self.unread[key] = now

    def _ask(self, keys: list[Where], ends: Ends, position: Callable[[Where], int | None]) -> _Ask:
        """Which of `keys` have records past where they were read (`position`,
        read now, on the caller's thread), asked on the asker's thread: a
        ListOffsets can take its whole timeout, and the dispatcher's loop
        must not wait for it."""
        at = {key: position(key) for key in keys}
        if self._asker is None:
            self._asker = ThreadPoolExecutor(1, thread_name_prefix="dozing-ask")
        future = self._asker.submit(self._ends_past, ends, keys, at.get)
        return _Ask(future, at, time.monotonic())

    @staticmethod
    def _answer(ask: _Ask) -> set[Where] | None:
        try:
            past = ask.future.result()
        except Exception as exc:  # an error of the client: asked again, awake meanwhile
            log.warning("end offsets of %d partitions not asked: %s", len(ask.at), exc)
            return None
        return None if past is None else set(past)

    @staticmethod
    def _ends_past(
        ends: Ends, keys: list[Where], position: Callable[[Where], int | None]
    ) -> list[Where] | None:
        """Those of `keys` whose end offset on the broker is past `position`;
        None if it cannot be asked."""
        got = ends(keys)
        if got is None:
            return None
        past = []
        for key, end in got.items():
            at = position(key)  # None or < 0: not known, so from the start
            if end is None or end > max(at or 0, 0):  # unknown: fetch it again rather than guess
                past.append(key)
        return past


@dataclass(frozen=True)
class _Ask:
    """A question to the broker on the asker's thread, and where each
    partition asked about was read to when it was asked."""

    future: Future
    at: dict[Where, int | None]
    asked_at: float  # time.monotonic() when asked
