"""RunReady v2 (traceparent, cell) in the codec, both ways, without a broker.

This release writes v2; the release before it (v0.1.0) shipped the same file
staged (`staged.RunReady.v2.avsc`), so its readers decode v2 records as v1,
and this release's readers decode v1 records with the new fields at their
defaults. The same against the real broker and the previous release's own
tree: tests/integration/test_run_ready_v2.py, tests/upgrade/test_sdk_records.py."""

from __future__ import annotations

import re
import shutil

import pytest

from cronwheel.core import avro, events, schema_compat
from cronwheel.core.avro import SCHEMA_DIR, SchemaRegistry, UndecodableRecord
from cronwheel.sdk import worker
from cronwheel.store import new_runs

RUN = dict(
    run_id="0" * 31 + "1", tenant_id="ten_a", partition_id=7, attempt=2,
    scheduled_ms=1_767_225_600_000, created_ms=1_767_225_600_004, priority="high",
    target={"type": "queue", "queue": "emails"}, payload='{"to":"a@example.com"}',
)  # fmt: skip
V1 = {
    "run_id": RUN["run_id"], "tenant_id": "ten_a", "job_id": None, "workflow_run_id": None,
    "node": None, "attempt": 2, "scheduled_at": 1_767_225_600_000,
    "created_at": 1_767_225_600_004, "priority": "high", "target_type": "queue",
    "queue": "emails", "payload": '{"to":"a@example.com"}', "partition_id": 7, "covers": None,
}  # fmt: skip
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00")


@pytest.fixture
def previous(tmp_path) -> SchemaRegistry:
    """The schema folder of the release before this one: v2 staged."""
    for path in SCHEMA_DIR.glob("*.avsc"):
        name = "staged.RunReady.v2.avsc" if path.name == "RunReady.v2.avsc" else path.name
        shutil.copy(path, tmp_path / name)
    return SchemaRegistry(tmp_path)


def test_this_release__writes_v2_with_traceparent_and_cell():
    registry = avro.default_registry()
    written = events.run_ready(**RUN, cell="eu")

    assert registry.latest("RunReady").version == 2
    assert written[2:10] == registry.latest("RunReady").fingerprint
    assert registry.decode(written) == (
        "RunReady",
        {**V1, "traceparent": f"00-{RUN['run_id']}-0000000000000002-00", "cell": "eu"},
    )
    # A traceparent that came with the run is carried as it is.
    carried = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert registry.decode(events.run_ready(**RUN, trace=carried))[1]["traceparent"] == carried


def test_v2_record__the_previous_release_reads_it_as_v1(previous):
    v2 = events.run_ready(**RUN, cell="eu")
    v1 = avro.default_registry().encode("RunReady", V1, version=1)

    assert previous.latest("RunReady").version == 1
    assert previous.decode(v2) == ("RunReady", V1) == previous.decode(v1)


def test_v1_record__this_release_reads_it_with_the_new_fields_null():
    v1 = avro.default_registry().encode("RunReady", V1, version=1)

    assert v1[2:10].hex() == "1a7f7efbb2f6dbda"  # RunReady.v1.avsc's, docs/events.md
    assert avro.default_registry().decode(v1) == (
        "RunReady",
        {**V1, "traceparent": None, "cell": None},
    )


def test_a_release_without_the_v2_file__refuses_v2(tmp_path):
    for path in SCHEMA_DIR.glob("*.v1.avsc"):
        shutil.copy(path, tmp_path)
    v2 = events.run_ready(**RUN, cell="eu")

    with pytest.raises(UndecodableRecord, match="unknown fingerprint"):
        SchemaRegistry(tmp_path).decode(v2)


def test_sdk__decodes_v1_and_v2__traceparent_and_cell_on_the_run():
    v1 = avro.default_registry().encode("RunReady", V1, version=1)
    v2 = events.run_ready(**RUN, cell="eu")

    old, new = worker._decode(v1), worker._decode(v2)

    assert (old.traceparent, old.cell) == (None, None)
    assert new.traceparent == events.traceparent(RUN["run_id"], 2) and new.cell == "eu"
    for run in (old, new):
        assert (run.run_id, run.attempt, run.payload, run.priority) == (
            RUN["run_id"], 2, {"to": "a@example.com"}, "high",
        )  # fmt: skip


def test_compiled_writer__v2__same_bytes_as_fastavro():
    registry = avro.default_registry()
    for trace, cell in [(None, None), ("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01", "eu-west-é")]:
        datum = {**V1, "traceparent": trace, "cell": cell}
        assert avro.fast_writer("RunReady")(datum) == registry.encode("RunReady", datum)


def test_ready_row__names_the_cell_of_this_process(monkeypatch):
    monkeypatch.setenv("CRONWHEEL_CELL", "eu")
    new_runs.this_cell.cache_clear()
    try:
        row = new_runs.ready_row(
            "cw.runs.ten_a", 7, RUN["run_id"], "ten_a", 1, RUN["scheduled_ms"],
            RUN["created_ms"], "normal", "queue", "emails", "{}", job_id="job_1",
        )  # fmt: skip
    finally:
        new_runs.this_cell.cache_clear()

    _, datum = avro.default_registry().decode(row.value)
    assert datum["cell"] == "eu"
    assert datum["traceparent"] == f"00-{RUN['run_id']}-0000000000000001-00"


def test_traceparent__the_run_is_the_trace_each_attempt_a_span():
    run_id = RUN["run_id"]

    assert events.traceparent(run_id, 1) == f"00-{run_id}-0000000000000001-00"
    assert events.traceparent(run_id, 2).split("-")[1] == run_id
    other = events.traceparent("not-a-run-id", 1)
    assert TRACEPARENT.fullmatch(other) and other == events.traceparent("not-a-run-id", 1)
    assert "0" * 32 not in events.traceparent("0" * 32, 1)  # an all-zero trace id is invalid


def test_compatibility__v1_and_v2_read_each_other__a_staged_copy_beside_is_refused(tmp_path):
    findings = {f.subject: f for f in schema_compat.check(SCHEMA_DIR)}
    assert findings["RunReady v1 -> v2"].ok  # both directions, every pair (full transitive)

    shutil.copy(SCHEMA_DIR / "RunReady.v1.avsc", tmp_path)
    shutil.copy(SCHEMA_DIR / "RunReady.v2.avsc", tmp_path)
    shutil.copy(SCHEMA_DIR / "RunReady.v2.avsc", tmp_path / "staged.RunReady.v2.avsc")
    assert [str(f) for f in schema_compat.check(tmp_path) if not f.ok] == [
        "staged.RunReady.v2.avsc: same record and version as RunReady.v2.avsc"
    ]
