"""Run history by day (issue 25): the day partitions of `runs_daily` and
`run_attempts_daily` (migration 0025), made ahead and dropped past the
retention horizon, and the backfill of the rows older than the mirror
triggers, from `runs` while it exists (contract step 0031 drops it; after it
the backfill has nothing to copy and is done). Everything here is DDL or a
copy, run as the tables' owner by `cronwheel retention` and `cronwheel
backfill` (cronwheel/run_history.py).

A day is [00:00, 24:00) UTC of `scheduled_at`. A day goes when its end is
older than the longest retention any tenant has (CRONWHEEL_RUN_RETENTION_DAYS
or a tenant's own `run_retention_days`): dropping its two tables costs the
same whatever their rows. Its non-terminal runs stay, moved to the default
partition in the drop's transaction (found by the partial index
runs_daily_unfinished, not by reading the day).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from time import perf_counter

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cronwheel.store.sql_loader import queries

Q = queries("runs_daily")
DAY = timedelta(days=1)
BACKFILL = "runs_daily"
# A drop or an attach waits this long for the parents' lock, then gives up
# until the next pass, rather than queueing every write of runs behind it.
LOCK_TIMEOUT = "1s"
# A day's DDL chosen as a deadlock's victim rolled back whole: tried again
# this many times in all. It locks both default partitions, and a writer's
# transaction that holds one and then asks for the other closes the cycle
# (the worker protocol's are retried by their callers the same way).
DEADLOCK_TRIES = 3


def _day_transaction(conn: psycopg.Connection, run) -> object:
    """`run()` in a transaction of its own with LOCK_TIMEOUT, tried again when
    PostgreSQL picked it as a deadlock's victim (nothing of it committed)."""

    def once() -> object:
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            return run()

    for _ in range(DEADLOCK_TRIES - 1):
        with contextlib.suppress(psycopg.errors.DeadlockDetected):
            return once()
    return once()


def runs_part(day: date) -> str:
    return f"runs_daily_p{day:%Y%m%d}"


def attempts_part(day: date) -> str:
    return f"run_attempts_daily_p{day:%Y%m%d}"


def day_of(name: str) -> date:
    return datetime.strptime(name.rsplit("_p", 1)[1], "%Y%m%d").date()


def _start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _ddl(name: str, day: date) -> sql.Composed:
    """A named block for `day`, identifiers and bounds filled in: one string
    of one or more statements, sent without parameters (so several may go
    in one call)."""
    return sql.SQL(Q[name]).format(
        runs_part=sql.Identifier(runs_part(day)),
        attempts_part=sql.Identifier(attempts_part(day)),
        runs_name=sql.Literal(runs_part(day)),
        lo=sql.Literal(_start(day)),
        hi=sql.Literal(_start(day + DAY)),
    )


def days(conn: psycopg.Connection) -> list[date]:
    """The days that have partitions, oldest first."""
    return [day_of(name) for (name,) in conn.execute(Q["day_partitions"])]


def ensure_days(conn: psycopg.Connection, wanted: list[date]) -> list[date]:
    """Make the partitions of each day in `wanted` that has none; returns those
    made. Each day in its own transaction (`conn` is autocommit)."""
    have = set(days(conn))
    made = []
    for day in sorted(set(wanted) - have):
        _day_transaction(conn, lambda day=day: conn.execute(_ddl("create_day", day)))
        made.append(day)
    return made


def ensure_ahead(conn: psycopg.Connection, today: date, ahead: int) -> list[date]:
    """Today's partition and the next `ahead` days'."""
    return ensure_days(conn, [today + DAY * i for i in range(ahead + 1)])


def longest_retention(conn: psycopg.Connection, default_days: int) -> int:
    return conn.execute(Q["longest_retention"], {"default_days": default_days}).fetchone()[0]


@dataclass(frozen=True)
class Dropped:
    day: date
    rows_estimate: int
    kept_runs: int
    kept_attempts: int
    seconds: float  # the detach's transaction: the parents' lock held that long
    drop_seconds: float  # the detached tables' DROP, after it (no lock of the parents)


