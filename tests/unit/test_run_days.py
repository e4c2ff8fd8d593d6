"""The days a run is looked for in first (cronwheel/store/run_days.py): UTC
days [yesterday, the day after tomorrow) of an instant; an instant a record
carries is used only when it is an integer within a year of now."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cronwheel.core.clock import to_ms
from cronwheel.store.run_days import YEAR_MS, plausible, recent_days

NOW = to_ms(datetime(2026, 12, 4, 13, 50, tzinfo=UTC))
FIVE_DAYS_AGO = NOW - 5 * 86_400_000


def test_recent_days__yesterday_to_the_day_after_tomorrow_utc():
    assert recent_days(NOW) == {
        "lo": datetime(2026, 12, 3, tzinfo=UTC),
        "hi": datetime(2026, 12, 6, tzinfo=UTC),
    }


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
