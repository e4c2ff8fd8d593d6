"""Schema evolution under a steady load (issue 25): the firing path's lateness
while run retention's backfill runs, and while its contract steps apply.

A steady load as bench_firing_steady's (1k jobs every second over ten
tenants, `cronwheel serve timer` and `cronwheel serve relay` as processes, a
reader of the run topics in this process), on a database migrated with the
expand steps only, as a platform mid-upgrade has it. After the warm-up,
three windows of `--window` seconds each: before, during, after; lateness
is scheduled_at -> readable by a consumer, per window.

- `backfill`: `--legacy-runs` (200,000) finished runs written to the legacy
  `runs` before the load starts, as rows older than migration 0025 are
  (the mirror held off), the backfill rewound; in the middle window
  `run_history.backfill` copies them (one process, batches of 1,000,
  unthrottled or at `--backfill-rate` runs/s), as `cronwheel backfill` does.
- `contract`: in the middle window `cronwheel migrate --contract` applies
  0030 and 0031 (the reverse mirror, then `runs` and `run_attempts`, go).

    .venv/bin/python bench/bench_evolution_load.py [--only backfill|contract]
        [--backfill-rate R]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from datetime import UTC, datetime

import psycopg
from common import (
    JobBatch,
    Reader,
    Services,
    bulk_jobs,
    check_like_create,
    create_tenants,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    load_runs,
    machine_load,
    now_ms,
    say,
    vacuum_analyze,
)

from cronwheel import run_history
from cronwheel.kafka import Topics
from cronwheel.store import migrate, runs_daily

JOBS = 1_000
EVERY_MS = 1_000
TENANTS = 10
WARMUP_MS = 20_000  # past fresh partitions' one-time stall (bench_kafka_floor.py)
SETTLE_MS = 15_000  # a record not readable this long after the last window counts as missing


def legacy_history(conn, tenant_id: str, n: int) -> None:
    """`n` finished runs in `runs` that the mirror never saw, the backfill rewound."""
    conn.execute("ALTER TABLE runs DISABLE TRIGGER USER")
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    load_runs(conn, "runs", tenant_id, n, max(1, n // 5), midnight)
    conn.execute("ALTER TABLE runs ENABLE TRIGGER USER")
    runs_daily.backfill_reset(conn)


def change(kind: str, url: str, rate: float | None) -> tuple[threading.Thread, dict]:
    """The change the middle window runs beside the load, in a thread."""
    told: dict = {}

    def run() -> None:
        began = time.perf_counter()
        if kind == "backfill":
            p = run_history.backfill(url, run_history.BackfillOptions(batch=1000, rate=rate))
            told["what"] = f"backfill copied {p.copied:,} runs" + (
                f" at --rate {rate:g}" if rate else ""
            )
        else:
            applied = migrate.migrate(url, contract=True)
            told["what"] = "applied " + ", ".join(f"{m.version:04d}_{m.name}" for m in applied)
        told["seconds"] = time.perf_counter() - began

    return threading.Thread(target=run, name=kind, daemon=True), told


def case(kind: str, window_ms: int, legacy_runs: int, rate: float | None) -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    with fresh_database(contract=False) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenants = create_tenants(conn, TENANTS)
            runs_daily.ensure_ahead(conn, datetime.now(UTC).date(), 7)
            if kind == "backfill":
                legacy_history(conn, tenants[0]["tenant_id"], legacy_runs)
        names = [topics.runs(t["tenant_id"]) for t in tenants]
        try:
            with Reader(names, decode=True) as reader, Services(url, prefix) as services:
                with psycopg.connect(url, autocommit=True) as conn:
                    batch = JobBatch(
                        JOBS, now_ms() - EVERY_MS, every_ms=EVERY_MS, spread_ms=EVERY_MS
                    )
                    seed = bulk_jobs(conn, tenants, batch)
                    check_like_create(conn, topics, tenants, batch, seed)
                vacuum_analyze(url)
                start = now_ms() + WARMUP_MS
                bounds = [start + i * window_ms for i in range(4)]
                thread, told = change(kind, url, rate)
                while now_ms() < bounds[1]:
                    services.check_alive()
                    time.sleep(0.05)
                thread.start()
                while now_ms() < bounds[3]:
                    services.check_alive()
                    time.sleep(0.1)
                thread.join()
                expected = JOBS * 3 * window_ms // EVERY_MS
                while True:
                    arrivals = [a for a in reader.snapshot() if start <= a.scheduled_ms < bounds[3]]
                    if len(arrivals) >= expected or now_ms() > bounds[3] + SETTLE_MS:
                        break
                    time.sleep(0.05)
                duplicates = reader.duplicates
        finally:
            delete_topics(names)
    say(
        f"{kind}: {told.get('what')} in {told.get('seconds', 0):.1f} s, started at the middle"
        f" window's start; {len(arrivals):,} of {expected:,} instants readable,"
        f" {duplicates} duplicate records"
    )
    for label, lo, hi in zip(("before", "during", "after"), bounds, bounds[1:], strict=False):
        got = [a for a in arrivals if lo <= a.scheduled_ms < hi]
        missing = [float("inf")] * (JOBS * window_ms // EVERY_MS - len(got))
        late = [a.received_ms - a.scheduled_ms for a in got] + missing
        say(f"{kind} {label:>6}: lateness scheduled_at -> readable: {describe(late)}")
    say(f"{kind}: machine after: {machine_load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["backfill", "contract"])
    parser.add_argument("--window", type=int, default=20, help="seconds per window (20)")
    parser.add_argument("--legacy-runs", type=int, default=200_000)
    parser.add_argument("--backfill-rate", type=float, help="runs/s (unthrottled)")
    args = parser.parse_args()
    header("bench_evolution_load: lateness while the backfill runs and the contract applies")
    for kind in ("backfill", "contract"):
        if args.only in (None, kind):
            case(kind, args.window * 1000, args.legacy_runs, args.backfill_rate)


if __name__ == "__main__":
    main()
