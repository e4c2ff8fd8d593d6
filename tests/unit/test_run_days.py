"""The days a run is looked for in first (cronwheel/store/run_days.py): UTC
days [yesterday, the day after tomorrow) of an instant; an instant a record
carries is used only when it is an integer within a year of now. The recent
days are written into a statement as constants; every day stays parameters."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cronwheel.core.clock import to_ms
from cronwheel.store.run_days import (
    EVERY_DAY,
    HI,
    LO,
    YEAR_MS,
    Days,
    plausible,
    recent_days,
)
from cronwheel.store.sql_loader import queries

NOW = to_ms(datetime(2026, 12, 4, 13, 50, tzinfo=UTC))
FIVE_DAYS_AGO = NOW - 5 * 86_400_000


def test_recent_days__yesterday_to_the_day_after_tomorrow_utc():
    window = recent_days(NOW)
    assert (window.lo, window.hi) == (
        datetime(2026, 12, 3, tzinfo=UTC),
        datetime(2026, 12, 6, tzinfo=UTC),
    )
    assert window.inline and not EVERY_DAY.inline


def test_days__not_a_mapping__merged_into_parameters_it_fails_loudly():
    """Merged into a statement's parameters a window would run as parameters,
    not written into the text: the lock it exists to spare comes back unseen."""
    with pytest.raises(TypeError):
        {"p": 1} | recent_days(NOW)  # type: ignore[operator]
    with pytest.raises(TypeError):
        dict(**recent_days(NOW))  # type: ignore[arg-type]


def test_days__an_inline_bound_not_a_utc_midnight__refused():
    with pytest.raises(ValueError, match="UTC midnights"):
        Days(datetime(2026, 12, 3, 1, tzinfo=UTC), datetime(2026, 12, 6, tzinfo=UTC), inline=True)
    with pytest.raises(ValueError, match="UTC midnights"):
        Days(datetime(2026, 12, 3), datetime(2026, 12, 6), inline=True)  # naive: local time


def test_recent_days__written_into_the_statement_as_utc_midnights():
    text = f"SELECT 1 FROM runs_daily WHERE scheduled_at >= {LO} AND scheduled_at < {HI}"
    assert recent_days(NOW).sql(text) == (
        "SELECT 1 FROM runs_daily WHERE"
        " scheduled_at >= '2026-12-03T00:00:00+00:00'::timestamptz"
        " AND scheduled_at < '2026-12-06T00:00:00+00:00'::timestamptz"
    )
    assert EVERY_DAY.sql(text) == text  # a window of every day prunes nothing: parameters


def test_recent_days__a_statement_without_the_bounds__refused():
    with pytest.raises(ValueError, match="must bound scheduled_at"):
        recent_days(NOW).sql("SELECT 1 FROM runs_daily WHERE scheduled_at >= %(lo)s")


@pytest.mark.parametrize("module", ["lifecycle", "webhooks", "workflows"])
def test_every_windowed_statement__bounds_written_as_run_days_expects(module):
    """A statement taking %(lo)s and %(hi)s writes each in the one form that
    Days.sql replaces, so none is left a parameter by a differently spelled bound."""
    windowed = {n: q for n, q in queries(module).items() if "%(lo)s" in q or "%(hi)s" in q}
    assert windowed, module
    for name, text in windowed.items():
        inlined = recent_days(NOW).sql(text)
        assert "%(lo)s" not in inlined and "%(hi)s" not in inlined, name


def test_plausible__an_integer_within_a_year__kept():
    assert plausible(FIVE_DAYS_AGO, NOW) == FIVE_DAYS_AGO
    assert plausible(NOW + YEAR_MS, NOW) == NOW + YEAR_MS


@pytest.mark.parametrize(
    "carried",
    [None, 2**62, -(2**62), NOW + YEAR_MS + 1, "1796392200000", 1.7e12, True],
    ids=[
        "missing",
        "centuries-ahead",
        "centuries-back",
        "a-year-and-a-ms",
        "text",
        "float",
        "bool",
    ],
)
def test_plausible__missing_or_implausible__now(carried):
    assert plausible(carried, NOW) == NOW
