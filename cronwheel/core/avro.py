"""Avro single-object encoding of the events on Kafka.

Every value is ``C3 01`` + the writer schema's 8-byte little-endian CRC-64-AVRO
fingerprint + the Avro binary body (the Avro spec's "single-object encoding"),
so any Avro library holding the files in ``schemas/`` can decode it without a
schema registry service. Schemas are files named ``<Record>.v<N>.avsc``; a
record is always written with its newest version and read as it too, records
written under any other version being resolved to it, so a consumer holding
the files reads old and new records alike (``cronwheel.core.schema_compat``
checks that every version can be resolved to and from every other).

Readers first: a reader finds the writer's schema by the fingerprint in the
record, so a consumer without a version's file cannot read what is written
with it. A new version therefore ships staged, as ``staged.<Record>.v<N>.avsc``:
this release's consumers decode records written with it (read as the newest
published version, its new fields dropped) while every producer goes on
writing the published one. The next release, once no running consumer lacks
the file, renames it to ``<Record>.v<N>.avsc`` (the content, and so the
fingerprint, unchanged) and writes it.

Decoded datums carry the wire values: timestamps are ``int`` milliseconds since
the epoch (UTC), so decoding and re-encoding is exact. ``encode`` accepts those
ints or timezone-aware ``datetime`` objects.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

NAMESPACE = "dev.cronwheel"
# The checkout's schemas/; an installed copy (a container image) names its own
# with CRONWHEEL_SCHEMAS.
SCHEMA_DIR = Path(
    os.environ.get("CRONWHEEL_SCHEMAS") or Path(__file__).resolve().parents[2] / "schemas"
)
MARKER = b"\xc3\x01"
HEADER_SIZE = len(MARKER) + 8
SCHEMA_FILE = re.compile(
    r"(?P<staged>staged\.)?(?P<record>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc"
)


class UndecodableRecord(ValueError):
    """Bytes that no version of any schema can decode: a poison message to dead-letter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_schema_filename(filename: str) -> tuple[str, int] | None:
    """``"RunReady.v2.avsc"`` (or ``"staged.RunReady.v2.avsc"``) -> ``("RunReady", 2)``;
    None if the name breaks the rule."""
    match = SCHEMA_FILE.fullmatch(filename)
    return (match["record"], int(match["version"])) if match else None


def is_staged(filename: str) -> bool:
    """A version shipped for reading only, not written yet (readers first)."""
    match = SCHEMA_FILE.fullmatch(filename)
    return bool(match and match["staged"])


def schema_fingerprint(schema: Mapping[str, Any]) -> bytes:
    """The CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form, in the
    little-endian byte order the single-object header carries."""
    # fastavro already returns the hex of the little-endian bytes, as Java does.
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def _without_logical_types(schema: Any) -> Any:
    """The schema with its logicalType annotations dropped, so fastavro reads
    timestamps as the ints on the wire instead of converting them to datetimes."""
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(s) for s in schema]
    return schema


@dataclass(frozen=True)
class SchemaVersion:
    """One schema file, parsed once: for writing, for reading, and its header."""

    record: str
    version: int
    path: Path
    schema: dict[str, Any]  # the file's JSON, as written
    fingerprint: bytes  # 8 bytes, little-endian
    header: bytes  # MARKER + fingerprint
    writer: dict[str, Any]  # parsed, logical types kept
    reader: dict[str, Any]  # parsed, logical types dropped

    @classmethod
    def load(cls, path: Path) -> SchemaVersion:
        parsed_name = parse_schema_filename(path.name)
        if parsed_name is None:
            raise ValueError(f"{path}: schema files are named <Record>.v<N>.avsc")
        record, version = parsed_name
        schema = json.loads(path.read_text(encoding="utf-8"))
        fullname = f"{schema.get('namespace')}.{schema.get('name')}"
        if schema.get("type") != "record" or fullname != f"{NAMESPACE}.{record}":
            raise ValueError(f"{path}: expected record {NAMESPACE}.{record}, found {fullname}")
        fp = schema_fingerprint(schema)
        # Separate named-schema tables: v1 and v2 of a record share one full name.
        return cls(
            record=record,
            version=version,
            path=path,
            schema=schema,
            fingerprint=fp,
            header=MARKER + fp,
            writer=parse_schema(schema, named_schemas={}),
            reader=parse_schema(_without_logical_types(schema), named_schemas={}),
        )


