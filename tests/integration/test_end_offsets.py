"""cronwheel.kafka.end_offsets and start_offsets ask the broker through an
offsets client (kafka.asker: a consumer's offsets_for_times, not the admin
client's list_offsets, whose leader lookup can crash the process:
docs/dispatcher.md), in chunks (librdkafka matches each answer against every
asked partition, so one request for 3,000 dozing partitions costs their
square): every partition's offset comes back whichever chunk asked it.
Against the real broker with the dispatcher's principal, which the dozing
sweep uses."""

from __future__ import annotations

import threading

import pytest

from cronwheel import kafka
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


class _Counting:
    """The real offsets client, with the size of each request kept."""

    def __init__(self, client):
        self.client = client
        self.calls: list[int] = []
        self.metadata: list[str | None] = []  # the topic each metadata ask named

    def offsets_for_times(self, partitions, **kwargs):
        self.calls.append(len(partitions))
        return self.client.offsets_for_times(partitions, **kwargs)

    def list_topics(self, topic=None, **kwargs):
        self.metadata.append(topic)
        return self.client.list_topics(topic, **kwargs)


def _topics_with_records(kafka_bootstrap: str, topic_prefix: str, n: int, tag: str) -> list[str]:
    """n run topics of one partition, the i-th holding i records."""
    names = [f"{topic_prefix}.runs.{tag}{i}" for i in range(n)]
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="relay")  # run topics are the relay's
    for i, name in enumerate(names):
        for _ in range(i):
            producer.produce(name, key=b"k", value=b"v")
    assert producer.flush(30) == 0
    return names


def _asker(kafka_bootstrap: str, topic_prefix: str):
    return kafka.asker(
        kafka_bootstrap, principal="dispatcher", group=f"{topic_prefix}.dispatcher.ask"
    )


def test_end_offsets__asked_in_chunks__every_partition_answered(kafka_bootstrap, topic_prefix):
    names = _topics_with_records(kafka_bootstrap, topic_prefix, 5, "ends")
    client = _Counting(_asker(kafka_bootstrap, topic_prefix))
    keys = [(name, 0) for name in names]
    assert kafka.end_offsets(client, keys, chunk=2) == {
        (name, 0): i for i, name in enumerate(names)
    }
    assert client.calls == [2, 2, 1]

    client.calls.clear()
    assert kafka.end_offsets(client, keys) == {(name, 0): i for i, name in enumerate(names)}
    assert client.calls == [5]  # under END_OFFSETS_CHUNK: one request

    assert kafka.end_offsets(client, []) == {}
    assert client.calls == [5]  # nothing asked, no request

    # The first offset still held: none of these records was deleted.
    assert kafka.start_offsets(client, keys, chunk=2) == {(name, 0): 0 for name in names}


def test_end_offsets__a_partition_that_does_not_exist__none_for_it_alone(
    kafka_bootstrap, topic_prefix
):
    names = _topics_with_records(kafka_bootstrap, topic_prefix, 2, "gone")
    client = _asker(kafka_bootstrap, topic_prefix)
    keys = [(names[0], 0), (names[0], 7), (f"{topic_prefix}.runs.never", 0), (names[1], 0)]
    assert kafka.end_offsets(client, keys) == {
        (names[0], 0): 0,
        (names[0], 7): None,  # no such partition
        (f"{topic_prefix}.runs.never", 0): None,  # no such topic
        (names[1], 0): 1,
    }
    # Only what does not exist: the request fails whole, and each is None.
    assert kafka.end_offsets(client, keys[1:3]) == {(names[0], 7): None, keys[2]: None}


def test_end_offsets__new_client_asked_from_threads_at_once__every_one_answered(
    kafka_bootstrap, topic_prefix
):
    """The dozing sweep, the fetch watch and a diagnosis ask through one
    client from their own threads, about topics its metadata has not seen:
    each gets every answer (the admin client's list_offsets, asked so, was
    seen to crash the process: bench/bench_offsets_race.py)."""
    names = _topics_with_records(kafka_bootstrap, topic_prefix, 40, "many")
    want = {(name, 0): i for i, name in enumerate(names)}
    client = _asker(kafka_bootstrap, topic_prefix)
    got: list[dict] = []

    def ask() -> None:
        got.append(kafka.end_offsets(client, list(want), 10, chunk=3))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == [want] * 4


