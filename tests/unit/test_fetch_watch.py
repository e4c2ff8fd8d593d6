"""cronwheel.fetch_watch: which held partitions a consumer stopped reading,
and when a producer stopped delivering."""

from __future__ import annotations

from cronwheel.fetch_watch import DeliveryWatch, FetchWatch

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
