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
- `expand`: a release runs the load (`--release`, v0.3.0: its timer, relay
  and workers, from its tree as make test-upgrade exports it) on a database
  migrated with that release's own migrations; in the middle window
  `cronwheel migrate` applies the next release's expand steps (the next
  line of RELEASES, or this checkout after the last: from v0.3.0, 0027-0029,
  0029's triggers, the foreign key dropped and `runs_daily_open_job` built
  partition by partition, CONCURRENTLY; from v0.1.0, 0022-0025, `runs_daily`
  made beside `runs` with its mirror), as an operator does before upgrading
  the services; `--legacy-runs` finished runs of today are in the database
  first (in runs_daily, or in `runs` before 0025).

Workers complete runs throughout (`--complete-tenants`, 3: 300 runs/s;
bench/complete_runs.py, a process), so the change meets the firing loop's
inserts and the worker protocol's updates of the same day's runs. Per window
it prints scheduled_at -> completed beside the firing's lateness; every run
must end SUCCEEDED, none twice.

    .venv/bin/python bench/bench_evolution_load.py [--only backfill|contract|expand]
        [--backfill-rate R] [--complete-tenants N] [--release TAG]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

# The steady load's shape and timing are bench_firing_steady's own.
from bench_firing_steady import EVERY_MS, JOBS, SETTLE_MS, TENANTS, WARMUP_MS
from common import (
    JobBatch,
    Reader,
    Services,
    bulk_jobs,
    check_like_create,
    completions_topic,
    create_tenants,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    load_runs,
    machine_load,
    now_ms,
    release_env,
    say,
    vacuum_analyze,
)

from cronwheel import run_history
from cronwheel.kafka import Topics
from cronwheel.store import migrate, runs_daily

BENCH = Path(__file__).resolve().parent
MIGRATIONS = Path("cronwheel", "store", "migrations")  # in a release's tree
DAY = timedelta(days=1)
sys.path.append(str(BENCH.parent))  # tests.upgrade.previous: the releases, exported
from tests.upgrade import previous  # noqa: E402


