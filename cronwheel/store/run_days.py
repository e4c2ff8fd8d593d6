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
`date_trunc('day', %(lo)s::timestamptz, 'UTC')` (lifecycle.sql says why),
and is run through its window (`Days.execute`). The recent days are written
into the statement's text as constants: PostgreSQL then prunes the other days
at planning, and a prepared statement's generic plan names, and locks, only
the window's partitions. With the bounds as parameters the generic plan names
every day and PostgreSQL 15 locks each one (and its indexes) at every
execution before pruning: 82 relation locks per statement at 40 days against
8 (docs/migrations.md, "Finding a run without its day"). The text changes once
a day, so each statement is prepared anew once a day. Every day stays a
parameter: that window prunes nothing.
A run not found in the first window had nothing done to it, so asking again
is exact; what it costs is a second statement for a run days away from now
(a late CompleteRun of a long run, a retry after a long backoff, a run
triggered for a later day) or not there at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from cronwheel.core.clock import to_dt

DAY = timedelta(days=1)
# How every windowed statement writes its bounds (a test holds the SQL files to it).
LO = "date_trunc('day', %(lo)s::timestamptz, 'UTC')"
HI = "date_trunc('day', %(hi)s::timestamptz, 'UTC')"


@dataclass(frozen=True, slots=True)
class Days:
    """A window of UTC days [lo, hi): passed as a statement's `lo` and `hi`
    parameters, or, `inline`, written into its text. Not a mapping on
    purpose: merged into a statement's parameters (`params | days`), a window
    would run without being written in, and lose its point silently."""

    lo: datetime
    hi: datetime
    inline: bool

    def __post_init__(self) -> None:
        if self.inline and not all(_midnight_utc(d) for d in (self.lo, self.hi)):
            raise ValueError("an inline window's bounds are UTC midnights")

    def sql(self, text: str) -> str:
        """`text` with this window's bounds as constants, when inline."""
        return _inlined(text, self.lo, self.hi) if self.inline else text

    def execute(self, conn: Any, text: str, params: Mapping[str, Any]) -> Any:
        """`conn.execute` (a connection or a cursor) of a windowed statement."""
        return conn.execute(self.sql(text), {**params, "lo": self.lo, "hi": self.hi})


def _midnight_utc(d: datetime) -> bool:
    return d.utcoffset() == timedelta(0) and d.time() == datetime.min.time()


@functools.lru_cache(maxsize=256)
def _inlined(text: str, lo: datetime, hi: datetime) -> str:
    if LO not in text or HI not in text:
        raise ValueError(f"a windowed statement must bound scheduled_at by {LO} and {HI}")
    # Midnights in UTC, with their offset: the same instant whatever the
    # session's TimeZone. Only digits, '-', ':', 'T' and '+': nothing to quote.
    return text.replace(LO, _constant(lo)).replace(HI, _constant(hi))


def _constant(day: datetime) -> str:
    return f"'{day.astimezone(UTC).isoformat()}'::timestamptz"


EVERY_DAY = Days(datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC), inline=False)

T = TypeVar("T")
R = TypeVar("R")


def recent_days(now: int) -> Days:
    """[yesterday, the day after tomorrow) of `now` (epoch ms), UTC days."""
    today = to_dt(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return Days(today - DAY, today + 2 * DAY, inline=True)


YEAR_MS = 366 * 86_400_000


def plausible(at: Any, now: int) -> int:
    """`at`, an instant a record carries (epoch ms), when it is an integer
    within a year of `now`; else `now`. A record's field is not trusted to
    make a date: a value centuries away fails in Python's datetime before any
    statement runs, and the every-day ask finds the run anyway."""
    ok = isinstance(at, int) and not isinstance(at, bool) and abs(at - now) <= YEAR_MS
    return at if ok else now


def in_days(
    now: int, items: list[T], ask: Callable[[list[T], Days], list[R]], missing: Callable[[R], bool]
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
    now: int, ask: Callable[[Days], Any], missing: Callable[[Any], bool] = lambda row: row is None
) -> Any:
    """A statement of one run: its row over the recent days, else (the row
    `missing` the run) over every day."""
    row = ask(recent_days(now))
    return ask(EVERY_DAY) if missing(row) else row
