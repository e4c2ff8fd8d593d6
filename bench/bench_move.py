"""Moving a tenant between cells (cronwheel/moves.py, docs/cells.md "Moving a
tenant"): a tenant with --jobs jobs (1,000) and --runs finished runs of
history (100,000) moved from one cell's database to another's, both fresh
databases on the local stack's server, the directory a third. Prints the
move's total time, its steps' times and the freeze window (frozen_ms: from
the source's freeze to the target's activation, when the tenant's writes are
refused and nothing of it fires), --rounds times (2), each on new databases.

Nothing fires during the move here (no timer or relay runs): the figures are
the copy's and the protocol's own. The jobs fire every minute from their
creation; the runs are SUCCEEDED rows of those jobs, written by SQL. It
prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid

import psycopg

from bench.common import JobBatch, bulk_jobs, fresh_database, header, say, with_dbname
from cronwheel import config
from cronwheel.core.clock import now_ms
from cronwheel.moves import Mover
from cronwheel.store import directory as dirstore
from cronwheel.store import roles
from cronwheel.store.directory import CellInfo
from cronwheel.store.jobs import create_tenant

_RUNS = """
WITH js AS (SELECT row_number() OVER (ORDER BY job_id) - 1 AS i, partition_id, tenant_id, job_id
              FROM jobs)
INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, scheduled_at, spec, state, attempt,
                  created_at, started_at, finished_at, updated_at)
SELECT j.partition_id, 'run_' || md5(%(seed)s || g::text), j.tenant_id, j.job_id,
       now() - interval '1 minute' * g, '{}'::jsonb, 'SUCCEEDED', 1,
       now() - interval '1 minute' * g, now() - interval '1 minute' * g,
       now() - interval '1 minute' * g, now() - interval '1 minute' * g
  FROM generate_series(1, %(n)s) AS g
  JOIN js j ON j.i = g %% %(jobs)s
"""


@contextlib.contextmanager
def directory_database():
    admin = config.database_url()
    name = f"cw_bench_dir_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = with_dbname(admin, name)
        dirstore.migrate(url)
        dirstore.register_cells(
            url, [CellInfo(c, i, f"http://{c}.invalid", "-") for i, c in enumerate(("us", "eu"))]
        )
        yield config.role_url(url, roles.PLATFORM)  # may become the operator, as a router
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one_round(jobs: int, runs: int) -> None:
    with fresh_database() as us, fresh_database() as eu, directory_database() as directory:
        with psycopg.connect(us, autocommit=True) as conn:
            tenant = create_tenant(conn, "moving", "us")
            bulk_jobs(conn, [tenant], JobBatch(jobs, now_ms(), every_ms=60_000))
            with conn.transaction():
                conn.execute(_RUNS, {"seed": uuid.uuid4().hex, "n": runs, "jobs": jobs})
            conn.execute("VACUUM ANALYZE runs_daily")
        with psycopg.connect(directory, autocommit=True) as d:
            dirstore.place(d, tenant["tenant_id"], "us")
        mover = Mover(directory, {"us": us, "eu": eu})
        t0 = time.monotonic()
        move = mover.start(tenant["tenant_id"], "eu")
        steps = []
        while move.state not in ("done", "failed", "rolled_back"):
            s0 = time.monotonic()
            state = move.state
            move = mover.advance(move.move_id)
            steps.append(f"{state} {time.monotonic() - s0:.2f}s")
        total = time.monotonic() - t0
        say(
            f"jobs={jobs} runs={runs} state={move.state} total={total:.2f}s "
            f"frozen_ms={move.frozen_ms} steps: {', '.join(steps)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    header(f"a tenant moved between two cells' databases ({args.jobs} jobs, {args.runs} runs)")
    for _ in range(args.rounds):
        one_round(args.jobs, args.runs)


if __name__ == "__main__":
    main()
