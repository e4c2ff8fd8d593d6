import io
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import avro.io
import avro.schema
import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form

from cronwheel.core.avro import SCHEMA_DIR, SchemaRegistry, UndecodableRecord, default_registry

SAMPLES = {
    "RunReady": {
        "run_id": "run_01J9Z",
        "tenant_id": "acme",
        "job_id": None,
        "workflow_run_id": "wfr_7",
        "node": "extract",
        "attempt": 2,
        "scheduled_at": 1_767_225_600_123,
        "created_at": 1_767_225_600_130,
        "priority": "high",
        "target_type": "queue",
        "queue": "reports",
        "payload": '{"report": "daily", "n": 3}',
        "partition_id": 1023,
        "covers": [1_767_139_200_000, 1_767_225_600_123],
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "cell": "eu",
    },
    "RunCompleted": {
        "run_id": "run_01J9Z",
        "tenant_id": "acme",
        "job_id": "job_1",
        "workflow_run_id": None,
        "node": None,
        "attempt": 1,
        "state": "FAILED",
        "finished_at": 1_767_225_601_000,
        "partition_id": 5,
        "error": "exit code 3",
    },
    "DeadLetter": {
        "source_topic": "cronwheel.acme.runs",
        "source_partition": 3,
        "source_offset": 2**40,
        "key": b"run_01J9Z",
        "value": b"\x00\xffnot avro",
        "reason": "not single-object encoded",
        "consumer": "dispatcher",
        "at": 1_767_225_602_000,
    },
}
TIMESTAMP_FIELDS = {"scheduled_at", "created_at", "finished_at", "at"}


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO (Rabin) exactly as the Avro specification gives it."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def newest_schema_file(record: str) -> Path:
    return max(SCHEMA_DIR.glob(f"{record}.v*.avsc"), key=lambda p: int(p.name.split(".")[1][1:]))


def as_datetimes(datum: dict) -> dict:
    """What a plain Avro library returns: timestamp-millis as UTC datetimes."""

    def convert(ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    out = {k: convert(v) if k in TIMESTAMP_FIELDS else v for k, v in datum.items()}
    if out.get("covers") is not None:
        out["covers"] = [convert(ms) for ms in out["covers"]]
    return out


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    return default_registry()


def test_registry__loads_every_record(registry):
    assert set(SAMPLES) <= set(registry.records)


@pytest.mark.parametrize("record", SAMPLES)
def test_round_trip(registry, record):
    assert registry.decode(registry.encode(record, SAMPLES[record])) == (record, SAMPLES[record])


def test_round_trip__accepts_datetimes_and_omitted_nullable_fields(registry):
    datum = {k: v for k, v in SAMPLES["RunReady"].items() if k not in {"job_id", "node", "covers"}}
    datum["scheduled_at"] = datetime(2026, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)
    _, decoded = registry.decode(registry.encode("RunReady", datum))
    assert decoded["scheduled_at"] == 1_767_225_600_123
    assert decoded["job_id"] is None and decoded["covers"] is None


def test_encode__rejects_unknown_and_missing_fields(registry):
    with pytest.raises(ValueError):
        registry.encode("RunCompleted", {**SAMPLES["RunCompleted"], "colour": "red"})
    missing = {k: v for k, v in SAMPLES["RunCompleted"].items() if k != "state"}
    with pytest.raises(ValueError):
        registry.encode("RunCompleted", missing)
    with pytest.raises(KeyError):
        registry.encode("NoSuchRecord", {})


def test_crc64_avro__matches_spec_vectors():
    # The vectors Apache Avro's own test suites list, as little-endian bytes.
    assert crc64_avro(b'"int"').to_bytes(8, "little").hex() == "8f5c393f1ad57572"
    assert crc64_avro(b'"long"').to_bytes(8, "little").hex() == "b71df49344e154d0"


@pytest.mark.parametrize("record", SAMPLES)
def test_encode__starts_with_marker_and_little_endian_fingerprint(registry, record):
    schema = json.loads(newest_schema_file(record).read_text())
    canonical = to_parsing_canonical_form(schema)
    expected = crc64_avro(canonical.encode()).to_bytes(8, "little")

    data = registry.encode(record, SAMPLES[record])

    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == expected


def test_canonical_form__logical_types_reduce_to_their_primitive():
    # The spec (and Java) write {"type":"long","logicalType":...} as "long" in the
    # canonical form; Apache avro's Python package keeps {"type":"long"} and so
    # computes other fingerprints. Consumers must follow the spec.
    schema = json.loads(newest_schema_file("DeadLetter").read_text())
    assert '{"name":"at","type":"long"}' in to_parsing_canonical_form(schema)


@pytest.mark.parametrize("record", SAMPLES)
def test_body__any_avro_library_reads_it_from_the_schema_file(registry, record):
    text = newest_schema_file(record).read_text()
    body = registry.encode(record, SAMPLES[record])[10:]

    by_fastavro = fastavro.schemaless_reader(io.BytesIO(body), json.loads(text))
    reader = avro.io.DatumReader(avro.schema.parse(text))
    by_apache_avro = reader.read(avro.io.BinaryDecoder(io.BytesIO(body)))

    assert by_fastavro == as_datetimes(SAMPLES[record])
    assert by_apache_avro == as_datetimes(SAMPLES[record])


def test_decode__unknown_fingerprint__is_undecodable(registry):
    data = registry.encode("RunCompleted", SAMPLES["RunCompleted"])
    forged = data[:2] + bytes(8) + data[10:]
    with pytest.raises(UndecodableRecord, match="unknown fingerprint 0000000000000000"):
        registry.decode(forged)


@pytest.mark.parametrize(
    "data",
    [None, b"", b"\xc3\x01\x00", b'{"run_id": "r1"}', b"\x00" * 32],
    ids=["tombstone", "empty", "short", "json", "zeros"],
)
def test_decode__not_single_object__is_undecodable(registry, data):
    with pytest.raises(UndecodableRecord, match="not single-object encoded") as info:
        registry.decode(data)
    assert isinstance(info.value, ValueError)


def test_decode__truncated_or_padded_body__is_corrupt(registry):
    data = registry.encode("RunReady", SAMPLES["RunReady"])
    for bad in (data[:-3], data + b"\x00", data[:10] + b"\xff" * 40):
        with pytest.raises(UndecodableRecord, match="corrupt body"):
            registry.decode(bad)


def test_decode__old_version__reads_under_newer_reader(tmp_path):
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    shutil.copy(SCHEMA_DIR / "RunCompleted.v1.avsc", old_dir)
    shutil.copytree(old_dir, new_dir)
    v2 = json.loads((old_dir / "RunCompleted.v1.avsc").read_text())
    v2["fields"].append({"name": "exit_code", "type": ["null", "int"], "default": None})
    v2["fields"].append({"name": "lateness_ms", "type": "long", "default": -1})
    (new_dir / "RunCompleted.v2.avsc").write_text(json.dumps(v2))

    old_bytes = SchemaRegistry(old_dir).encode("RunCompleted", SAMPLES["RunCompleted"])
    new_registry = SchemaRegistry(new_dir)

    record, datum = new_registry.decode(old_bytes)
    assert record == "RunCompleted"
    assert datum == {**SAMPLES["RunCompleted"], "exit_code": None, "lateness_ms": -1}
    assert new_registry.encode("RunCompleted", datum)[2:10] != old_bytes[2:10]
