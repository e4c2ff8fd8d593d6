"""When a run-topic partition dozes (cronwheel.dozing.Dozing.to_doze): a record
read holds it `after_ms`, a wake `wake_holds_ms` once a record was read after
it, and `unread_holds_ms` while none was. When the relay wakes a run topic
(cronwheel.dozing.Waker): on reading a row, at most once per `every_ms`; on
publishing one, only if the topic's last wake is older than `late_ms`. The
clock is cronwheel.dozing's time.monotonic, set by the test; the wakes are
what the Waker's `produce` was given."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future

import pytest

from cronwheel import dozing
from cronwheel.dozing import Dozing, Waker

TOPIC = "p.runs.t1"
KEY = (TOPIC, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(dozing.time, "monotonic", c)
    return c


class Asker(Executor):
    """Runs the broker asks when the test says (`answer`), not on a thread:
    `inline` ones at once, as if the broker answered before the next check."""

    def __init__(self, inline: bool = True) -> None:
        self.inline = inline
        self.waiting: list[tuple[Future, Callable, tuple]] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        f: Future = Future()
        self.waiting.append((f, fn, args))
        if self.inline:
            self.answer()
        return f

    def answer(self) -> None:
        for f, fn, args in self.waiting:
            f.set_result(fn(*args))
        self.waiting = []


def _dozing(clock: Clock, asker: Asker | None = None, **kwargs) -> Dozing:
    settings = {"after_ms": 1_000, "sweep_ms": 600_000, "wake_holds_ms": 3_000} | kwargs
    d = Dozing("p.wake", check_ms=0, asker=asker or Asker(), **settings)
    d.assigned([KEY])
    return d


def _ends(past: list | None):
    """The broker's end offsets (a ListOffsets request stands here): past the
    position (0) for the partitions in `past`, at it for the others."""
    return lambda keys: {key: (5 if key in (past or []) else 0) for key in keys}


def _doze_at(
    d: Dozing, clock: Clock, at: float, ends_past: list | None = None, busy: bool = False
) -> list:
    """What dozes at `at` seconds after the start, caught up; the broker's
    answer for partitions woken and not read since is `ends_past`."""
    clock.now = 1000.0 + at
    return d.to_doze(lambda _k: True, lambda _k: busy, ends=_ends(ends_past))


def test_just_assigned__held_as_if_woken(clock):
    """A lease handed over: a wake the previous owner read is not this
    instance's, so the assignment holds the partition as a wake would."""
    d = _dozing(clock)
    assert _doze_at(d, clock, 2.9) == []
    assert _doze_at(d, clock, 3.1) == [KEY]


def test_record_read_without_a_wake__dozes_after_after_ms(clock):
    d = _dozing(clock)
    clock.now += 3.5
    d.read(KEY)
    assert _doze_at(d, clock, 4.4) == []
    assert _doze_at(d, clock, 4.6) == [KEY]
    assert KEY in d.dozing


def test_woken_then_read__the_wake_holds_it_wake_holds_ms_not_the_read_after_ms(clock):
    d = _dozing(clock)
    clock.now = 1000.0 + 10
    d.woken(TOPIC)  # at 10 s
    clock.now = 1000.0 + 11
    d.read(KEY)  # its record, at 11 s
    assert _doze_at(d, clock, 12.5) == []  # read 1.5 s ago, but woken only 2.5 s ago
    assert _doze_at(d, clock, 13.1) == [KEY]


def test_read_lately__held_though_the_wake_is_old(clock):
    d = _dozing(clock)
    d.woken(TOPIC)
    clock.now = 1000.0 + 3.5
    d.read(KEY)
    assert _doze_at(d, clock, 4.0) == []
    assert _doze_at(d, clock, 4.6) == [KEY]


def test_woken_never_read__held_unread_holds_ms__then_the_broker_asked(clock):
    d = _dozing(clock)
    d.woken(TOPIC)
    assert _doze_at(d, clock, 5.0) == []  # past after_ms and wake_holds_ms, not read since
    assert _doze_at(d, clock, 9.9) == []
    # Past 10 s: its end offset is past what was read, so it stays awake ...
    assert _doze_at(d, clock, 10.1, ends_past=[KEY]) == []
    assert KEY in d.unread
    # ... for after_ms; then the broker says nothing came, and it dozes.
    assert _doze_at(d, clock, 11.2, ends_past=[]) == [KEY]
    assert KEY not in d.unread


