"""Run retention (issue 25; docs/migrations.md, "Worked example: run
retention"), three figures:

1. backfill: on a database without the contract steps (the backfill's
   source, `runs`, is what they drop), `--backfill-runs` (200,000) finished
   runs, each with one attempt, written to `runs` with the mirror triggers
   off (as rows older than migration 0025 are), then copied by the backfill
   (cronwheel run_history.backfill, unthrottled) at two batch sizes: runs/s.
2. drop: a day partition of `--day-runs` runs (100,000, then 10x that) past
   the horizon, with 10 runs still RUNNING, dropped by a retention pass: the
   drop's transaction in ms (the time the parents' lock is held), which does
   not grow with the day's rows. A day at 1,000 runs/s is 86.4 M runs: too
   big for this box; the figure at two sizes shows the cost is the catalog
   work and the files' unlink, not the rows.
3. storm: the firing storm (bench/bench_firing_storm's `storm`, `--storm`
   one-off jobs due at one instant) on a fresh database, then on one holding
   `--history-days` (7) days of `--history-per-day` (100,000) runs in
   runs_daily (its day partitions made): runs/s end to end.
4. lookup: a recent run found by its key in runs_daily without its day,
   with it, and within the last two days; read and one-row update, p50/p99.
5. overlap: the firing loop's plan of `--overlap-jobs` (200) jobs
   (`jobs_for_timers`), whose `has_active` probes every day for a job with
   overlap `skip`, with no history and with `--history-days` of it: the
   database backend's CPU per job planned, `allow` and `skip`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from common import (
    Reader,
    Services,
    cpu_seconds,
    create_tenants,
    delete_topics,
    fresh_database,
    grant,
    header,
    keep_history,
    load_runs,
    say,
    storm,
    vacuum_analyze,
)

from cronwheel import run_history
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store import jobs as job_store
from cronwheel.store import pgarrays, runs_daily

# An attempt for each run, with its run's scheduled_at and tenant_id.
_ATTEMPTS = """
INSERT INTO run_attempts_daily (partition_id, run_id, attempt, worker_id, started_at,
                                finished_at, outcome, scheduled_at, tenant_id)
SELECT partition_id, run_id, 1, 'bench', started_at, finished_at, 'SUCCEEDED', scheduled_at,
       tenant_id
  FROM runs_daily
"""
# The same in the legacy tables, for the backfill to copy.
_LEGACY_ATTEMPTS = """
INSERT INTO run_attempts (partition_id, run_id, attempt, worker_id, started_at, finished_at,
                          outcome)
