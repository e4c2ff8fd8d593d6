"""RunReady v2 (traceparent, cell) across releases, through the real broker.

The release before this one (v0.1.0) shipped v2 staged
(`staged.RunReady.v2.avsc`): its readers held the file while it wrote v1.
This release publishes the file (the same content under `RunReady.v2.avsc`)
and writes v2. Both releases must read each other's records off a topic; a
reader that lacks the v2 file (a release before v0.1.0) cannot, which is why
the file shipped first. The previous release's own code does the same in
tests/upgrade/test_sdk_records.py; the codec alone in tests/unit/test_run_ready_v2.py."""

from __future__ import annotations

import shutil

import pytest

from cronwheel import kafka
from cronwheel.core import avro, events
from cronwheel.core.avro import SCHEMA_DIR, SchemaRegistry, UndecodableRecord
from cronwheel.sdk import worker
from tests.support.kafka import read_all
from tests.unit.test_run_ready_v2 import RUN, V1  # a run, and its v1 record's datum

pytestmark = pytest.mark.integration


@pytest.fixture
def layouts(tmp_path):
    """The schema folders of the two releases before: v1 files only, and
    v0.1.0's (v2 staged)."""
    before, previous = tmp_path / "before", tmp_path / "previous"
    before.mkdir()
    previous.mkdir()
    for path in SCHEMA_DIR.glob("*.avsc"):
        if path.name == "RunReady.v2.avsc":
            shutil.copy(path, previous / "staged.RunReady.v2.avsc")
        else:
            shutil.copy(path, before / path.name)
            shutil.copy(path, previous / path.name)
    return before, previous


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    kafka.ensure_topics([topic], partitions=1, bootstrap=bootstrap, principal="dispatcher")
    p = kafka.producer(bootstrap, principal="relay")  # run topics are the relay's to write
    for v in values:
        p.produce(topic, key=RUN["run_id"].encode(), value=v)
    assert p.flush(15) == 0
    return [m.value() for m in read_all(bootstrap, [topic])]


def test_v2_written_here_and_v1_written_before__each_release_reads_both(
    kafka_bootstrap, topic_prefix, layouts
):
    before, previous = layouts
    this = avro.default_registry()
    v2_bytes = events.run_ready(**RUN, cell="eu")
    v1_bytes = this.encode("RunReady", V1, version=1)  # what v0.1.0 wrote for the run

    topic = f"{topic_prefix}.runs.ten_v2"  # a run topic: the relay writes, the observer reads
    got_v2, got_v1 = _produce(kafka_bootstrap, topic, [v2_bytes, v1_bytes])
    assert (got_v2, got_v1) == (v2_bytes, v1_bytes)
    assert got_v2[2:10] == this.latest("RunReady").fingerprint != got_v1[2:10]

    # This release reads its own v2 records whole ...
    _, v2 = this.decode(got_v2)
    assert v2["cell"] == "eu"
    assert v2["traceparent"] == events.traceparent(RUN["run_id"], RUN["attempt"])
    # ... and the previous release's v1 records, the new fields at their defaults.
    _, from_v1 = this.decode(got_v1)
    assert from_v1 == {**V1, "traceparent": None, "cell": None}
    # So does its SDK.
    assert (worker._decode(got_v2).cell, worker._decode(got_v1).cell) == ("eu", None)

    # The previous release, a v1 reader holding the staged file, reads v2 records as v1.
    old = SchemaRegistry(previous)
    assert old.decode(got_v2) == ("RunReady", V1) == old.decode(got_v1)

    # A release without the v2 file cannot: readers first.
    with pytest.raises(UndecodableRecord, match="unknown fingerprint"):
        SchemaRegistry(before).decode(got_v2)
    assert SchemaRegistry(before).decode(got_v1) == ("RunReady", V1)
