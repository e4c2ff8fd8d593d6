"""When a producer has met enough quiet topics to be replaced
(cronwheel/topics_met.py), on a clock the test moves."""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Producer

from cronwheel.topics_met import RenewingProducer, TopicsMet, Verdict


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


def test_renew_if_quiet__made_anew_under_the_other_producers_lock():
    """With `producing` (the relay's releasing thread produces under it), the
    producer is replaced while that lock is held, so no record goes to the
    old one after its last flush. A real client with nothing to deliver:
    its flush needs no broker."""
    clock = Clock()
    topics = TopicsMet(every_s=60, at_least=4, clock=clock)
    lock = threading.Lock()
    made_under_lock: list[bool] = []

    def make() -> Producer:
        made_under_lock.append(lock.locked())
        return Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})

    producer = RenewingProducer(make, topics)
    met(producer.topics_met, ["a", "b", "c", "d"])
    clock.t += 60
    topics.look()
    met(producer.topics_met, ["a"])
    clock.t += 60
    assert producer.renew_if_quiet("test", logging.getLogger("test"), producing=lock)
    assert made_under_lock == [False, True]  # the first at construction, the renewal under it
    assert not lock.locked()
