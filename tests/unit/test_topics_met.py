"""When a producer has met enough quiet topics to be replaced
(cronwheel/topics_met.py), on a clock the test moves."""

from __future__ import annotations

from cronwheel.topics_met import TopicsMet, Verdict


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def met(topics: TopicsMet, names: list[str]) -> None:
    for name in names:
        topics.used(name)


def test_due_every_interval_from_the_last_look():
    clock = Clock()
    topics = TopicsMet(every_s=60, at_least=2, clock=clock)
    assert not topics.due()
    clock.t += 60
    assert topics.due()
    topics.look()
    assert not topics.due()
    clock.t += 59.9
    assert not topics.due()


def test_many_met_few_used__renew():
    topics = TopicsMet(every_s=60, at_least=4, clock=Clock())
    met(topics, ["a", "b", "c", "d"])
    assert topics.look() == Verdict(met=4, used=4, renew=False)
    met(topics, ["a", "b"])
    assert topics.look() == Verdict(met=4, used=2, renew=True)


def test_most_used__kept():
    topics = TopicsMet(every_s=60, at_least=4, clock=Clock())
    met(topics, ["a", "b", "c", "d"])
    topics.look()
    met(topics, ["a", "b", "c"])
    assert topics.look() == Verdict(met=4, used=3, renew=False)


def test_fewer_met_than_the_threshold__kept_however_quiet():
    topics = TopicsMet(every_s=60, at_least=5, clock=Clock())
    met(topics, ["a", "b", "c", "d"])
    topics.look()
    assert topics.look() == Verdict(met=4, used=0, renew=False)


def test_renewed__counts_only_what_the_new_producer_meets():
    topics = TopicsMet(every_s=60, at_least=3, clock=Clock())
    met(topics, ["a", "b", "c", "d"])
    topics.look()
    assert topics.look().renew
    topics.renewed()
    met(topics, ["a"])
    assert topics.look() == Verdict(met=1, used=1, renew=False)
    assert topics.look() == Verdict(met=1, used=0, renew=False)
