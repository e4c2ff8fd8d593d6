"""What RunReady v2 costs per run against v1: the firing loop builds one record
per fired run (cronwheel/store/new_runs.py ready_row), so a firing storm pays
it per run. v2 adds two fields: the run's traceparent, computed from the run
id and the attempt (cronwheel/core/events.py), and the cell.

- the encoding: one run's datum through the compiled v1 writer (what v0.1.0
  wrote) and, with the two fields, through the v2 writer;
- the traceparent alone;
- and events.run_ready whole (datum, traceparent, encoding), as ready_row calls it.

No database, no broker: best of five rounds of 200,000 calls each (the
machine is shared: the load is printed first). Prints figures; asserts nothing.
"""

from __future__ import annotations

import timeit

from common import header, say

from cronwheel.core import events
from cronwheel.core.avro import SCHEMA_DIR, SchemaVersion, compile_writer, default_registry

CALLS = 200_000
ROUNDS = 5
RUN = dict(
    run_id="3fa" + "b5" * 14 + "c", tenant_id="ten_0123456789abcdef0123", partition_id=1018,
    attempt=1, scheduled_ms=1_767_225_600_000, created_ms=1_767_225_600_004,
    priority="normal", target_type="queue", queue="emails", payload='{"n":1}',
    job_id="job_0123456789abcdef0123",
)  # fmt: skip


def per_call_us(fn) -> float:
    return min(timeit.repeat(fn, number=CALLS, repeat=ROUNDS)) / CALLS * 1e6


def main() -> None:
    header("bench_run_ready: a RunReady per run, v1 (v0.1.0's) against v2")
    v2_datum = default_registry().decode(events.run_ready(**RUN, cell="local"))[1]
    v1_datum = {k: v for k, v in v2_datum.items() if k not in ("traceparent", "cell")}
    write_v1 = compile_writer(SchemaVersion.load(SCHEMA_DIR / "RunReady.v1.avsc"))
    write_v2 = compile_writer(default_registry().latest("RunReady"))
    v1 = per_call_us(lambda: write_v1(v1_datum))
    v2 = per_call_us(lambda: write_v2(v2_datum))
    trace = per_call_us(lambda: events.traceparent(RUN["run_id"], 1))
    whole = per_call_us(lambda: events.run_ready(**RUN, cell="local"))
    size1, size2 = len(write_v1(v1_datum)), len(write_v2(v2_datum))
    say(f"  encode v1: {v1:.2f} us per run, {size1} bytes")
    say(
        f"  encode v2: {v2:.2f} us per run, {size2} bytes ({v2 - v1:+.2f} us, {size2 - size1:+d} B)"
    )
    say(f"  traceparent: {trace:.2f} us per run")
    say(f"  events.run_ready (v2, whole): {whole:.2f} us per run")


if __name__ == "__main__":
    main()
