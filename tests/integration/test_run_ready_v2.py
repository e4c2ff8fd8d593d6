"""RunReady v2 (traceparent, cell) across releases, through the real broker.

This release ships v2 staged (`schemas/staged.RunReady.v2.avsc`): its readers
hold the file while it still writes v1. The next release publishes the file
(the same content under `RunReady.v2.avsc`) and writes v2. Both directions of
that pair must read each other's records; a reader that lacks the v2 file
(the releases before this one) cannot, which is why the file ships first."""

from __future__ import annotations

import contextlib
import re
import shutil

import pytest

from cronwheel import kafka
from cronwheel.core import avro, events
from cronwheel.core.avro import SCHEMA_DIR, SchemaRegistry, UndecodableRecord
from tests.support.kafka import read_all

pytestmark = pytest.mark.integration

RUN = dict(
    run_id="0" * 31 + "1", tenant_id="ten_a", partition_id=7, attempt=2,
    scheduled_ms=1_767_225_600_000, created_ms=1_767_225_600_004, priority="high",
    target={"type": "queue", "queue": "emails"}, payload='{"to":"a@example.com"}',
)  # fmt: skip
V1_FIELDS = {
    "run_id", "tenant_id", "job_id", "workflow_run_id", "node", "attempt", "scheduled_at",
    "created_at", "priority", "target_type", "queue", "payload", "partition_id", "covers",
}  # fmt: skip
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00")


def _caches_clear() -> None:
    avro.default_registry.cache_clear()
    avro.fast_writer.cache_clear()
    events._run_ready_fields.cache_clear()


@pytest.fixture
def layouts(tmp_path):
    """The schema folders of three releases: the one before (v1 files only),
    this one (v2 staged) and the next (v2 published)."""
    before, nxt = tmp_path / "before", tmp_path / "next"
    before.mkdir()
    nxt.mkdir()
    for path in SCHEMA_DIR.glob("*.avsc"):
        if not avro.is_staged(path.name):
            shutil.copy(path, before / path.name)
        shutil.copy(path, nxt / path.name.removeprefix("staged."))
    return before, SCHEMA_DIR, nxt


@contextlib.contextmanager
def _writing_with(monkeypatch, directory):
    """The producing code (events.run_ready) as a release with these schemas runs it."""
    with monkeypatch.context() as patch:
        patch.setattr(avro, "SCHEMA_DIR", directory)
        _caches_clear()
        try:
            yield
        finally:
            _caches_clear()


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[bytes]:
    kafka.ensure_topics([topic], partitions=1, bootstrap=bootstrap, principal="dispatcher")
    p = kafka.producer(bootstrap, principal="relay")  # run topics are the relay's to write
    for v in values:
        p.produce(topic, key=RUN["run_id"].encode(), value=v)
    assert p.flush(15) == 0
    return [m.value() for m in read_all(bootstrap, [topic])]


def test_this_release__writes_v1_with_v2_staged():
    written = events.run_ready(**RUN, cell="eu")

    registry = avro.default_registry()
    assert registry.latest("RunReady").version == 1
    assert written[2:10] == registry.latest("RunReady").fingerprint
    assert set(registry.decode(written)[1]) == V1_FIELDS


def test_next_release_writes_v2__readers_of_this_release_decode_it(
    kafka_bootstrap, topic_prefix, layouts, monkeypatch
):
    before, this, nxt = layouts
    v1_bytes = events.run_ready(**RUN, cell="eu")
    with _writing_with(monkeypatch, nxt):
        v2_bytes = events.run_ready(**RUN, cell="eu")

    topic = f"{topic_prefix}.runs.ten_v2"  # a run topic: the relay writes, the observer reads
    got_v2, got_v1 = _produce(kafka_bootstrap, topic, [v2_bytes, v1_bytes])

    next_reader, this_reader = SchemaRegistry(nxt), SchemaRegistry(this)
    assert got_v2[2:10] == next_reader.latest("RunReady").fingerprint != got_v1[2:10]

    # The next release reads its own v2 records whole ...
    _, v2 = next_reader.decode(got_v2)
    assert v2["cell"] == "eu"
    assert TRACEPARENT.fullmatch(v2["traceparent"])
    assert v2["traceparent"] == events.traceparent(RUN["run_id"], RUN["attempt"])
    # ... and this release's v1 records, the new fields at their defaults.
    _, from_v1 = next_reader.decode(got_v1)
    assert from_v1["traceparent"] is None and from_v1["cell"] is None
    assert {k: from_v1[k] for k in V1_FIELDS} == {k: v2[k] for k in V1_FIELDS}

    # This release, a v1 reader holding the staged file, reads v2 records as v1.
    _, as_v1 = this_reader.decode(got_v2)
    assert as_v1 == this_reader.decode(got_v1)[1]
    assert set(as_v1) == V1_FIELDS and as_v1["queue"] == "emails" and as_v1["attempt"] == 2

    # A release without the v2 file cannot: readers first.
    with pytest.raises(UndecodableRecord, match="unknown fingerprint"):
        SchemaRegistry(before).decode(got_v2)
    assert SchemaRegistry(before).decode(got_v1)[1] == as_v1


def test_traceparent__the_run_is_the_trace_each_attempt_a_span():
    run_id = RUN["run_id"]

    assert events.traceparent(run_id, 1) == f"00-{run_id}-0000000000000001-00"
    assert events.traceparent(run_id, 2).split("-")[1] == run_id
    other = events.traceparent("not-a-run-id", 1)
    assert TRACEPARENT.fullmatch(other) and other == events.traceparent("not-a-run-id", 1)
    assert "0" * 32 not in events.traceparent("0" * 32, 1)  # an all-zero trace id is invalid