def test_woken_after_its_record_was_read__dozes_once_the_broker_says_nothing_came(clock):
    """A run due at once: its record can be read before the wake that
    announced it, which then finds nothing left to read."""
    d = _dozing(clock)
    d.read(KEY)
    clock.now += 0.1
    d.woken(TOPIC)
    assert _doze_at(d, clock, 10.0) == []
    assert _doze_at(d, clock, 10.2, ends_past=[]) == [KEY]
    assert KEY not in d.unread


def test_a_wake_for_a_dozing_partition__returned_to_be_assigned_and_held_again(clock):
    d = _dozing(clock)
    d.read(KEY)
    assert _doze_at(d, clock, 3.1) == [KEY]
    clock.now = 1000.0 + 30
    assert d.woken(TOPIC) == [KEY]
    assert KEY not in d.dozing
    clock.now = 1000.0 + 30.5
    d.read(KEY)
    assert _doze_at(d, clock, 32.0) == []
    assert _doze_at(d, clock, 33.1) == [KEY]


def _dozed(clock: Clock, **kwargs) -> Dozing:
    """Dozing since 3.1 s, resumed 250 ms before what a wake says (30 s now)."""
    clock.now = 1000.0
    d = _dozing(clock, resume_ahead_ms=250, **kwargs)
    d.read(KEY)
    assert _doze_at(d, clock, 3.1) == [KEY]
    clock.now = 1000.0 + 30
    return d


def test_a_wake_for_a_row_due_later__resumed_just_before_it_not_at_once(clock):
    """A run fired ahead is read up to a second before its instant: the
    fetches of that second need not name its partition."""
    d = _dozed(clock)
    assert d.woken(TOPIC, in_ms=1_000) == []
    assert KEY in d.dozing
    assert d.next_due_s() == pytest.approx(0.75) and d.waiting_to_resume == 1
    clock.now += 0.74
    assert d.due() == []
    clock.now += 0.02
    assert d.due() == [KEY]
    assert KEY not in d.dozing and d.next_due_s() is None and d.waiting_to_resume == 0
    assert d.due() == []  # once


def test_resumed_just_before__held_until_its_record_is_read_then_as_the_wake_held(clock):
    d = _dozed(clock)
    d.woken(TOPIC, in_ms=1_000)  # at 30 s
    clock.now += 0.8
    assert d.due() == [KEY]  # at 30.8 s
    # Not read: held (the broker is asked before it dozes, as any woken one).
    assert _doze_at(d, clock, 34.0, ends_past=[KEY]) == []
    clock.now = 1000.0 + 34.5
    d.read(KEY)
    # Read: no record for after_ms, and the wake (at 30 s) older than wake_holds_ms.
    assert _doze_at(d, clock, 35.4) == []
    assert _doze_at(d, clock, 35.6) == [KEY]


def test_resumed_far_from_its_wake__held_wake_holds_ms_from_the_resume(clock):
    """A row read further ahead than the unread hold (a long fire-ahead lead)
    is not let doze as it resumes."""
    d = _dozed(clock)
    d.woken(TOPIC, in_ms=20_000)
    clock.now = 1000.0 + 49.8
    assert d.due() == [KEY]
    assert _doze_at(d, clock, 52.7, ends_past=[]) == []
    assert _doze_at(d, clock, 52.9, ends_past=[]) == [KEY]


def test_a_wake_saying_sooner__resumed_sooner_or_at_once(clock):
    d = _dozed(clock)
    d.woken(TOPIC, in_ms=1_000)
    d.woken(TOPIC, in_ms=500)
    assert d.next_due_s() == pytest.approx(0.25)
    d.woken(TOPIC, in_ms=2_000)  # later than already waiting: no change
    assert d.next_due_s() == pytest.approx(0.25)
    assert d.woken(TOPIC, in_ms=100) == [KEY]  # within resume_ahead_ms: at once
    assert d.next_due_s() is None
    clock.now += 1
    assert d.due() == []


