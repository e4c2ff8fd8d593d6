"""The compatibility check is full and transitive: every version of a record
against every other, not only each against the one before."""

from __future__ import annotations

import json

from cronwheel.core.avro import SCHEMA_DIR
from cronwheel.core.schema_compat import check


def _write(directory, version: int, fields: list[dict]) -> None:
    schema = json.loads((SCHEMA_DIR / "RunCompleted.v1.avsc").read_text())
    schema["fields"] = fields
    (directory / f"RunCompleted.v{version}.avsc").write_text(json.dumps(schema))


def test_each_step_compatible_but_v1_cannot_read_v3__fails(tmp_path):
    """v2 gives `state` a default, v3 drops it: v1 -> v2 and v2 -> v3 each
    resolve, but a v1 reader, which has no default for `state`, cannot read v3."""
    v1 = json.loads((SCHEMA_DIR / "RunCompleted.v1.avsc").read_text())["fields"]
    v2 = [dict(f, default="SUCCEEDED") if f["name"] == "state" else f for f in v1]
    v3 = [f for f in v1 if f["name"] != "state"]
    for n, fields in [(1, v1), (2, v2), (3, v3)]:
        _write(tmp_path, n, fields)

    findings = {f.subject: f for f in check(tmp_path)}

    assert findings["RunCompleted v1 -> v2"].ok
    assert findings["RunCompleted v2 -> v3"].ok
    problem = findings["RunCompleted v1 -> v3"].problem
    assert problem and problem.startswith("not forward compatible, v1 cannot read v3")
    assert "state" in problem


def test_real_schemas__every_pair_checked():
    findings = check(SCHEMA_DIR)

    versions: dict[str, int] = {}
    for path in SCHEMA_DIR.glob("*.avsc"):
        record, _, n = path.name.removesuffix(".avsc").rpartition(".v")
        versions[record] = max(versions.get(record, 0), int(n))
    pairs = sum(n * (n - 1) // 2 for n in versions.values())
    assert len([f for f in findings if "->" in f.subject]) == pairs
    assert all(f.ok for f in findings), [str(f) for f in findings if not f.ok]
