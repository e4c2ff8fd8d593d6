"""`cronwheel backfill` and `cronwheel retention`: the migrate step of run
retention and its upkeep (issue 25; docs/migrations.md, "Worked example: run
retention"). Both connect as the tables' owner (they make and drop
partitions) and run beside the services.

The backfill copies `runs` and `run_attempts` rows into `runs_daily` and
`run_attempts_daily` in batches of `batch` runs, each batch one transaction
with the cursor's move, at most `rate` runs a second (it sleeps between
batches for that), until it has passed the last run. Killed, it resumes from
the last batch that committed. Its progress is in `backfills` (`cronwheel
migrate --status`) and, while it runs, in the gauges below (served on
`--metrics-addr`, or CRONWHEEL_METRICS_ADDR). Once the contract step has
dropped `runs` (0031) there is nothing to copy: it is done at once and
writes nothing.

A retention pass makes the day partitions ahead, drops the days past the
longest retention, and deletes the default partition's expired terminal rows
in bounded batches. `--every` repeats it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from prometheus_client import Counter, Gauge

from cronwheel.store import runs_daily

log = logging.getLogger("cronwheel.run_history")

BACKFILL_ROWS = Gauge(
    "cronwheel_backfill_rows",
    "The run-history backfill's runs visited and copied so far, and the runs it has to"
    " visit (total: the table's row estimate when it started)",
    ["backfill", "count"],
)
BACKFILL_DONE = Gauge(
    "cronwheel_backfill_done", "1 once the backfill has passed the last row", ["backfill"]
)
RETENTION_DROPPED = Counter(
    "cronwheel_retention_days_dropped_total", "Day partitions of run history dropped"
)
RETENTION_KEPT = Counter(
    "cronwheel_retention_unfinished_kept_total",
    "Runs not yet finished kept (moved to the default partition) when their day was dropped",
)


def _publish(p: runs_daily.Progress) -> None:
    name = runs_daily.BACKFILL
    BACKFILL_ROWS.labels(name, "visited").set(p.visited)
    BACKFILL_ROWS.labels(name, "copied").set(p.copied)
    BACKFILL_ROWS.labels(name, "copied_attempts").set(p.copied_attempts)
    BACKFILL_ROWS.labels(name, "total").set(p.total or 0)
    BACKFILL_DONE.labels(name).set(1 if p.done else 0)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class BackfillOptions:
    batch: int = 1000
    rate: float | None = None  # runs a second at most; None: as fast as it goes
    retention_days: int = 30  # terminal runs older than the longest retention are not copied


def backfill(
    dsn: str,
    options: BackfillOptions,
    stop: threading.Event | None = None,
    now: Callable[[], datetime] = _utcnow,
) -> runs_daily.Progress:
    """Copy batches until done (or `stop` is set); returns the progress."""
    stop = stop or threading.Event()
    with psycopg.connect(dsn, autocommit=True) as conn:
        progress = runs_daily.status(conn)
        _publish(progress)
        if progress.source_dropped:
            log.info("backfill runs_daily: done, nothing to copy (`runs` was dropped)")
        while not progress.done and not stop.is_set():
            began = time.monotonic()
            at = now()
            horizon = at - timedelta(
                days=runs_daily.longest_retention(conn, options.retention_days)
            )
            try:
                got = runs_daily.backfill_batch(conn, at, options.batch, horizon)
            except psycopg.errors.LockNotAvailable as e:
                # A day's partition was not made within its lock_timeout (an
                # autovacuum or a long transaction on the default partition):
                # nothing of the batch committed, so it is tried again.
                log.warning("backfill runs_daily: waiting to make a day's partition (%s)", e)
                stop.wait(0.5)
                continue
            if got is None:  # another backfill holds the row: wait for its batch
                stop.wait(0.5)
                continue
            progress = got
            _publish(progress)
            log.info(
                "backfill runs_daily: visited %d of ~%s, copied %d runs and %d attempts%s",
                progress.visited, progress.total, progress.copied, progress.copied_attempts,
                " (done)" if progress.done else "",
            )  # fmt: skip
            if options.rate and not progress.done:
                # Throttle: a batch of `batch` runs takes at least batch/rate seconds.
                stop.wait(max(0.0, options.batch / options.rate - (time.monotonic() - began)))
    return progress


@dataclass(frozen=True)
class RetentionPass:
    made: list
    dropped: list[runs_daily.Dropped]
    default_deleted: int


def retention_pass(
    dsn: str, default_days: int, ahead_days: int, now: datetime | None = None
) -> RetentionPass:
    """Make the days ahead, drop the days past the horizon, trim the default
    partition. A day whose lock is not had in time is left for the next pass."""
    at = now or _utcnow()
    with psycopg.connect(dsn, autocommit=True) as conn:
        made: list = []
        dropped: list[runs_daily.Dropped] = []
        try:
            made = runs_daily.ensure_ahead(conn, at.date(), ahead_days)
            dropped = runs_daily.drop_expired(conn, at, default_days)
        except psycopg.errors.LockNotAvailable:
            # The days made or dropped before it stand; the rest wait for the
            # next pass (days are made a week ahead, so a pass may be missed).
            log.warning("retention: a day's DDL waited over the lock timeout; next pass")
        deleted = 0
        while True:
            n = runs_daily.delete_default_expired(conn, at, default_days)
            deleted += n
            if n == 0:
                break
    RETENTION_DROPPED.inc(len(dropped))
    RETENTION_KEPT.inc(sum(d.kept_runs for d in dropped))
    for d in dropped:
        log.info(
            "retention: dropped %s (~%d runs): detached in %.1f ms, dropped in %.1f ms,"
            " kept %d unfinished runs",
            d.day, d.rows_estimate, d.seconds * 1000, d.drop_seconds * 1000, d.kept_runs,
        )  # fmt: skip
    return RetentionPass(made, dropped, deleted)