def test_a_wake_without_a_time_or_no_resume_ahead__resumed_at_once(clock):
    d = _dozed(clock)
    assert d.woken(TOPIC) == [KEY]
    d = _dozing(clock)  # resume_ahead_ms None
    d.read(KEY)
    assert _doze_at(d, clock, 40.0) == [KEY]
    assert d.woken(TOPIC, in_ms=1_000) == [KEY]


def test_waiting_to_resume__swept_or_forgotten__not_resumed_again(clock):
    d = _dozed(clock)
    d.woken(TOPIC, in_ms=1_000)
    d.forget(KEY)
    clock.now += 1
    assert d.due() == [] and d.next_due_s() is None
    d = _dozed(clock, sweep_ms=100)
    d.woken(TOPIC, in_ms=5_000)
    clock.now += 0.2
    assert d.sweep(_ends([KEY]), lambda _k: 0) == [KEY]  # its record came early
    clock.now += 5
    assert d.due() == []


def test_wake_in_ms__a_wakes_value():
    assert dozing.wake_in_ms(b"750") == 750
    assert dozing.wake_in_ms(b"") is None
    assert dozing.wake_in_ms(None) is None
    assert dozing.wake_in_ms(b"0") is None
    assert dozing.wake_in_ms(b"-5") is None
    assert dozing.wake_in_ms(b"soon") is None
    # Less how long it took to arrive; a clock behind the relay's counts none.
    assert dozing.wake_in_ms(b"750", waited_ms=300) == 450
    assert dozing.wake_in_ms(b"750", waited_ms=-40) == 750
    assert dozing.wake_in_ms(b"750", waited_ms=800) is None


def test_paused_meanwhile__the_broker_asked_before_it_dozes(clock):
    """A partition paused (a class above it, its quota) is not fetched, so what
    the last fetch said of it is stale when it resumes."""
    d = _dozing(clock)
    d.read(KEY)
    assert _doze_at(d, clock, 5.0, busy=True) == []
    assert KEY in d.unread
    assert _doze_at(d, clock, 11.0, ends_past=[KEY]) == []  # its record is there: awake
    assert _doze_at(d, clock, 12.5, ends_past=[]) == [KEY]


def test_swept_awake__held_and_the_broker_asked_before_it_dozes_again(clock):
    """A partition the sweep found records in is assigned again and not
    fetched at once: its stale watermark must not let it doze unread."""
    d = _dozing(clock, sweep_ms=1_000)
    d.read(KEY)
    assert _doze_at(d, clock, 3.1) == [KEY]
    clock.now = 1000.0 + 20
    assert d.sweep(_ends([KEY]), lambda _k: 0) == [KEY]  # the broker: records there
    assert KEY in d.unread and KEY not in d.dozing
    assert _doze_at(d, clock, 25.0) == []
    assert _doze_at(d, clock, 30.1, ends_past=[]) == [KEY]


def test_the_broker_slow_to_answer__awake_until_it_does(clock):
    """The ask runs off the dispatcher's loop: until its answer comes, a
    partition woken and not read since stays awake, and one ask is out at
    a time."""
    asker = Asker(inline=False)
    d = _dozing(clock, asker)
    d.woken(TOPIC)
    assert _doze_at(d, clock, 10.1) == []  # asked
    assert _doze_at(d, clock, 12.0) == []  # not answered yet: awake, not asked again
    assert len(asker.waiting) == 1
    asker.answer()  # nothing left
    assert _doze_at(d, clock, 12.3) == [KEY]


def test_an_answer_asked_before_the_partition_was_paused__not_applied(clock):
    """An answer that sat unused while the partition was paused (a class, a
    quota) and woken again says nothing of what came meanwhile: it is asked
    again rather than put to sleep on the old answer."""
    asker = Asker(inline=False)
    d = _dozing(clock, asker)
    d.woken(TOPIC)
    assert _doze_at(d, clock, 10.1) == []  # asked
    asker.answer()  # nothing left, then
    assert _doze_at(d, clock, 10.2, busy=True) == []  # paused before the answer is used
    clock.now = 1000.0 + 11
    d.woken(TOPIC)  # records came while it was paused
    assert _doze_at(d, clock, 21.5) == []  # the old answer is not its: dropped
    assert _doze_at(d, clock, 21.6) == []  # asked again
    assert len(asker.waiting) == 1
    asker.answer()
    assert _doze_at(d, clock, 21.7) == [KEY]


