"""cronwheel.producer_shards.HotTopics: which topics get the hot producer,
looked at once a second from the records given since the last look."""

from __future__ import annotations

from cronwheel.producer_shards import HotTopics


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _second(hot: HotTopics, clock: Clock, per_topic: dict[str, int]) -> None:
    """`per_topic` records spread over one second, then the look."""
    total = sum(per_topic.values())
    step = 1.0 / max(total, 1)
    for topic, n in per_topic.items():
        for _ in range(n):
            hot.count(topic)
            clock.now += step
    clock.now += 0.001
    hot.count("idle.topic")  # a record after the second: the look is taken


def test_busiest_at_the_rate__hot__at_most_so_many__slow_ones_not():
    clock = Clock()
    hot = HotTopics(2, 20.0, clock=clock)
    _second(hot, clock, {"a": 100, "b": 50, "c": 30, "slow": 5})
    assert hot.hot == {"a", "b"}  # the two busiest; c is at the rate but the set is full
    _second(hot, clock, {"a": 100, "b": 50, "c": 30, "slow": 5})
    assert hot.hot == {"a", "b"}


def test_a_hot_topic_goes_back_after_three_quiet_looks__not_one():
    clock = Clock()
    hot = HotTopics(4, 20.0, clock=clock)
    _second(hot, clock, {"a": 100})
    assert hot.hot == {"a"}
    _second(hot, clock, {"a": 5})
    _second(hot, clock, {"a": 5})
    assert hot.hot == {"a"}
    _second(hot, clock, {"a": 15})  # half the rate or more: the quiet looks start over
    _second(hot, clock, {"a": 5})
    _second(hot, clock, {"a": 5})
    assert hot.hot == {"a"}
    _second(hot, clock, {"a": 5})
    assert hot.hot == set()


def test_the_rate_is_over_the_time_since_the_last_look__not_one_second():
    """30 records at once, then none for a minute: the look the next record
    brings finds 31 over 60 s, not busy. Over 1.0 s they would be."""
    clock = Clock()
    hot = HotTopics(4, 20.0, clock=clock)
    for _ in range(30):
        hot.count("a")
    clock.now += 60
    hot.count("a")
    assert hot.hot == set()
    for _ in range(30):
        hot.count("a")
    clock.now += 1.0
    hot.count("a")
    assert hot.hot == {"a"}
