"""No code the platform or its SDK runs asks offsets through the admin
client's list_offsets (or delete_records, which looks up leaders the same
way): librdkafka's admin leader lookup races its main thread and crashed the
dispatcher with SIGSEGV (docs/dispatcher.md, "The SIGSEGV found";
bench/bench_offsets_race.py). Offsets are asked through kafka.end_offsets and
kafka.start_offsets, a consumer's offsets_for_times."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r"\.(list_offsets|delete_records)\(")


def test_no_admin_leader_lookup_calls_in_what_runs():
    calls = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for top in ("cronwheel", "services")
        for path in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if CALL.search(line) and not line.lstrip().startswith("#")
    ]
    assert calls == [], "ask offsets through kafka.end_offsets/start_offsets:\n" + "\n".join(calls)


def test_the_check_finds_such_a_call():
    assert CALL.search("futures = admin.list_offsets({tp: spec}, request_timeout=3)")
    assert CALL.search("admin_client.delete_records([tp])")
    assert not CALL.search("kafka.end_offsets(client, keys)")
