"""What GET /v1/system costs the database (cronwheel/store/sql/system.sql):
each section's statement, as the operator role runs it, on a database with
--tenants tenants (1,000), --runs runs of history (300,000, finished, spread
over a day), --recent runs with instants in the last five minutes (50,000,
half still PENDING, some announced again), --outbox outbox rows (50,000) and
--timers job timers (200,000, 1,000 of them overdue), after VACUUM ANALYZE
as autovacuum would leave it. Prints the best and the median of --repeat
(20) runs of each section and of the whole answer, and the plan's shape
(EXPLAIN) of the two statements over runs. It prints figures and asserts
nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import psycopg

from bench.common import fresh_database, header, say, vacuum_analyze
from cronwheel import config
from cronwheel.core.clock import now_ms, to_dt
from cronwheel.store import roles, system
from cronwheel.store.sql_loader import queries

_TENANTS = """
INSERT INTO tenants (tenant_id, name, cell, priority_classes)
SELECT 'ten_' || lpad(g::text, 6, '0'), 'bench-' || g, 'local', '{normal}'
  FROM generate_series(1, %(n)s) AS g
"""
# History: finished runs over the last day; recent: instants in the last five
# minutes, created 0-99 ms after, half started, half PENDING (1 in 50
# announced again).
_RUNS = """
INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, scheduled_at, spec, state, attempt,
                  created_at, started_at, finished_at, updated_at, reannounced,
                  last_reannounced_at)
SELECT g %% 1024, 'run_' || md5(%(seed)s || g::text),
       'ten_' || lpad((1 + g %% %(tenants)s)::text, 6, '0'), 'job_' || (g %% 5000),
       s, '{}'::jsonb,
       CASE WHEN %(open)s AND g %% 2 = 1 THEN 'PENDING' ELSE 'SUCCEEDED' END::run_state, 1,
       s + interval '1 millisecond' * (g %% 100),
       CASE WHEN %(open)s AND g %% 2 = 1 THEN NULL ELSE s + interval '50 milliseconds' END,
       CASE WHEN %(open)s AND g %% 2 = 1 THEN NULL ELSE s + interval '1 second' END,
       s,
       CASE WHEN %(open)s AND g %% 100 = 1 THEN 1 END,
       CASE WHEN %(open)s AND g %% 100 = 1 THEN now() END
  FROM generate_series(1, %(n)s) AS g,
       LATERAL (SELECT now() - %(span)s * (g::float8 / %(n)s) AS s) t
"""
_OUTBOX = """
INSERT INTO outbox (partition_id, topic, key, value)
SELECT g %% 1024, 'cw.runs.ten_' || (g %% 1000), convert_to('r' || g, 'UTF8'), '\\x00'
  FROM generate_series(1, %(n)s) AS g
"""
_TIMERS = """
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, tenant_id)
SELECT g %% 1024, 'job:b' || g, 'job', 'b' || g,
       CASE WHEN g <= %(overdue)s THEN now() - interval '1 minute'
            ELSE now() + interval '1 second' * g END,
       g %% 4, 'ten_' || lpad((1 + g %% 1000)::text, 6, '0')
  FROM generate_series(1, %(n)s) AS g
"""


def load(url: str, args) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.monotonic()
        conn.execute(_TENANTS, {"n": args.tenants})
        day, five = "interval '1 day'", "interval '5 minutes'"
        for n, span, is_open in ((args.runs, day, False), (args.recent, five, True)):
            conn.execute(
                _RUNS.replace("%(span)s", span),
                {"seed": uuid.uuid4().hex, "n": n, "tenants": args.tenants, "open": is_open},
            )
        conn.execute(_OUTBOX, {"n": args.outbox})
        conn.execute(_TIMERS, {"n": args.timers, "overdue": 1000})
        say(f"loaded in {time.monotonic() - t0:.1f} s; vacuum analyze {vacuum_analyze(url):.1f} s")


def operator(conn: psycopg.Connection) -> None:
    conn.execute(queries("transactions")["gateway_role"])
    conn.execute(queries("transactions")["operator_role"])


def timed(url: str, fn, repeat: int) -> list[float]:
    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(repeat):
            with conn.transaction():
                operator(conn)
                t0 = time.perf_counter()
                fn(conn)
                out.append((time.perf_counter() - t0) * 1000)
    return out


def plan(url: str, name: str, params: dict) -> str:
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        operator(conn)
        rows = conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + system.Q[name], params
        ).fetchall()
    return "\n".join("    " + r[0] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=300_000)
    ap.add_argument("--recent", type=int, default=50_000)
    ap.add_argument("--outbox", type=int, default=50_000)
    ap.add_argument("--timers", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    header(
        f"GET /v1/system's statements: {args.tenants} tenants, {args.runs + args.recent} runs "
        f"({args.recent} in the last 5 min), {args.outbox} outbox rows, {args.timers} timers"
    )
    with fresh_database() as admin:
        load(admin, args)
        url = config.role_url(admin, roles.PLATFORM)
        window = 5 * 60_000
        sections = {
            "services": lambda c: system.services(c, now_ms(), "cw"),
            "outbox": lambda c: system.outbox(c, now_ms()),
            "timers": lambda c: system.overdue_timers(c, now_ms()),
            "lateness": lambda c: system.lateness(c, now_ms(), window),
            "runs": lambda c: system.open_runs(c, now_ms(), window),
            "all": lambda c: system.figures(c, now_ms(), window, "cw"),
        }
        for name, fn in sections.items():
            ms = timed(url, fn, args.repeat)
            say(f"{name:<9} best {min(ms):7.1f} ms  median {statistics.median(ms):7.1f} ms")
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            operator(conn)
            say(f"lateness: {system.lateness(conn, now_ms(), window)}")
            say(f"runs: {system.open_runs(conn, now_ms(), window)}")
        now = now_ms()
        say(
            "plan of lateness:\n"
            + plan(
                url,
                "lateness",
                {
                    "since": to_dt(now - window),
                    "now": to_dt(now),
                    "sample": system.SAMPLE,
                    "min_share": system.MIN_SHARE,
                },
            )
        )
        say("plan of open_runs:\n" + plan(url, "open_runs", {
            "since": to_dt(now - window), "cap": system.CAP}))  # fmt: skip


if __name__ == "__main__":
    main()
