"""Check that every schema version of a record can read, and be read by, every
other version of it: full transitive compatibility.

Producers and consumers upgrade in any order and a customer's worker may lag
several releases, so each ``<Record>.v<N>.avsc`` must be backward compatible
with every older version (a new reader reads old records, e.g. ones still on a
topic) and forward compatible with them (an old reader reads new records, e.g.
a consumer not yet upgraded), not only with the one before: v1 -> v2 and v2 ->
v3 each fine can still leave v1 unable to read v3 (a field v2 gave a default
and v3 made required again). fastavro has no such checker; Apache avro's
``ReaderWriterCompatibilityChecker`` checks one reader against one writer (its
Python package has no transitive mode, as Java's SchemaValidatorBuilder has),
so every pair is checked both ways.

Usage: ``python -m cronwheel.core.schema_compat [DIR]`` (default: ``schemas/``);
prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from cronwheel.core.avro import NAMESPACE, SCHEMA_DIR, parse_schema_filename


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, and the problem if there is one."""

    subject: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def __str__(self) -> str:
        return f"{self.subject}: {self.problem or 'ok'}"


def _incompatibility(reader: avro.schema.Schema, writer: avro.schema.Schema) -> str | None:
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return None
    kinds = ", ".join(sorted({i.value for i in result.incompatibilities}))
    where = ", ".join(sorted(result.locations - {"/"})) or "/"
    return f"{kinds} ({', '.join(sorted(result.messages))} at {where})"


def _load(path: Path, record: str) -> tuple[avro.schema.Schema | None, str | None]:
    try:
        schema = avro.schema.parse(path.read_text(encoding="utf-8"))
    except (avro.errors.AvroException, ValueError) as exc:
        return None, f"does not parse: {exc}"
    expected = f"{NAMESPACE}.{record}"
    if schema.type != "record" or schema.fullname != expected:
        return (
            None,
            f"defines {schema.type} {getattr(schema, 'fullname', '?')}, expected record {expected}",
        )
    return schema, None


def _pair(
    record: str, older: int, old: avro.schema.Schema, newer: int, new: avro.schema.Schema
) -> Finding:
    pair = f"{record} v{older} -> v{newer}"
    backward = _incompatibility(reader=new, writer=old)
    forward = _incompatibility(reader=old, writer=new)
    problems = []
    if backward:
        problems.append(f"not backward compatible, v{newer} cannot read v{older}: {backward}")
    if forward:
        problems.append(f"not forward compatible, v{older} cannot read v{newer}: {forward}")
    return Finding(pair, "; ".join(problems) or None)


def check(directory: Path | str = SCHEMA_DIR) -> list[Finding]:
    """Every finding for the ``*.avsc`` files of ``directory``, in a stable order."""
    directory = Path(directory)
    findings: list[Finding] = []
    versions: dict[str, dict[int, Path]] = defaultdict(dict)
    for path in sorted(directory.glob("*.avsc")):
        parsed = parse_schema_filename(path.name)
        if parsed is None:
            findings.append(Finding(path.name, "name must be <Record>.v<N>.avsc, N from 1"))
        elif (twin := versions[parsed[0]].get(parsed[1])) is not None:
            # A staged file and its published one: the staged one should have
            # been renamed, not copied (one of the two would go unchecked).
            findings.append(Finding(path.name, f"same record and version as {twin.name}"))
        else:
            versions[parsed[0]][parsed[1]] = path
    if not versions and not findings:
        findings.append(Finding(str(directory), "no *.avsc schema files"))

    for record, by_number in sorted(versions.items()):
        numbers = sorted(by_number)
        if numbers != list(range(1, len(numbers) + 1)):
            findings.append(
                Finding(record, f"versions must run 1..N without gaps, found {numbers}")
            )
            continue
        loaded: dict[int, avro.schema.Schema] = {}
        for n in numbers:
            schema, problem = _load(by_number[n], record)
            if problem:
                findings.append(Finding(by_number[n].name, problem))
                break
            loaded[n] = schema
        else:
            findings.append(Finding(f"{record} v1"))
            for newer in numbers[1:]:
                for older in range(1, newer):
                    findings.append(_pair(record, older, loaded[older], newer, loaded[newer]))
    return findings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1:
        print("usage: python -m cronwheel.core.schema_compat [DIR]", file=sys.stderr)
        return 2
    findings = check(args[0] if args else SCHEMA_DIR)
    for finding in findings:
        print(finding)
    failed = [f for f in findings if not f.ok]
    if failed:
        print(
            f"FAILED: {len(failed)} schema problem(s). Evolve schemas additively: new fields "
            "need a default; removing a field needs a new record name.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