def test_swept_while_it_was_woken_and_dozed_again__the_answer_is_not_its(clock):
    """A sweep's answer names where each partition was read to when asked: one
    woken (and read further) since then is not woken again by it."""
    asker = Asker(inline=False)
    d = _dozing(clock, asker, sweep_ms=1_000)
    d.read(KEY)
    assert _doze_at(d, clock, 3.1) == [KEY]
    clock.now = 1000.0 + 5
    where = {KEY: 0}
    assert d.sweep(_ends([KEY]), where.get) == []  # asked: the broker's end is past 0
    assert d.woken(TOPIC) == [KEY]  # meanwhile a wake; read to 5, and it dozes again
    d.read(KEY)
    assert _doze_at(d, clock, 8.1) == [KEY]
    where[KEY] = 5
    asker.answer()
    assert d.sweep(_ends([KEY]), where.get) == []
    assert KEY in d.dozing and d.missed_total == 0


# -- the relay's side ---------------------------------------------------------


def _waker(late_ms: int | None = 1_500) -> tuple[Waker, list[dict]]:
    sent: list[dict] = []
    w = Waker(None, every_ms=500, produce=lambda _p, **record: sent.append(record), late_ms=late_ms)
    return w, sent


def test_rows_read__one_wake_per_every_ms(clock):
    w, sent = _waker()
    w.read(TOPIC)
    clock.now += 0.4
    w.read(TOPIC)
    assert [r["key"] for r in sent] == [TOPIC.encode()]
    assert sent[0]["topic"] == "p.wake"
    clock.now += 0.2
    w.read(TOPIC)
    assert len(sent) == 2


def test_a_wake_says_when_its_row_comes__a_row_due_sooner_gets_its_own(clock):
    """The dispatcher resumes a dozing partition just before what the wake
    said, so a row read after it but due before that wakes the topic again."""
    w, sent = _waker()
    w.read(TOPIC, in_ms=900)
    assert sent[0]["value"] == b"900"
    clock.now += 0.1
    w.read(TOPIC, in_ms=900)  # due at 1.0 s, after the wake's 0.9 s: announced
    assert len(sent) == 1
    w.read(TOPIC, in_ms=300)  # due at 0.4 s: before it
    assert [r["value"] for r in sent] == [b"900", b"300"]
    w.read(TOPIC)  # due now
    assert [r["value"] for r in sent] == [b"900", b"300", b""]
    w.read(TOPIC, in_ms=50)
    assert len(sent) == 3


def test_published_late__its_wake_says_now(clock):
    w, sent = _waker()
    w.read(TOPIC, in_ms=900)
    clock.now += 1.6
    assert w.published(TOPIC) is True
    assert sent[-1]["value"] == b""


def test_published_within_late_ms_of_the_wake__no_second_wake(clock):
    """The usual case: read up to the fire-ahead lead before its instant,
    published then, under the wake its read sent."""
    w, sent = _waker()
    w.read(TOPIC)
    clock.now += 1.4
    assert w.published(TOPIC) is False
    assert len(sent) == 1 and w.late_total == 0


def test_published_later_than_late_ms__woken_again_first(clock):
    """A late relay (its releaser behind a lease renewal, a barrier's flush):
    the dispatcher may have let the partition doze, so a wake goes first."""
    w, sent = _waker()
    w.read(TOPIC)
    clock.now += 1.6
    assert w.published(TOPIC) is True
    assert len(sent) == 2 and w.late_total == 1
    # That wake counts as the topic's last: a row read now needs none.
    clock.now += 0.1
    w.read(TOPIC)
    assert w.published(TOPIC) is False
    assert len(sent) == 2


def test_published_with_no_wake_yet__woken(clock):
    """A row the relay holds from before its own start (or read by another
    relay that lost the lease) has no wake from this relay."""
    w, sent = _waker()
    assert w.published(TOPIC) is True
    assert len(sent) == 1


def test_without_late_ms__publishing_never_wakes(clock):
    w, sent = _waker(late_ms=None)
    clock.now += 60
    assert w.published(TOPIC) is False
    assert sent == []


def test_not_a_run_topic__never_woken(clock):
    w, sent = _waker()
    w.read("p.queue.t1.default")
    assert w.published("p.queue.t1.default") is False
    assert sent == []