def drop_expired(
    conn: psycopg.Connection, now: datetime, default_days: int, *, clock=None
) -> list[Dropped]:
    """Drop every day whose end is past the longest retention, oldest first,
    each in its own short transaction; a day whose lock is not had within
    LOCK_TIMEOUT waits for the next pass (psycopg.errors.LockNotAvailable)."""
    clock = clock or perf_counter
    horizon = now - timedelta(days=longest_retention(conn, default_days))
    for day in detached(conn):  # a pass that died between its two transactions
        conn.execute(_ddl("drop_day", day))
    dropped = []
    for day in days(conn):
        if _start(day + DAY) > horizon:
            break
        (estimate,) = conn.execute(_ddl("day_size", day)).fetchone()
        began = clock()

        def detach(day=day):
            conn.execute(_ddl("detach_day", day))
            return conn.execute(_ddl("keep_unfinished", day)).fetchone()

        kept = _day_transaction(conn, detach)
        held = clock() - began
        # Detached, the day's tables are tables of their own: dropping them
        # (unlinking their files, which takes longer the bigger they are)
        # locks them alone, not the parents every write goes through.
        conn.execute(_ddl("drop_day", day))
        dropped.append(Dropped(day, estimate, kept[0], kept[1], held, clock() - began - held))
    return dropped


def detached(conn: psycopg.Connection) -> list[date]:
    """Days whose tables exist but are attached to no parent."""
    return [day_of(name) for (name,) in conn.execute(Q["detached_days"])]


def delete_default_expired(
    conn: psycopg.Connection, now: datetime, default_days: int, limit: int = 1000
) -> int:
    """One bounded batch of the default partition's terminal rows past their
    tenant's horizon; returns how many runs went."""
    args = {"now": now, "default_days": default_days, "limit": limit}
    return conn.execute(Q["delete_default_expired"], args).fetchone()[0]


# -- the backfill ---------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    visited: int
    copied: int
    copied_attempts: int
    total: int | None
    finished_at: datetime | None
    # `runs` is gone (contract step 0031): nothing is left to copy.
    source_dropped: bool = False

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.source_dropped


def legacy_runs_exist(conn: psycopg.Connection) -> bool:
    """Whether `runs`, the backfill's source, is still there (contract pending)."""
    return conn.execute(Q["legacy_runs_exist"]).fetchone()[0]


def backfill_batch(
    conn: psycopg.Connection, now: datetime, batch: int, horizon: datetime
) -> Progress | None:
    """Copy the next `batch` runs (and their attempts) after the cursor, in one
    transaction with the cursor's move; None when another backfill holds the
    row. A batch whose days lack partitions gets them first (their own
    transactions, before the copy's). Once `runs` is gone: the progress as
    it stands, done."""
    if not legacy_runs_exist(conn):
        return status(conn)
    with conn.transaction():
        row = conn.execute(Q["backfill_claim"]).fetchone()
        if row is None:
            return None
        p, run_id, _visited, _copied, finished_at = row
    if finished_at is not None:
        return status(conn)
    cursor = {"p": -1 if p is None else p, "id": run_id or "", "batch": batch}
    wanted = [
        d.astimezone(UTC).date()
        for (d,) in conn.execute(Q["backfill_days"], cursor)
        if d >= _day_floor(horizon)
    ]
    ensure_days(conn, wanted)
    with conn.transaction():
        row = conn.execute(Q["backfill_claim"]).fetchone()
        if row is None:
            return None
        if (row[0], row[1]) != (p, run_id):  # another backfill moved it meanwhile
            return status(conn)
        conn.execute(Q["backfill_start"], {"now": now})
        got = conn.execute(
            Q["backfill_batch"], {**cursor, "now": now, "horizon": horizon}
        ).fetchone()
    _now_visited, visited, copied, copied_attempts, total, finished = got
    return Progress(visited, copied, copied_attempts, total, finished)


def _day_floor(at: datetime) -> datetime:
    return datetime.combine(at.astimezone(UTC).date(), time(), tzinfo=UTC)


def status(conn: psycopg.Connection) -> Progress:
    """The backfill's progress; done whatever its row says once `runs` is gone."""
    for row in backfill_rows(conn):
        if row["name"] == BACKFILL:
            return Progress(
                row["visited"], row["copied"], row["copied_attempts"], row["total"],
                row["finished_at"], not legacy_runs_exist(conn),
            )  # fmt: skip
    raise LookupError("no runs_daily backfill row: is migration 0025 applied?")


def backfill_rows(conn: psycopg.Connection) -> list[dict]:
    """Every backfill's progress; none before migration 0025."""
    if conn.execute("SELECT to_regclass('backfills') IS NULL").fetchone()[0]:
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(Q["backfill_status"]).fetchall()


def backfill_reset(conn: psycopg.Connection) -> None:
    conn.execute(Q["backfill_reset"])
