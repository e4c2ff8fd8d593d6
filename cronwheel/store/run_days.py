"""Where a run is looked for, by id, in the day-partitioned run history.

The worker protocol and the platform's records name a run by id, and the id
does not give its day, so a statement given no more would probe every day
partition's key: with 30 days kept, the database's CPU per StartRun +
CompleteRun grew by three quarters (docs/migrations.md, "Finding a run
without its day"). Nearly every call is about a run whose instant is within
a day of now, so each statement is given the days around now first,
[yesterday, the day after tomorrow), which PostgreSQL prunes to those days'
partitions (and the default one, while a day of the window has none), and
only the runs it found nothing for are asked again over every day.

A statement takes the window as `%(lo)s` and `%(hi)s`, each written
`date_trunc('day', %(lo)s::timestamptz, 'UTC')` (lifecycle.sql says why).
A run not found in the first window had nothing done to it, so asking again
is exact; what it costs is a second statement for a run days away from now
(a late CompleteRun of a long run, a retry after a long backoff, a run
triggered for a later day) or not there at all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from cronwheel.core.clock import to_dt

DAY = timedelta(days=1)
EVERY_DAY = {"lo": datetime.min.replace(tzinfo=UTC), "hi": datetime.max.replace(tzinfo=UTC)}

T = TypeVar("T")
R = TypeVar("R")


def recent_days(now: int) -> dict[str, datetime]:
    """[yesterday, the day after tomorrow) of `now` (epoch ms), UTC days."""
    today = to_dt(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return {"lo": today - DAY, "hi": today + 2 * DAY}


YEAR_MS = 366 * 86_400_000


def plausible(at: Any, now: int) -> int:
    """`at`, an instant a record carries (epoch ms), when it is an integer
    within a year of `now`; else `now`. A record's field is not trusted to
    make a date: a value centuries away fails in Python's datetime before any
    statement runs, and the every-day ask finds the run anyway."""
    ok = isinstance(at, int) and not isinstance(at, bool) and abs(at - now) <= YEAR_MS
    return at if ok else now


def in_days(
    now: int, items: list[T], ask: Callable[[list[T], dict], list[R]], missing: Callable[[R], bool]
) -> list[R]:
    """`ask(items, window)` answers one result per item; over the recent days
    first, then over every day for the items whose result is `missing`."""
    got = ask(items, recent_days(now))
    again = [k for k, r in enumerate(got) if missing(r)]
    if again:
        more = ask([items[k] for k in again], EVERY_DAY)
        for k, r in zip(again, more, strict=True):
            got[k] = r
    return got


def one_in_days(
    now: int, ask: Callable[[dict], Any], missing: Callable[[Any], bool] = lambda row: row is None
) -> Any:
    """A statement of one run: its row over the recent days, else (the row
    `missing` the run) over every day."""
    row = ask(recent_days(now))
    return ask(EVERY_DAY) if missing(row) else row
