"""cronwheel.fetch_watch: which held partitions a consumer stopped reading,
and when a producer stopped delivering."""

from __future__ import annotations

import threading

import pytest

from cronwheel.consumer import ClientsWedged, watch_fetching
from cronwheel.fetch_watch import DeliveryWatch, EndsAsked, FetchWatch
from tests.support.wait import wait_for

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


def test_ends_asked_off_the_loop__a_pass_never_waits_for_the_broker__stuck_said_after_the_answer():
    """The loop's pass starts the ask and goes on; the passes while the
    broker has not answered do nothing (no second ask); the look is made at
    the first pass after the answer, with the positions of the ask."""
    w, clock = watch()
    released = threading.Event()
    asked: list[list] = []

    def ends(keys):
        asked.append(keys)
        assert released.wait(30), "the test never answered"
        return {A: 12, B: 4}

    e = EndsAsked(ends)
    positions = {A: 10, B: 4}

    def one_pass() -> int:
        watch_fetching(w, lambda: [A, B], lambda keys: dict(positions), e)
        return w.looks

    try:
        clock.now += 15
        one_pass()  # returns while `ends` waits: the pass did not wait for it
        assert e.asking and w.looks == 0
        one_pass()
        one_pass()
        wait_for(lambda: asked, what="the ask on its thread")
        assert asked == [[A, B]] and w.looks == 0
        released.set()
        wait_for(one_pass, what="the look at a pass after the answer")
        assert w.stuck_total == 0 and not e.asking
        one_pass()  # not due again yet: nothing asked
        assert len(asked) == 1
        clock.now += 15  # a whole look later A stood still behind its end
        one_pass()
        with pytest.raises(ClientsWedged, match="1 partitions not read"):  # A's, not B's
            wait_for(lambda: one_pass() and False, timeout=10, what="the verdict")
    finally:
        released.set()
        e.close()


def test_ends_asked__the_ask_failing__nothing_judged_and_noted_afresh():
    w, clock = watch()

    def ends(_keys):
        raise RuntimeError("no client")

    e = EndsAsked(ends)
    try:
        clock.now += 15
        watch_fetching(w, lambda: [A], lambda keys: {A: 10}, e)
        wait_for(lambda: watch_fetching(w, lambda: [A], lambda keys: {A: 10}, e) or w.looks)
        assert w.stuck_total == 0 and not e.asking
    finally:
        e.close()


def deliveries(looks: list[tuple[int, int, bool]], gap_s: float = 15) -> list[bool]:
    """A DeliveryWatch's verdicts at looks `gap_s` apart, each (records held,
    delivery reports so far, whether a new client gets an answer)."""
    clock = Clock()
    w = DeliveryWatch(every_s=15, clock=clock)
    asked = []
    out = []
    for held, reports, answers in looks:
        clock.now += gap_s
        assert w.due()
        out.append(w.look(held, reports, lambda a=answers: asked.append(a) or a))
    assert w.stuck_total == sum(out)
    return out


def test_delivery__held_and_no_report_between_two_looks__broker_answers__stuck():
    assert deliveries([(3, 10, True), (3, 10, True)]) == [False, True]


def test_delivery__reports_came__or_nothing_held__not_stuck():
    assert deliveries([(3, 10, True), (3, 11, True), (0, 11, True), (0, 11, True)]) == [False] * 4


def test_delivery__broker_down__not_stuck__until_it_answered_a_whole_look():
    """The broker away: nobody delivers, rightly. Once back, a producer may
    wait out its reconnect backoff: stuck only after a whole look (15 s)
    with the broker answering and no report."""
    got = deliveries([(5, 0, False), (5, 0, False), (5, 0, True), (5, 0, True)])
    assert got == [False, False, False, True]


def test_delivery__a_look_long_after_the_last__starts_over():
    assert deliveries([(3, 10, True), (3, 10, True)], gap_s=40) == [False, False]


def test_delivery__judged_stuck__the_next_verdict_needs_two_new_looks():
    assert deliveries([(3, 1, True)] * 5) == [False, True, False, True, False]


def shard_looks(looks: list[tuple[dict, bool]]) -> list[bool]:
    """As `deliveries`, for several producers at once: each look ({key:
    (held, reports)}, whether a new client gets an answer)."""
    clock = Clock()
    w = DeliveryWatch(every_s=15, clock=clock)
    out = []
    for producers, answers in looks:
        clock.now += 15
        out.append(w.look_each(producers, lambda a=answers: a))
    return out


def test_delivery__one_shard_stuck_while_another_delivers__stuck():
    """A sum over the shards would hide it: the others' reports grow."""
    looks = [({1: (3, 10), 2: (5, 100)}, True), ({1: (3, 10), 2: (5, 200)}, True)]
    assert shard_looks(looks) == [False, True]


def test_delivery__every_shard_reports__or_a_shard_made_since__not_stuck():
    looks = [
        ({1: (3, 10), 2: (5, 100)}, True),
        ({1: (3, 11), 2: (5, 101)}, True),  # both delivered
        ({3: (3, 11), 4: (5, 101)}, True),  # new shards (a renewal), same counts
    ]
    assert shard_looks(looks) == [False, False, False]