def test_end_offsets__a_topic_deleted_since_the_client_learned_it__the_others_still_answered(
    kafka_bootstrap, topic_prefix
):
    """The broker's error for one partition fails its whole request
    (librdkafka's offsets_for_times then answers none of it): the request is
    asked again in halves, so only that partition is None, not its chunk's
    (a dozing partition without an answer is woken)."""
    names = _topics_with_records(kafka_bootstrap, topic_prefix, 4, "deleted")
    client = _Counting(_asker(kafka_bootstrap, topic_prefix))
    keys = [(name, 0) for name in names]
    assert kafka.end_offsets(client, keys) == {(name, 0): i for i, name in enumerate(names)}

    admin = kafka.admin(kafka_bootstrap, principal="admin")  # deleting is the operator's
    admin.delete_topics([names[2]])[names[2]].result(30)
    wait_for(
        lambda: names[2] not in admin.list_topics(timeout=10).topics,
        timeout=30, what="the topic gone from the broker's metadata",
    )  # fmt: skip
    client.calls.clear()
    assert kafka.end_offsets(client, keys, 10) == {
        (names[0], 0): 0,
        (names[1], 0): 1,
        (names[2], 0): None,
        (names[3], 0): 3,
    }
    assert client.calls[0] == 4 and len(client.calls) > 1, client.calls  # asked again, split


@pytest.mark.parametrize("grown", [1, kafka.REFRESH_EACH_UP_TO + 2])
def test_end_offsets__a_partition_added_since_the_client_learned_its_topic__answered(
    kafka_bootstrap, topic_prefix, grown
):
    """A client that learned a topic with one partition keeps that in its
    metadata cache (up to 15 minutes) and answered "unknown partition" for a
    partition added since, without asking the broker (a tenant's topics grow
    online): the topics' metadata is asked again (a request a topic, or one
    for every topic past REFRESH_EACH_UP_TO), so the new partitions are
    answered as soon as they exist. Asked beside partitions it knows, the
    new one is answered unknown alone; asked alone, the request fails whole."""
    names = _topics_with_records(kafka_bootstrap, topic_prefix, grown, f"grown{grown}x")
    beside = _Counting(_asker(kafka_bootstrap, topic_prefix))
    alone = _Counting(_asker(kafka_bootstrap, topic_prefix))
    keys = [(name, p) for name in names for p in (0, 1)]
    new = [(name, 1) for name in names]
    assert kafka.end_offsets(beside, keys) == {
        (name, p): (i if p == 0 else None) for i, name in enumerate(names) for p in (0, 1)
    }
    assert kafka.end_offsets(alone, [(name, 0) for name in names] + new) == {
        (name, p): (i if p == 0 else None) for i, name in enumerate(names) for p in (0, 1)
    }

    relay = kafka.admin(kafka_bootstrap, principal="relay")  # the relay grows run topics
    for name in names:
        kafka.grow_topic(name, 2, relay)

    def led() -> bool:
        meta = relay.list_topics(timeout=10).topics
        return all(
            len(meta[n].partitions) == 2 and all(p.leader >= 0 for p in meta[n].partitions.values())
            for n in names
        )

    wait_for(led, timeout=30, what="the new partitions led")
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    errors: list = []
    for name in names:
        for _ in range(2):
            producer.produce(
                name, key=b"k", value=b"v", partition=1,
                on_delivery=lambda e, _m: e and errors.append(e),
            )  # fmt: skip
    assert producer.flush(30) == 0 and errors == [], errors

    beside.metadata.clear()
    assert kafka.end_offsets(beside, keys, 10) == {
        (name, p): (i if p == 0 else 2) for i, name in enumerate(names) for p in (0, 1)
    }
    assert kafka.start_offsets(beside, keys, 10) == dict.fromkeys(keys, 0)
    alone.metadata.clear()
    assert kafka.end_offsets(alone, new, 10) == dict.fromkeys(new, 2)
    for client in (beside, alone):
        assert client.metadata == ([None] if grown > kafka.REFRESH_EACH_UP_TO else names)


@pytest.mark.parametrize("ask", ["end_offsets", "start_offsets"])
def test_renewing_asker__its_client_answers_nothing__a_new_one_asked(
    kafka_bootstrap, topic_prefix, ask
):
    """A client left stuck (here one whose broker address answers nothing)
    answers None for every partition: the renewing asker makes a new client
    and asks again, for the gateway's figures as for the fetch watch."""
    names = _topics_with_records(kafka_bootstrap, topic_prefix, 2, f"renew{ask[0]}")
    group = f"{topic_prefix}.dispatcher.ask"
    asker = kafka.RenewingAsker(kafka_bootstrap, principal="dispatcher", group=group)
    stuck = kafka.asker("127.0.0.1:1", principal="dispatcher", group=group)
    asker._client = stuck
    keys = [(name, 0) for name in names]
    want = (
        {(name, 0): i for i, name in enumerate(names)}
        if ask == "end_offsets"
        else {(name, 0): 0 for name in names}
    )
    assert getattr(asker, ask)(keys, 5) == want
    assert asker.client is not stuck
