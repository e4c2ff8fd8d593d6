"""cronwheel.fetch_watch: which held partitions a consumer stopped reading."""

from __future__ import annotations

from cronwheel.fetch_watch import FetchWatch

A, B = ("t.runs.a", 0), ("t.runs.b", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch() -> tuple[FetchWatch, Clock]:
    clock = Clock()
    return FetchWatch(every_s=15, clock=clock), clock


def look(w: FetchWatch, clock: Clock, positions: dict, ends: dict | None, after_s: float = 15):
    clock.now += after_s
    assert w.due()
    return w.look(list(positions), positions.get, lambda keys: ends and {k: ends[k] for k in keys})


def test_behind_and_still__stuck__at_the_second_look():
    w, clock = watch()
    assert look(w, clock, {A: 10, B: 4}, {A: 12, B: 4}) == []  # the first look only notes
    assert look(w, clock, {A: 10, B: 4}, {A: 13, B: 4}) == [A]  # B idle: nothing past it
    assert w.stuck_total == 1


def test_a_backlog_being_read__never_stuck():
    w, clock = watch()
    look(w, clock, {A: 10}, {A: 5_000})
    assert look(w, clock, {A: 900}, {A: 9_000}) == []
    assert look(w, clock, {A: 1_800}, {A: 9_000}) == []


def test_caught_up_since__not_stuck__records_arriving_after_the_look_neither():
    w, clock = watch()
    look(w, clock, {A: 10}, {A: 10})  # nothing past it at the first look
    assert look(w, clock, {A: 10}, {A: 11}) == []  # one record came since: not judged yet
    assert look(w, clock, {A: 10}, {A: 11}) == [A]  # and not read a whole interval later


def test_a_look_long_after_the_last__starts_over():
    w, clock = watch()
    look(w, clock, {A: 10}, {A: 12})
    assert look(w, clock, {A: 10}, {A: 12}, after_s=45) == []  # the loop was away
    assert look(w, clock, {A: 10}, {A: 12}) == [A]


def test_unknown_position_or_end__not_judged():
    w, clock = watch()
    look(w, clock, {A: 10, B: None}, {A: 12, B: 3})
    assert look(w, clock, {A: 10, B: None}, {A: None, B: 3}) == []  # A's answer failed
    assert look(w, clock, {A: 10, B: None}, None) == []  # the broker could not be asked
    assert look(w, clock, {A: 10}, {A: 12}) == []  # after a failed ask: noted afresh
    assert look(w, clock, {A: 10}, {A: 12}) == [A]


def test_forget__a_replaced_consumer_starts_over():
    w, clock = watch()
    look(w, clock, {A: 10}, {A: 12})
    w.forget()
    assert look(w, clock, {A: 10}, {A: 12}) == []


def test_due__every_interval():
    w, clock = watch()
    assert not w.due()
    clock.now += 15
    assert w.due()
    w.look([], lambda _k: None, lambda _keys: {})
    assert not w.due()
