"""StartRun + CompleteRun one call at a time against start_many/complete_many,
in-process against the store (no HTTP, no Kafka): what the batch statements
save per run, for the platform's own workers and the batch routes.

    .venv/bin/python bench/bench_lifecycle_batch.py [--runs 3000] [--batch 32]
        [--history-days 0,30] [--history-per-day 20000]

Prints wall time and CPU per run of this process and of its PostgreSQL backend,
once per history: with `D` days of finished runs kept (one day partition each,
a week ahead made too), the worker protocol finds a run by its id alone,
within the days around now first (docs/migrations.md, "Finding a run without
its day"): what is left of the history's cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (  # noqa: E402
    cpu_seconds,
    fresh_database,
    keep_history,
    machine_load,
    say,
)
from cronwheel.core.clock import now_ms  # noqa: E402
from cronwheel.kafka import Topics  # noqa: E402
from cronwheel.store.jobs import Jobs, create_tenant  # noqa: E402
from cronwheel.store.lifecycle import CompleteCall, Lifecycle, StartCall  # noqa: E402


def make_runs(conn, jobs: Jobs, tenant: dict, n: int) -> list[str]:
    body = {
        "name": "b",
        "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
        "target": {"type": "queue", "queue": "q"},
    }
    job = jobs.create(conn, tenant, body, now_ms())
    t0 = now_ms() - 10_000
    return [jobs.trigger(conn, tenant, job["job_id"], t0 - k)["run_id"] for k in range(n)]


def measure(conn, label: str, work, n: int) -> None:
    backend = conn.info.backend_pid
    c0, b0, w0 = time.process_time(), cpu_seconds(backend), time.monotonic()
    work()
    c1, b1, w1 = time.process_time(), cpu_seconds(backend), time.monotonic()
    say(
        f"{label:<28} {n / (w1 - w0):8.0f} runs/s   CPU per run: this process "
        f"{(c1 - c0) / n * 1e6:6.0f} us, its backend {(b1 - b0) / n * 1e6:6.0f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--history-days", default="0", help="comma-separated, one case each")
    ap.add_argument("--history-per-day", type=int, default=20_000)
    a = ap.parse_args()
    say(f"load: {machine_load()}")
    for days in (int(d) for d in a.history_days.split(",")):
        one_history(a, days)
    say(f"load: {machine_load()}")


def one_history(a, days: int) -> None:
    with fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
        topics = Topics("bench")
        jobs, life = Jobs(topics), Lifecycle(topics)
        tenant = create_tenant(conn, "bench")
        t = tenant["tenant_id"]
        parts = keep_history(conn, t, days, a.history_per_day)
        say(f"history: {days} days of {a.history_per_day:,} runs, {parts} partitions of runs_daily")
        single, batched = (
            make_runs(conn, jobs, tenant, a.runs),
            make_runs(conn, jobs, tenant, a.runs),
        )
        conn.execute("VACUUM ANALYZE")
        tokens: dict[str, str] = {}

        def one_by_one() -> None:
            for r in single:
                tokens[r] = life.start(conn, t, r, "w", now_ms())["start_token"]
            for r in single:
                life.complete(conn, t, r, 1, tokens[r], "SUCCEEDED", now_ms())

        def in_batches() -> None:
            for i in range(0, len(batched), a.batch):
                part = batched[i : i + a.batch]
                got = life.start_many(conn, [StartCall(t, r, "w") for r in part], now_ms())
                life.complete_many(
                    conn,
                    [
                        CompleteCall(t, r, 1, g["start_token"], "SUCCEEDED")
                        for r, g in zip(part, got, strict=True)
                    ],
                    now_ms(),
                )

        measure(conn, "start + complete, alone", one_by_one, a.runs)
        measure(conn, f"start_many + complete_many/{a.batch}", in_batches, a.runs)


if __name__ == "__main__":
    main()