class Completer:
    """bench/complete_runs.py as a process, of this checkout or of `tree`."""

    def __init__(self, url: str, prefix: str, names: list[str], tree: Path | None):
        self.out = Path(tempfile.mkdtemp(prefix="cw-completer-")) / "done.json"
        self.log = self.out.with_suffix(".log")
        env = dict(os.environ)
        if tree is not None:
            env = release_env(tree, env)
            env["PYTHONPATH"] += os.pathsep + str(BENCH)  # common.py after the release's code
        args = ["--database-url", url, "--prefix", prefix, "--out", str(self.out), *names]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(BENCH / "complete_runs.py"), *args],
                cwd=tree or BENCH.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the completer exited {self.proc.returncode}: {self.log}")

    def result(self) -> dict:
        """Stops it; {"done": [[run_id, scheduled_ms, completed_ms]], "refused": {kind: n}}."""
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(60) != 0:
            raise RuntimeError(f"the completer exited {self.proc.returncode}: {self.log}")
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def finish(completer: Completer, url: str, tenant_ids: list[str], lo: int, hi: int) -> dict:
    """Once the completing tenants' runs of [lo, hi) have all ended (or
    SETTLE_MS has passed): their states, the worker's completions and
    refusals, and how many runs it completed twice."""
    deadline = now_ms() + SETTLE_MS
    span = [
        tenant_ids,
        datetime.fromtimestamp(lo / 1000, UTC),
        datetime.fromtimestamp(hi / 1000, UTC),
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        # The table every window's runs are in: `runs` while it is kept (a
        # release before 0025 wrote only there), else runs_daily.
        legacy = conn.execute("SELECT to_regclass('runs') IS NOT NULL").fetchone()[0]
        table = "runs" if legacy else "runs_daily"
        which = (
            f"FROM {table} WHERE tenant_id = ANY(%s) AND scheduled_at >= %s AND scheduled_at < %s"
        )
        while True:
            left = conn.execute(
                f"SELECT count(*) {which} AND finished_at IS NULL", span
            ).fetchone()[0]
            if left == 0 or now_ms() > deadline:
                break
            time.sleep(0.2)
        states = dict(conn.execute(f"SELECT state, count(*) {which} GROUP BY 1", span))
        retried = conn.execute(f"SELECT count(*) {which} AND attempt > 1", span).fetchone()[0]
    got = completer.result()
    done, refused = got["done"], got["refused"]
    ids = [run_id for run_id, _at, _end in done]
    return {
        "states": states,
        "retried": retried,
        "done": [(at, end) for _id, at, end in done if lo <= at < hi],
        "twice": len(ids) - len(set(ids)),
        "refused": refused,
    }


KINDS = ("backfill", "contract", "expand")


def release_trees(tag: str) -> tuple[Path, Path]:
    """The release `tag` of RELEASES exported into a directory of its own, and
    the migrations of the release after it (exported too), or this checkout's
    when `tag` is the last: the expand steps an operator applies next."""
    listed = previous.releases()
    tags = [r.tag for r in listed]
    if tag not in tags:
        raise SystemExit(f"--release {tag}: not in RELEASES ({', '.join(tags)})")

    def export(release: previous.Release) -> Path:
        tree = Path(tempfile.mkdtemp(prefix=f"cw-{release.tag}-"))
        previous.export(release, tree)
        return tree

    at = tags.index(tag)
    after = export(listed[at + 1]) / MIGRATIONS if at + 1 < len(listed) else migrate.MIGRATIONS_DIR
    return export(listed[at]), after


def legacy_history(conn, tenant_id: str, n: int) -> None:
    """`n` finished runs in `runs` that the mirror never saw, the backfill rewound."""
    conn.execute("ALTER TABLE runs DISABLE TRIGGER USER")
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    load_runs(conn, "runs", tenant_id, n, max(1, n // 5), midnight)
    conn.execute("ALTER TABLE runs ENABLE TRIGGER USER")
    runs_daily.backfill_reset(conn)


def has_runs_daily(conn) -> bool:
    return conn.execute("SELECT to_regclass('runs_daily') IS NOT NULL").fetchone()[0]


def todays_history(conn, tenant_id: str, n: int) -> None:
    """`n` finished runs of today: in runs_daily's partition (the mirror's
    copies of a busy morning), which 0029's index is built over; in `runs`
    for a release before 0025, which the backfill copies later."""
    tomorrow = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + DAY
    load_runs(conn, "runs_daily" if has_runs_daily(conn) else "runs", tenant_id, n, n, tomorrow)


def change(
    kind: str, url: str, rate: float | None, migrations: Path = migrate.MIGRATIONS_DIR
) -> tuple[threading.Thread, dict]:
    """The change the middle window runs beside the load, in a thread;
    `migrations`: the expand steps' directory."""
    told: dict = {}

    def run() -> None:
        began = time.perf_counter()
        try:
            if kind == "backfill":
                p = run_history.backfill(url, run_history.BackfillOptions(batch=1000, rate=rate))
                told["what"] = f"backfill copied {p.copied:,} runs" + (
                    f" at --rate {rate:g}" if rate else ""
                )
            else:
                applied = migrate.migrate(url, migrations, contract=kind == "contract")
                told["what"] = "applied " + ", ".join(f"{m.version:04d}_{m.name}" for m in applied)
        except Exception as exc:  # printed with the figures, which then mean less
            told["what"] = f"FAILED ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        told["seconds"] = time.perf_counter() - began

    return threading.Thread(target=run, name=kind, daemon=True), told


def case(kind: str, window_ms: int, args: argparse.Namespace) -> None:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    tree, after = release_trees(args.release) if kind == "expand" else (None, None)
    with fresh_database(template="template0") if tree else fresh_database(contract=False) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            if tree:
                older = migrate.migrate(url, tree / MIGRATIONS)
                say(
                    f"expand: {args.release}'s schema, up to {older[-1].version:04d}_{older[-1].name}"
                )
            tenants = create_tenants(conn, TENANTS)
            if has_runs_daily(conn):  # a release before 0025 has only `runs`
                runs_daily.ensure_ahead(conn, datetime.now(UTC).date(), 7)
            if kind == "backfill":
                legacy_history(conn, tenants[0]["tenant_id"], args.legacy_runs)
            elif kind == "expand":
                # a tenant whose runs no worker completes: the windows' counts stay the load's
                todays_history(conn, tenants[-1]["tenant_id"], args.legacy_runs)
        names = [topics.runs(t["tenant_id"]) for t in tenants]
        # Never the last tenant, whose runs are the expand case's history.
        completing = tenants[: min(args.complete_tenants, TENANTS - 1)]
        completions_topic(topics)
        completer = None
        try:
            with Reader(names, decode=True) as reader, Services(url, prefix, tree=tree) as services:
                completer = Completer(url, prefix, names[: len(completing)], tree)
                with psycopg.connect(url, autocommit=True) as conn:
                    batch = JobBatch(
                        JOBS, now_ms() - EVERY_MS, every_ms=EVERY_MS, spread_ms=EVERY_MS
                    )
                    seed = bulk_jobs(conn, tenants, batch)
                    check_like_create(conn, topics, tenants, batch, seed)
                vacuum_analyze(url)
                start = now_ms() + WARMUP_MS
                bounds = [start + i * window_ms for i in range(4)]
                thread, told = change(
                    kind, url, args.backfill_rate, after or migrate.MIGRATIONS_DIR
                )

                def alive() -> None:
                    services.check_alive()
                    completer.check_alive()

                while now_ms() < bounds[1]:
                    alive()
                    time.sleep(0.05)
                thread.start()
                while now_ms() < bounds[3]:
                    alive()
                    time.sleep(0.1)
                thread.join()
                expected = JOBS * 3 * window_ms // EVERY_MS
                while True:
                    arrivals = [a for a in reader.snapshot() if start <= a.scheduled_ms < bounds[3]]
                    if len(arrivals) >= expected or now_ms() > bounds[3] + SETTLE_MS:
                        break
                    time.sleep(0.05)
                duplicates = reader.duplicates
                ids = [t["tenant_id"] for t in completing]
                completed = finish(completer, url, ids, start, bounds[3])
        finally:
            if completer is not None:
                completer.stop()
            delete_topics(names + [topics.run_completed])
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
        ended = [end - at for at, end in completed["done"] if lo <= at < hi]
        say(f"{kind} {label:>6}: scheduled_at -> completed ({len(ended):,}): {describe(ended)}")
    say(
        f"{kind}: the completing tenants' runs of the windows: {completed['states']},"
        f" {completed['retried']} retried, {completed['twice']} completed twice,"
        f" refused {completed['refused'] or 'none'}"
    )
    say(f"{kind}: machine after: {machine_load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=KINDS)
    parser.add_argument("--window", type=int, default=20, help="seconds per window (20)")
    parser.add_argument("--legacy-runs", type=int, default=200_000)
    parser.add_argument("--backfill-rate", type=float, help="runs/s (unthrottled)")
    parser.add_argument(
        "--complete-tenants", type=int, default=3, help="tenants whose runs workers complete (3)"
    )
    parser.add_argument(
        "--release", default="v0.3.0", help="expand: the release running the load (v0.3.0)"
    )
    args = parser.parse_args()
    header("bench_evolution_load: lateness while the schema changes under a steady load")
    for kind in KINDS:
        if args.only in (None, kind):
            case(kind, args.window * 1000, args)


if __name__ == "__main__":
    main()
