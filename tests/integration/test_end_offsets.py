"""cronwheel.kafka.end_offsets asks the broker in chunks (librdkafka merges one
ListOffsets answer into its results partition by partition against every
asked one, so one call for 3,000 dozing partitions costs their square): every
partition's end offset comes back whichever chunk asked it. Against the real
broker with the dispatcher's principal, which the dozing sweep uses."""

from __future__ import annotations

import pytest

from cronwheel import kafka

pytestmark = pytest.mark.integration


class _Counting:
    """The real admin client, with the size of each list_offsets call kept."""

    def __init__(self, client):
        self.client = client
        self.calls: list[int] = []

    def list_offsets(self, specs, **kwargs):
        self.calls.append(len(specs))
        return self.client.list_offsets(specs, **kwargs)


def test_end_offsets__asked_in_chunks__every_partition_answered(kafka_bootstrap, topic_prefix):
    names = [f"{topic_prefix}.runs.ends{i}" for i in range(5)]
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="relay")  # run topics are the relay's
    for i, name in enumerate(names):
        for _ in range(i):
            producer.produce(name, key=b"k", value=b"v")
    assert producer.flush(30) == 0

    admin = _Counting(kafka.admin(kafka_bootstrap, principal="dispatcher"))
    keys = [(name, 0) for name in names]
    assert kafka.end_offsets(admin, keys, chunk=2) == {(name, 0): i for i, name in enumerate(names)}
    assert admin.calls == [2, 2, 1]

    admin.calls.clear()
    assert kafka.end_offsets(admin, keys) == {(name, 0): i for i, name in enumerate(names)}
    assert admin.calls == [5]  # under END_OFFSETS_CHUNK: one call, as before

    assert kafka.end_offsets(admin, []) == {}
    assert admin.calls == [5]  # nothing asked, no request
