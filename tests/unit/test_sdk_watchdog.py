"""When the SDK worker replaces its Kafka consumer (cronwheel.sdk.watchdog):
decided from what the worker saw, on a clock the test moves."""

from __future__ import annotations

from cronwheel.sdk.watchdog import ConsumerWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock) -> ConsumerWatchdog:
    return ConsumerWatchdog(empty_for_s=30, ask_every_s=10, replace_gap_s=30, clock=clock)


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
        answers = True if dog.should_ask(assigned=False) else None
        assert dog.replace(answers) is None
        clock.now += 1
    assert dog.asked_total > 0 and dog.replaced_total == 0


def test_no_partitions__coordinator_silent__replaced_once_per_gap():
    clock = Clock()
    dog = watchdog(clock)
    replaced_at = []
    for _ in range(200):
        answers = False if dog.should_ask(assigned=False) else None
        why = dog.replace(answers)
        if why is not None:
            assert "coordinator does not answer" in why
            replaced_at.append(clock.now - 100)
        clock.now += 1
    # 30 s empty, then asked and replaced; the new consumer's emptiness counts from then.
    assert replaced_at == [30, 60, 90, 120, 150, 180]
    assert dog.replaced_total == 6


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