class SchemaRegistry:
    """Every schema file of a directory, indexed by record name and by fingerprint."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else SCHEMA_DIR
        versions = [SchemaVersion.load(p) for p in sorted(self.directory.glob("*.avsc"))]
        if not versions:
            raise ValueError(f"no *.avsc schema files in {self.directory}")
        self._by_fingerprint = {v.fingerprint: v for v in versions}
        self._versions = {(v.record, v.version): v for v in versions}
        self._latest: dict[str, SchemaVersion] = {}
        for v in versions:
            if is_staged(v.path.name):
                continue
            if v.record not in self._latest or v.version > self._latest[v.record].version:
                self._latest[v.record] = v
        if staged_only := {v.record for v in versions} - set(self._latest):
            raise ValueError(f"{self.directory}: only staged versions of {sorted(staged_only)}")

    @property
    def records(self) -> list[str]:
        return sorted(self._latest)

    def latest(self, record_name: str) -> SchemaVersion:
        """The newest published version of the record: the one written and read as."""
        try:
            return self._latest[record_name]
        except KeyError:
            raise KeyError(f"no schema for record {record_name!r} in {self.directory}") from None

    def encode(
        self, record_name: str, datum: Mapping[str, Any], *, version: int | None = None
    ) -> bytes:
        """Single-object encoding of ``datum`` under the newest published version
        of the record, or under `version`, staged or older (what a release that
        writes that version sends: tests of mixed releases use it).

        Raises ``ValueError`` if a field is unknown or a field without a default is missing.
        """
        if version is None:
            chosen = self.latest(record_name)
        else:
            chosen = self._versions.get((record_name, version))
            if chosen is None:
                raise KeyError(f"no {record_name} v{version} in {self.directory}")
        out = io.BytesIO()
        out.write(chosen.header)
        schemaless_writer(out, chosen.writer, datum, strict_allow_default=True)
        return out.getvalue()

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """``(record name, datum)``, read as the newest published version of the
        writer's record.

        Raises ``UndecodableRecord`` for anything that is not a whole, valid record.
        """
        if not data or len(data) < HEADER_SIZE or data[: len(MARKER)] != MARKER:  # None: tombstone
            raise UndecodableRecord("not single-object encoded")
        fp = bytes(data[len(MARKER) : HEADER_SIZE])
        writer = self._by_fingerprint.get(fp)
        if writer is None:
            raise UndecodableRecord(f"unknown fingerprint {fp.hex()}")
        reader = self._latest[writer.record]
        body = io.BytesIO(data[HEADER_SIZE:])
        try:
            datum = schemaless_reader(
                body, writer.reader, None if reader is writer else reader.reader
            )
        except Exception as exc:  # any failure on untrusted bytes means the body is bad
            raise UndecodableRecord(f"corrupt body: {exc!r}") from exc
        trailing = len(data) - HEADER_SIZE - body.tell()
        if trailing:
            raise UndecodableRecord(f"corrupt body: {trailing} bytes after the record")
        return writer.record, datum


# -- a compiled writer for the hot records -----------------------------------


def _varint(n: int) -> bytes:
    """Avro's zig-zag varint of an int or long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Lengths, partitions, attempts and the instants a batch shares (its `now`,
# a herd's scheduled instant) repeat: remembered, they cost a lookup.
_long = functools.lru_cache(maxsize=8192)(_varint)


def _string(s: str) -> bytes:
    b = s.encode()
    return _long(len(b)) + b


def _long_array(items) -> bytes:
    items = list(items)
    if not items:
        return b"\x00"
    return _long(len(items)) + b"".join(_long(i) for i in items) + b"\x00"


_PRIMITIVES = {"string": _string, "int": _long, "long": _long}


def _field_writer(ftype: Any) -> Callable[[Any], bytes] | None:
    """The encoder of one field type, or None when it is not one this writer
    knows (then the record is encoded by fastavro)."""
    if isinstance(ftype, dict):
        if ftype.get("type") == "array":
            items = ftype["items"]
            items = items.get("type") if isinstance(items, dict) else items
            return _long_array if items in ("int", "long") else None
        ftype = ftype.get("type")
    if isinstance(ftype, str):
        return _PRIMITIVES.get(ftype)
    if isinstance(ftype, list) and len(ftype) == 2 and ftype[0] == "null":
        inner = _field_writer(ftype[1])
        if inner is None:
            return None
        return lambda v: b"\x00" if v is None else b"\x02" + inner(v)
    return None


def compile_writer(version: SchemaVersion) -> Callable[[Mapping[str, Any]], bytes] | None:
    """A plain-Python single-object encoder of a record made only of strings,
    ints, longs, arrays of those and ["null", one of those] unions: the bytes
    fastavro writes (tests compare them), in about a third of its time per
    record (a firing storm encodes a RunReady per run). None for any other
    shape. Every field must be in the datum; extra keys are not checked: it
    serves records the code builds, not input."""
    plan = []
    for f in version.schema["fields"]:
        writer = _field_writer(f["type"])
        if writer is None:
            return None
        plan.append((f["name"], writer))
    header = version.header

    def encode(datum: Mapping[str, Any]) -> bytes:
        return header + b"".join([w(datum[name]) for name, w in plan])

    return encode


@functools.cache
def fast_writer(record_name: str) -> Callable[[Mapping[str, Any]], bytes]:
    """The newest version's compiled writer, or the registry's encode."""
    version = default_registry().latest(record_name)
    compiled = compile_writer(version)
    if compiled is not None:
        return compiled
    return functools.partial(default_registry().encode, record_name)


@functools.cache
def default_registry() -> SchemaRegistry:
    """The registry of the project's ``schemas/`` directory, loaded once per process."""
    return SchemaRegistry()
