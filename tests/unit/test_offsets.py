"""In-order offset commits (the SDK's and the webhook service's): a crash never
skips an unstarted record. Paced commits (cronwheel.consuming.Offsets) name
only the partitions that finished a record since the last."""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from cronwheel.consuming import Offsets, TrackedOffsets
from cronwheel.core.offsets import OffsetTracker


def test_committable__out_of_order_finish__waits_for_the_earliest():
    t = OffsetTracker()
    for off in (10, 11, 12):
        t.begin("q", 0, off)
    t.finish("q", 0, 12)
    t.finish("q", 0, 11)
    assert t.committable() == {("q", 0): 10}
    t.finish("q", 0, 10)
    assert t.committable() == {("q", 0): 13}
    assert t.committable() == {}


def test_committable__partitions_are_independent():
    t = OffsetTracker()
    t.begin("q", 0, 5)
    t.begin("q", 1, 7)
    t.finish("q", 1, 7)
    assert t.committable() == {("q", 0): 5, ("q", 1): 8}


def test_forget__revoked_partition__dropped():
    t = OffsetTracker()
    t.begin("q", 0, 1)
    t.forget("q", 0)
    assert t.in_flight() == 0 and t.committable() == {}


@given(
    st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=30, unique=True),
    st.randoms(),
)
def test_committable__never_passes_an_unfinished_offset(offsets, rnd):
    t = OffsetTracker()
    begun = sorted(offsets)
    for off in begun:
        t.begin("q", 0, off)
    finished: set[int] = set()
    order = begun[:]
    rnd.shuffle(order)
    for off in order:
        t.finish("q", 0, off)
        finished.add(off)
        for _tp, nxt in t.committable().items():
            assert all(o in finished for o in begun if o < nxt)
    assert t.committable() in ({}, {("q", 0): begun[-1] + 1})


class _Committing:
    """Stands for a consumer's assignment and commit() (what a paced commit
    names is the rule tested; the broker's side is tests/integration's)."""

    def __init__(self, assigned: list[tuple[str, int]]):
        self.assigned = assigned
        self.commits: list[tuple[dict, bool]] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.assigned]

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.commits.append(({(tp.topic, tp.partition): tp.offset for tp in offsets}, asynchronous))


def test_paced_commit__names_only_the_partitions_that_finished_since():
    """At 3,000 assigned partitions, naming every one in each commit cost the
    client a topic lookup and the broker an offset record per partition named,
    five times a second."""
    consumer = _Committing([("r", 0), ("r", 1), ("r", 2)])
    offsets = Offsets("test", commit_every_s=0)
    for p, at in ((0, 10), (1, 20), (2, 30)):
        offsets.finished(Message(topic="r", partition=p, offset=at))
    offsets.commit(consumer, asynchronous=True)
    offsets.finished(Message(topic="r", partition=1, offset=21))
    offsets.commit(consumer, asynchronous=True)
    offsets.commit(consumer, asynchronous=True)  # nothing finished since: no commit
    offsets.commit(consumer, asynchronous=False)  # a stop: every partition
    assert consumer.commits == [
        ({("r", 0): 11, ("r", 1): 21, ("r", 2): 31}, True),
        ({("r", 1): 22}, True),
        ({("r", 0): 11, ("r", 1): 22, ("r", 2): 31}, False),
    ]


def test_paced_commit__a_partition_no_longer_assigned__not_named():
    consumer = _Committing([("r", 0)])
    offsets = Offsets("test", commit_every_s=0)
    offsets.finished(Message(topic="r", partition=0, offset=1))
    offsets.finished(Message(topic="r", partition=5, offset=1))
    offsets.commit(consumer, asynchronous=True)
    assert consumer.commits == [({("r", 0): 2}, True)]


def test_paced_commit__the_caller_keeps_the_assignment__librdkafka_not_asked_for_it():
    """The dispatcher, webhook and executor keep their assignment
    (cronwheel.assignment): asking librdkafka's built a list of every
    assigned partition at each commit, five times a second in a herd."""
    consumer = _Committing([("r", 0), ("r", 5)])
    asked = []
    consumer.assignment = lambda: asked.append(1) or []
    offsets = Offsets("test", commit_every_s=0)
    offsets.finished(Message(topic="r", partition=0, offset=1))
    offsets.finished(Message(topic="r", partition=5, offset=1))
    offsets.commit(consumer, asynchronous=True, assigned={("r", 0)})
    assert consumer.commits == [({("r", 0): 2}, True)]
    assert asked == []


def test_tracked_paced_commit__a_record_finished_while_committing__named_by_the_next():
    """The webhook finishes deliveries on another thread than the one that
    commits: one finished after the tracker was read is committed next time,
    never dropped (the tracker hands each move out once)."""

    class Racing(TrackedOffsets):
        race = None

        def committable(self):
            got = super().committable()
            if self.race is not None:
                self.race, race = None, self.race
                race()  # the other thread, between the read and the reset
            return got

    consumer = _Committing([("w", 0), ("w", 1)])
    offsets = Racing("test", commit_every_s=0)
    offsets.begin("w", 0, 5)
    offsets.begin("w", 1, 7)
    offsets.finish("w", 0, 5)
    offsets.race = lambda: offsets.finish("w", 1, 7)
    offsets.commit(consumer, asynchronous=True)
    offsets.commit(consumer, asynchronous=True)
    # w1's first commit is where it starts (7, begun, not finished).
    assert consumer.commits == [({("w", 0): 6, ("w", 1): 7}, True), ({("w", 1): 8}, True)]


def test_give_up__offset_the_broker_confirmed__not_committed_again():
    """A dozing or handed-over partition whose last paced commit the broker
    already stored is not committed again at that offset (at 3,000 tenants
    that second commit was half the dispatcher's); one finished past it is."""
    consumer = _Committing([("r", 0), ("r", 1)])
    offsets = Offsets("test", commit_every_s=0)
    offsets.finished(Message(topic="r", partition=0, offset=4))
    offsets.finished(Message(topic="r", partition=1, offset=8))
    offsets.commit(consumer, asynchronous=True)
    # The broker's answer, served by the next consume(): both stored.
    offsets.on_commit(None, [TopicPartition("r", 0, 5), TopicPartition("r", 1, 9)])
    offsets.finished(Message(topic="r", partition=1, offset=9))  # past the confirmed one
    gone = offsets.give_up(consumer, [TopicPartition("r", 0), TopicPartition("r", 1)])
    assert gone == {("r", 0), ("r", 1)}
    assert consumer.commits[1:] == [({("r", 1): 10}, False)]
    assert offsets.confirmed == {}  # forgotten with the partitions


def test_give_up__commit_failed__committed_again():
    consumer = _Committing([("r", 0)])
    offsets = Offsets("test", commit_every_s=0)
    offsets.finished(Message(topic="r", partition=0, offset=4))
    offsets.commit(consumer, asynchronous=True)
    offsets.on_commit(KafkaError(KafkaError.REQUEST_TIMED_OUT), [TopicPartition("r", 0, 5)])
    offsets.give_up(consumer, [TopicPartition("r", 0)])
    assert consumer.commits[1:] == [({("r", 0): 5}, False)]