SELECT partition_id, run_id, 1, 'bench', started_at, finished_at, 'SUCCEEDED' FROM runs
"""


def bench_backfill(n: int) -> None:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for batch in (1000, 5000):
        with (
            fresh_database(contract=False) as url,
            psycopg.connect(url, autocommit=True) as conn,
        ):
            tenant = create_tenants(conn, 1)[0]["tenant_id"]
            conn.execute("ALTER TABLE runs DISABLE TRIGGER USER")
            conn.execute("ALTER TABLE run_attempts DISABLE TRIGGER USER")
            load_runs(conn, "runs", tenant, n, max(1, n // 5), today)
            conn.execute(_LEGACY_ATTEMPTS)
            conn.execute("ALTER TABLE runs ENABLE TRIGGER USER")
            conn.execute("ALTER TABLE run_attempts ENABLE TRIGGER USER")
            runs_daily.backfill_reset(conn)
            vacuum_analyze(url)
            began = time.perf_counter()
            p = run_history.backfill(url, run_history.BackfillOptions(batch=batch))
            took = time.perf_counter() - began
            assert p.done and p.copied == n, p
            say(
                f"backfill: {n:,} runs and {p.copied_attempts:,} attempts over 5 days, batch"
                f" {batch}: {took:.1f} s, {n / took:,.0f} runs/s (one process, unthrottled;"
                " day partitions made on the way)"
            )


def bench_drop(sizes: list[int]) -> None:
    now = datetime.now(UTC)
    day = (now - timedelta(days=40)).date()
    for n in sizes:
        with fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
            tenant = create_tenants(conn, 1)[0]["tenant_id"]
            runs_daily.ensure_days(conn, [day])
            until = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
            began = time.perf_counter()
            load_runs(conn, "runs_daily", tenant, n, n, until)
            load_runs(conn, "runs_daily", tenant, 10, 10, until, state="RUNNING")
            loaded = time.perf_counter() - began
            vacuum_analyze(url)
            size = conn.execute(
                "SELECT pg_total_relation_size(%s)", [runs_daily.runs_part(day)]
            ).fetchone()[0]
            p = run_history.retention_pass(url, default_days=30, ahead_days=1)
            [d] = p.dropped
            kept = conn.execute("SELECT count(*) FROM runs_daily_default").fetchone()[0]
            say(
                f"drop: a day of {n:,} runs ({size / 2**20:,.0f} MiB with its indexes; loaded"
                f" in {loaded:.1f} s): detached with its {d.kept_runs} RUNNING runs kept in"
                f" {d.seconds * 1000:.1f} ms (the parents' lock held that long), its tables"
                f" dropped in {d.drop_seconds * 1000:.1f} ms after; kept in the default"
                f" partition: {kept}"
            )


def bench_storm(jobs: int, days: int, per_day: int) -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    names: list[str] = []
    try:
        for history in (0, days):
            with fresh_database() as url:
                with psycopg.connect(url, autocommit=True) as conn:
                    tenants = create_tenants(conn, 10)
                    if history:
                        today = datetime.now(UTC).date()
                        runs_daily.ensure_days(
                            conn, [today - timedelta(days=i) for i in range(1, history + 1)]
                        )
                        midnight = datetime.combine(today, datetime.min.time(), tzinfo=UTC)
                        load_runs(conn, "runs_daily", tenants[0]["tenant_id"], history * per_day,
                              per_day, midnight)  # fmt: skip
                        conn.execute(_ATTEMPTS)
                    runs_daily.ensure_ahead(conn, datetime.now(UTC).date(), 1)
                    n_runs = conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0]
                vacuum_analyze(url)
                names = [topics.runs(t["tenant_id"]) for t in tenants]
                with Reader(names) as reader, Services(url, prefix) as services:
                    # VACUUM (ANALYZE) after the jobs' insert reads the
                    # history too: it must end before the instant.
                    lead_ms = 3000 + n_runs // 50
                    r = storm(url, services, reader, tenants, topics, jobs, lead_ms=lead_ms)
                case = f"{history} days of history"
                say(
                    f"storm {jobs // 1000}k, {case} ({n_runs:,} runs in runs_daily):"
                    f" {r.rate:,.0f} runs/s end to end"
                )
                for line in r.lines(f"storm {jobs // 1000}k, {case}"):
                    say("  " + line)
                delete_topics(names)
                names = []
    finally:
        if names:
            delete_topics(names)


# The three ways of finding one run, each a read and a heartbeat-shaped update.
_LOOKUPS = {
    "runs_daily, without the day": (
        "{verb} runs_daily {set} WHERE partition_id = %(p)s AND run_id = %(run_id)s"
    ),
    "runs_daily, with the day": (
        "{verb} runs_daily {set} WHERE partition_id = %(p)s AND run_id = %(run_id)s"
        " AND scheduled_at = %(at)s"
    ),
    "runs_daily, the last two days": (
        "{verb} runs_daily {set} WHERE partition_id = %(p)s AND run_id = %(run_id)s"
        " AND scheduled_at >= now() - interval '2 days'"
    ),
}
_VERBS = {
    "read": ("SELECT state, attempt, scheduled_at FROM", ""),
    "update": ("UPDATE", "SET updated_at = now()"),
}


def bench_lookup(days: int, per_day: int, calls: int) -> None:
    with fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
        tenant = create_tenants(conn, 1)[0]["tenant_id"]
        parts = keep_history(conn, tenant, days, per_day)
        midnight = datetime.combine(datetime.now(UTC).date(), datetime.min.time(), tzinfo=UTC)
        vacuum_analyze(url)
        # Recent runs (the last day), as a worker's StartRun and heartbeats find
        # them; the same keys for every way.
        keys = conn.execute(
            "SELECT partition_id, run_id, scheduled_at FROM runs_daily"
            " WHERE scheduled_at >= %s ORDER BY random() LIMIT %s",
            [midnight - timedelta(days=1), calls],
        ).fetchall()
        for verb, (head, tail) in _VERBS.items():
            for way, shape in _LOOKUPS.items():
                sql = shape.format(verb=head, set=tail)
                took = []
                with conn.transaction(force_rollback=True):
                    for i, (p, run_id, at) in enumerate(keys):
                        began = time.perf_counter()
                        cur = conn.execute(sql, {"p": p, "run_id": run_id, "at": at}, prepare=True)
                        found = cur.rowcount if verb == "update" else len(cur.fetchall())
                        if i >= 20:  # after the custom plans and the cache's warm-up
                            took.append(time.perf_counter() - began)
                        assert found == 1, (way, run_id, found)
                took.sort()
                say(
                    f"lookup {verb}, {way}: p50 {took[len(took) // 2] * 1e6:,.0f} us,"
                    f" p99 {took[int(len(took) * 0.99)] * 1e6:,.0f} us"
                    f" ({len(took):,} calls; {days * per_day:,} runs in {parts} partitions,"
                    " the default one of them)"
                )


def bench_overlap(n_jobs: int, days: int, per_day: int, calls: int = 200) -> None:
    for history in (0, days):
        with fresh_database() as url, psycopg.connect(url, autocommit=True) as conn:
            tenant = create_tenants(conn, 1)[0]
            parts = keep_history(conn, tenant["tenant_id"], history, per_day)
            jobs = job_store.Jobs(Topics("bench"))
            made = {
                overlap: [
                    jobs.create(conn, tenant, {
                        "name": f"{overlap}-{i}",
                        "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC", "overlap": overlap},
                        "target": {"type": "queue", "queue": "q"},
                    }, now_ms())["job_id"]
                    for i in range(n_jobs)
                ]
                for overlap in ("allow", "skip")
            }  # fmt: skip
            vacuum_analyze(url)
            for overlap, ids in made.items():
                keys = conn.execute(
                    "SELECT partition_id, job_id FROM jobs WHERE job_id = ANY(%s)", [ids]
                ).fetchall()
                args = {
                    "partitions": pgarrays.int2_array([p for p, _j in keys]),
                    "job_ids": pgarrays.text_array([j for _p, j in keys]),
                }
                assert len(conn.execute(job_store.Q["jobs_for_timers"], args).fetchall()) == n_jobs
                b0 = cpu_seconds(conn.info.backend_pid)
                for _ in range(calls):
                    conn.execute(job_store.Q["jobs_for_timers"], args).fetchall()
                per_job = (cpu_seconds(conn.info.backend_pid) - b0) / calls / n_jobs
                say(
                    f"overlap {overlap}, {history} days of history ({parts} partitions):"
                    f" {per_job * 1e6:.1f} us of backend CPU per job planned"
                    f" ({calls} plans of {n_jobs} jobs)"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backfill-runs", type=int, default=200_000)
    ap.add_argument("--day-runs", type=int, default=100_000)
    ap.add_argument("--storm", type=int, default=10_000)
    ap.add_argument("--history-days", type=int, default=7)
    ap.add_argument("--history-per-day", type=int, default=100_000)
    ap.add_argument("--lookup-calls", type=int, default=3000)
    ap.add_argument("--overlap-jobs", type=int, default=200)
    ap.add_argument(
        "--only", choices=["backfill", "drop", "storm", "lookup", "overlap"], default=None
    )
    args = ap.parse_args()
    header(
        "bench_retention: run history by day (backfill, drop, storm with history, lookup, overlap)"
    )
    if args.only in (None, "backfill"):
        bench_backfill(args.backfill_runs)
    if args.only in (None, "drop"):
        bench_drop([args.day_runs, args.day_runs * 10])
    if args.only in (None, "storm"):
        bench_storm(args.storm, args.history_days, args.history_per_day)
    if args.only in (None, "lookup"):
        bench_lookup(args.history_days, args.history_per_day, args.lookup_calls)
    if args.only in (None, "overlap"):
        bench_overlap(args.overlap_jobs, args.history_days, args.history_per_day)


if __name__ == "__main__":
    main()
