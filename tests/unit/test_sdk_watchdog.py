"""When the SDK worker replaces its Kafka consumer (cronwheel.sdk.watchdog):
decided from what the worker saw, on a clock the test moves."""

from __future__ import annotations

from cronwheel.sdk.watchdog import (
    ANSWERS,
    BROKER_SILENT,
    COORDINATOR_SILENT,
    STRANDED,
    ConsumerWatchdog,
    stranded,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock) -> ConsumerWatchdog:
    return ConsumerWatchdog(
        empty_for_s=30, ask_every_s=10, replace_gap_s=30, broker_silent_for_s=120, clock=clock
    )


def replacements(heard_when_asked: str, seconds: int) -> list[tuple[float, str]]:
    """A consumer without partitions for `seconds`, each ask answered
    `heard_when_asked`: when (s from the start) it was replaced, and why."""
    clock = Clock()
    dog = watchdog(clock)
    out = []
    for _ in range(seconds):
        why = dog.replace(heard_when_asked if dog.should_ask(assigned=False) else None)
        if why is not None:
            out.append((clock.now - 100, why))
        clock.now += 1
    assert dog.replaced_total == len(out)
    return out


def test_assigned__never_asks__never_replaced():
    clock = Clock()
    dog = watchdog(clock)
    for _ in range(100):
        assert dog.should_ask(assigned=True) is False
        assert dog.replace() is None
        clock.now += 1
    assert dog.asked_total == dog.replaced_total == 0


def test_no_partitions__asks_after_empty_for_s__then_every_ask_every_s():
    clock = Clock()
    dog = watchdog(clock)
    asked_at = []
    for _ in range(60):
        if dog.should_ask(assigned=False):
            asked_at.append(clock.now - 100)
        clock.now += 1
    assert asked_at == [30, 40, 50]


def test_no_partitions__coordinator_answers__not_replaced():
    """More workers than partitions: a consumer without any is fine."""
    clock = Clock()
    dog = watchdog(clock)
    for _ in range(120):
        answers = ANSWERS if dog.should_ask(assigned=False) else None
        assert dog.replace(answers) is None
        clock.now += 1
    assert dog.asked_total > 0 and dog.replaced_total == 0


def test_no_partitions__coordinator_silent__replaced_once_per_gap():
    got = replacements(COORDINATOR_SILENT, 200)
    # 30 s empty, then asked and replaced; the new consumer's emptiness counts from then.
    assert [at for at, _ in got] == [30, 60, 90, 120, 150, 180]
    assert all("coordinator does not answer" in why for _, why in got)


def test_partitions_come_back__emptiness_counts_again_from_zero():
    clock = Clock()
    dog = watchdog(clock)
    for _ in range(25):
        dog.should_ask(assigned=False)
        clock.now += 1
    dog.should_ask(assigned=True)
    for _ in range(25):
        assert dog.should_ask(assigned=False) is False
        clock.now += 1


def test_unstarted_partitions__replaced__not_again_within_the_gap():
    clock = Clock()
    dog = watchdog(clock)
    dog.error(
        'Failed to fetch committed offsets for 0 partition(s) in group "g": Broker: Not coordinator'
    )
    assert "failed to fetch" in (dog.replace() or "")
    dog.error('Failed to fetch committed offsets for 2 partition(s) in group "g": ...')
    clock.now += 10
    assert dog.replace() is None  # within the gap: kept for later
    clock.now += 25
    assert dog.replace() is not None
    assert dog.replace() is None  # said once


def test_other_errors__not_replaced():
    clock = Clock()
    dog = watchdog(clock)
    dog.error("Broker: Not coordinator")
    dog.error("GroupCoordinator: 127.0.0.1:29092: Disconnected")
    assert dog.replace() is None


def test_broker_silent__replaced_only_after_broker_silent_for_s():
    """A broker down: replacing does not help, until it has been silent long
    enough that the consumer's own connections may be what is broken."""
    got = replacements(BROKER_SILENT, 200)
    # First asked at 30, silent since; 120 s later the next ask replaces.
    assert [at for at, _ in got] == [150]
    assert "no answer from the broker for 120 s" in got[0][1]


def test_broker_answers_again__its_silence_forgotten():
    clock = Clock()
    dog = watchdog(clock)
    for t in range(300):
        asked = dog.should_ask(assigned=False)
        heard = (BROKER_SILENT if t < 100 or t > 180 else ANSWERS) if asked else None
        # Silent 30-100 s, then answering, silent again from ~190 s: never
        # 120 s in one stretch within these 300 s.
        assert dog.replace(heard) is None, t
        clock.now += 1
    assert dog.asked_total > 20


def test_stranded__twice_in_a_row__replaced_with_the_coordinators_view():
    """Out of its group while the coordinator answers (the CI run of 7dce62c):
    replaced on the second stranded description, 10 s after the first."""
    clock = Clock()
    dog = watchdog(clock)
    got = []
    for _ in range(60):
        heard = STRANDED if dog.should_ask(assigned=False) else None
        if why := dog.replace(
            heard, "no member of the group holds any of the topic's 1 partition(s)"
        ):
            got.append((clock.now - 100, why))
        clock.now += 1
    assert got == [
        (40, "no partitions for 40 s and no member of the group holds any of the topic's "
             "1 partition(s)")
    ]  # fmt: skip


def test_stranded_once__then_answers__not_replaced():
    """One description caught between two steps of a group's life judges nothing."""
    clock = Clock()
    dog = watchdog(clock)
    answers = iter([STRANDED, ANSWERS] * 10)
    for _ in range(150):
        heard = next(answers) if dog.should_ask(assigned=False) else None
        assert dog.replace(heard, "x") is None
        clock.now += 1
    assert dog.asked_total > 5


def test_stranded__not_listed__listed_with_partitions_it_lacks__nobody_reads():
    assert "does not list this consumer among its 1 member(s) (group stable)" in (
        stranded("STABLE", {"other": {0}}, "me", 1) or ""
    )
    assert "among its 0 member(s) (group empty)" in (stranded("EMPTY", {}, "me", 1) or "")
    assert "among its 0 member(s)" in (stranded("STABLE", {}, "", 1) or "")
    assert "says this consumer holds partitions [0, 2]" in (
        stranded("STABLE", {"me": {2, 0}}, "me", 3) or ""
    )
    assert "no member of the group holds any of the topic's 2" in (
        stranded("STABLE", {"me": set(), "other": set()}, "me", 2) or ""
    )


def test_not_stranded__another_member_reads__or_the_group_rebalancing():
    """More workers than partitions: a member without any, the others read."""
    assert stranded("STABLE", {"me": set(), "other": {0}}, "me", 1) is None
    for moving in ("PREPARING_REBALANCING", "COMPLETING_REBALANCING", "UNKNOWN"):
        assert stranded(moving, {}, "me", 1) is None
