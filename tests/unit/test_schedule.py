"""cronwheel.core.schedule: the DST policy against a brute-force oracle, intervals,
one-offs, jitter and validation.

The oracle knows no zone rules: it reads every real UTC minute (or second) of
a window in the zone, and takes as the instants of a local time exactly those
whose reading equals it. A local time with no instant is in a gap; its
shifted fire is the instant at which the readings jump over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronwheel.core.schedule import (
    CronSchedule,
    Fire,
    ScheduleError,
    jitter_offset_ms,
    parse_schedule,
    preview,
)
from tests.unit.test_cron import OracleCron, cron_strategy

ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Tokyo",
]
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def ms(text: str) -> int:
    return (datetime.fromisoformat(text) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
        milliseconds=1
    )


def utc(at_ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=at_ms)


@cache
def transitions(zone: str, year: int) -> tuple[int, ...]:
    """Instants (ms, to the minute) where the zone's UTC offset changes during `year`."""

    def offset(t: int) -> timedelta | None:
        return utc(t).astimezone(ZoneInfo(zone)).utcoffset()

    found = []
    t, end = ms(f"{year}-01-01T00:00:00+00:00"), ms(f"{year + 1}-01-01T00:00:00+00:00")
    while t < end:  # day by day, then bisect down to the minute
        lo, hi = t, t + DAY_MS
        if offset(lo) != offset(hi):
            while hi - lo > 60_000:
                mid = (lo + hi) // 2 // 60_000 * 60_000
                lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
            found.append(hi)
        t += DAY_MS
    return tuple(found)


def windows() -> list[tuple[str, int]]:
    """(zone, centre instant): each transition of 2026, and a plain day in Tokyo."""
    centres = [(zone, t) for zone in ZONES for t in transitions(zone, 2026)]
    return [*centres, ("Asia/Tokyo", ms("2026-03-08T00:00:00+00:00"))]


@dataclass(frozen=True)
class Timeline:
    """Every instant of a stretch of time, by step, with its naive wall-clock reading."""

    readings: tuple[tuple[int, datetime], ...]
    instants_of: dict[datetime, list[int]]
    jumps: tuple[tuple[datetime, datetime, int], ...]  # (reading before, reading after, instant)


@cache
def timeline(zone: str, start_ms: int, end_ms: int, step_ms: int) -> Timeline:
    tz = ZoneInfo(zone)
    readings = tuple(
        (t, datetime.fromtimestamp(t // 1000, tz).replace(tzinfo=None))
        for t in range(start_ms, end_ms + 1, step_ms)
    )
    instants_of: dict[datetime, list[int]] = {}
    for t, reading in readings:
        instants_of.setdefault(reading, []).append(t)
    jumps = tuple(
        (a, b, t)
        for (_, a), (t, b) in zip(readings, readings[1:], strict=False)
        if b - a > timedelta(milliseconds=step_ms)
    )
    return Timeline(readings, instants_of, jumps)


MARGIN_MS = 65 * 60_000  # longer than any clock jump in ZONES


def oracle_fires(
    expr: str, zone: str, gap: str, repeat: str, start_ms: int, end_ms: int
) -> list[tuple[int, str | None]]:
    """(instant, dst mark) of every fire in (start, end], from first principles."""
    cron = OracleCron.parse(expr)
    step = 1000 if cron.has_seconds else 60_000
    line = timeline(zone, start_ms - 2 * MARGIN_MS, end_ms + 2 * MARGIN_MS, step)

    fires: dict[int, str | None] = {}
    if cron.hour_star:  # every real instant whose reading matches
        for t, reading in line.readings:
            if cron.matches(reading):
                fires[t] = "repeat" if len(line.instants_of[reading]) == 2 else None
    else:
        first = utc(start_ms - MARGIN_MS).astimezone(ZoneInfo(zone)).replace(tzinfo=None)
        last = utc(end_ms + MARGIN_MS).astimezone(ZoneInfo(zone)).replace(tzinfo=None)
        for local in cron.scan(first, last):
            instants = line.instants_of.get(local, [])
            if len(instants) == 1:
                fires.setdefault(instants[0], None)
            elif len(instants) == 2:
                chosen = {"first": instants[:1], "last": instants[1:], "both": instants}[repeat]
                fires.update((i, "repeat") for i in chosen)
            elif gap == "shift":  # the instant at which the readings jump over `local`
                fires[next(t for a, b, t in line.jumps if a < local < b)] = "gap"
    return sorted((t, mark) for t, mark in fires.items() if start_ms < t <= end_ms)


def project_fires(spec: dict, start_ms: int, end_ms: int) -> list[Fire]:
    schedule = parse_schedule(spec, anchor_ms=0)
    fires = []
    fire = schedule.next_after(start_ms)
    while fire is not None and fire.at_ms <= end_ms:
        fires.append(fire)
        fire = schedule.next_after(fire.at_ms)
    return fires


def assert_agrees(
    expr: str, zone: str, gap: str, repeat: str, start_ms: int, end_ms: int
) -> list[int]:
    """Project and oracle give the same fires in (start, end]; returns their instants."""
    spec = {"cron": expr, "timezone": zone, "dst": {"gap": gap, "repeat": repeat}}
    fires = project_fires(spec, start_ms, end_ms)
    expected = oracle_fires(expr, zone, gap, repeat, start_ms, end_ms)
    assert [(f.at_ms, f.dst) for f in fires] == expected
    for f in fires:  # isoformat: aware datetimes of one zone compare equal across a fold
        assert f.local.isoformat() == utc(f.at_ms).astimezone(ZoneInfo(zone)).isoformat()
        assert f.local.tzinfo == ZoneInfo(zone)
    return [t for t, _ in expected]


# -- the DST policy against the oracle, around every transition --------------------

EXPRESSIONS = [
    "30 2 * * *",  # daily, in the New York / Berlin gap and repeat
    "0 0 * * *",  # midnight: Santiago's gap
    "30 1 * * *",  # in the repeated hour
    "0,30 2,3 * * *",  # several times in one gap, and the time it jumps to
    "* 2 * * *",  # every minute of a gap hour: one shifted fire
    "45 23 * * *",  # Santiago's repeat
    "0,15,30,45 1,2 * * 0",  # Lord Howe's half hours, on Sundays
    "*/15 * * * *",  # hour '*': keeps its spacing
    "0 */2 * * *",
]
SECONDS_EXPRESSIONS = ["*/20 */30 2 * * *", "0 */30 * * * *", "*/15 * 1 * * *"]
SECONDS_WINDOWS = [w for w in windows() if w[0] in ("America/New_York", "Australia/Lord_Howe")]
POLICIES = [("shift", "first"), ("skip", "last"), ("shift", "both")]


def policies_for(expr: str) -> list[tuple[str, str]]:
    hour_star = expr.split()[-4].startswith("*")  # the policy does not apply then
    return POLICIES[:1] if hour_star else POLICIES


@pytest.mark.parametrize(("zone", "centre"), windows())
def test_dst_policy__around_transition__agrees_with_oracle(zone: str, centre: int) -> None:
    for expr in EXPRESSIONS:
        for gap, repeat in policies_for(expr):
            assert_agrees(expr, zone, gap, repeat, centre - DAY_MS // 2, centre + DAY_MS // 2)


@pytest.mark.parametrize(("zone", "centre"), SECONDS_WINDOWS)
def test_dst_policy__seconds_around_transition__agrees_with_oracle(zone: str, centre: int) -> None:
    for expr in SECONDS_EXPRESSIONS:
        for gap, repeat in policies_for(expr):
            assert_agrees(expr, zone, gap, repeat, centre - HOUR_MS // 2, centre + HOUR_MS // 2)


def test_windows__cover_gaps_and_repeats_in_every_dst_zone() -> None:
    # Guards the tests above against finding no transitions to test.
    assert [len(transitions(zone, 2026)) for zone in ZONES] == [2, 2, 2, 2, 0]


@settings(max_examples=40, deadline=None)
@given(
    expr=cron_strategy(),
    window=st.sampled_from(windows()),
    policy=st.sampled_from([(g, r) for g in ("shift", "skip") for r in ("first", "last", "both")]),
    points=st.lists(st.integers(-DAY_MS // 2, DAY_MS // 2), max_size=20),
)
def test_dst_policy__random_expressions__agree_with_oracle(
    expr: str, window: tuple[str, int], policy: tuple[str, str], points: list[int]
) -> None:
    zone, centre = window
    start, end = centre - DAY_MS // 2, centre + DAY_MS // 2
    expected = assert_agrees(expr, zone, *policy, start, end)
    # next_after from arbitrary points, not only from the previous fire
    spec = {
        "cron": expr,
        "timezone": zone,
        "dst": dict(zip(("gap", "repeat"), policy, strict=True)),
    }
    schedule = parse_schedule(spec, anchor_ms=0)
    for point in (centre + p for p in points):
        following = [t for t in expected if t > point]
        if following:
            fire = schedule.next_after(point)
            assert fire is not None and fire.at_ms == following[0]


@settings(max_examples=15, deadline=None)
@given(expr=cron_strategy(with_seconds=True), window=st.sampled_from(SECONDS_WINDOWS))
def test_dst_policy__random_expressions_with_seconds__agree_with_oracle(
    expr: str, window: tuple[str, int]
) -> None:
    zone, centre = window
    assert_agrees(expr, zone, "shift", "both", centre - HOUR_MS // 2, centre + HOUR_MS // 2)


# -- the documented examples (docs/schedules.md) -----------------------------------


def fires_on(spec: dict, day: str) -> list[tuple[str, str | None]]:
    """Local times (with offset) and marks of the fires whose local date is `day`."""
    start = ms(f"{day}T00:00:00+00:00") - DAY_MS
    return [
        (f.local.isoformat(timespec="minutes"), f.dst)
        for f in project_fires(spec, start, start + 3 * DAY_MS)
        if f.local.date().isoformat() == day
    ]


NY = {"timezone": "America/New_York"}


def test_new_york_spring_forward__daily_in_gap__shifts_to_3am() -> None:
    assert fires_on({"cron": "30 2 * * *", **NY}, "2026-03-08") == [
        ("2026-03-08T03:00-04:00", "gap")
    ]
    assert fires_on({"cron": "30 2 * * *", **NY, "dst": {"gap": "skip"}}, "2026-03-08") == []


def test_new_york_fall_back__daily_in_repeat__fires_once_or_as_asked() -> None:
    spec = {"cron": "30 1 * * *", **NY}
    assert fires_on(spec, "2026-11-01") == [("2026-11-01T01:30-04:00", "repeat")]
    last = fires_on({**spec, "dst": {"repeat": "last"}}, "2026-11-01")
    assert last == [("2026-11-01T01:30-05:00", "repeat")]
    both = fires_on({**spec, "dst": {"repeat": "both"}}, "2026-11-01")
    assert both == [("2026-11-01T01:30-04:00", "repeat"), ("2026-11-01T01:30-05:00", "repeat")]


def test_new_york__every_15_minutes__keeps_spacing_through_both_transitions() -> None:
    schedule = parse_schedule({"cron": "*/15 * * * *", **NY}, anchor_ms=0)

    def day_of_fires(day: date) -> list[Fire]:
        midnight = datetime.combine(day, time(), ZoneInfo(NY["timezone"]))
        return preview(schedule, ms(midnight.isoformat()) - 1, 24 * 4 + 4)

    spring, fall = day_of_fires(date(2026, 3, 8)), day_of_fires(date(2026, 11, 1))
    for fires in (spring, fall):
        assert all(b.at_ms - a.at_ms == 15 * 60_000 for a, b in zip(fires, fires[1:], strict=False))
    assert not any(f.local.hour == 2 or f.dst for f in spring[: 4 * 6])  # 02:xx does not exist
    assert [f.local.strftime("%H:%M%z") for f in fall if f.dst == "repeat"] == [
        f"01:{m:02}{off}" for off in ("-0400", "-0500") for m in (0, 15, 30, 45)
    ]


def test_santiago__midnight_does_not_exist__fires_at_1am() -> None:
    spec = {"cron": "0 0 * * *", "timezone": "America/Santiago"}
    assert fires_on(spec, "2026-09-06") == [("2026-09-06T01:00-03:00", "gap")]


def test_lord_howe__half_hour_shift() -> None:
    spec = {"cron": "15 2 * * *", "timezone": "Australia/Lord_Howe"}
    assert fires_on(spec, "2026-10-04") == [("2026-10-04T02:30+11:00", "gap")]
    assert fires_on({**spec, "cron": "45 1 * * *"}, "2026-04-05") == [
        ("2026-04-05T01:45+11:00", "repeat")
    ]


def test_gap__several_local_times__fire_once() -> None:
    fires = fires_on({"cron": "0,20,40 2 * * *", **NY}, "2026-03-08")
    assert fires == [("2026-03-08T03:00-04:00", "gap")]


# -- consistency of next_after and preview -----------------------------------------


@pytest.mark.parametrize(
    ("expr", "zone", "repeat"),
    [
        ("*/15 * * * *", "America/New_York", "first"),
        ("30 1 * * *", "America/New_York", "both"),
        ("0,30 1,2 * * *", "America/New_York", "first"),
        ("0,30 2 * * *", "Europe/Berlin", "last"),
        ("*/20 * * * * *", "Australia/Lord_Howe", "first"),
        ("10 */5 1 * * *", "Australia/Lord_Howe", "first"),
    ],
)
def test_next_after__from_any_point__continues_the_preview(
    expr: str, zone: str, repeat: str
) -> None:
    spec = {"cron": expr, "timezone": zone, "dst": {"repeat": repeat}}
    schedule = parse_schedule(spec, anchor_ms=0)
    for transition in transitions(zone, 2026):
        fires = preview(schedule, transition - 2 * HOUR_MS, 60)
        assert all(a.at_ms < b.at_ms for a, b in zip(fires, fires[1:], strict=False))
        for prev, fire in zip(fires, fires[1:], strict=False):
            for point in (prev.at_ms + 1, (prev.at_ms + fire.at_ms) // 2, fire.at_ms - 1):
                assert schedule.next_after(point) == fire


def test_preview__count_and_strictly_after() -> None:
    schedule = parse_schedule({"cron": "0 * * * *"}, anchor_ms=0)
    start = ms("2026-01-01T00:00:00+00:00")
    fires = preview(schedule, start, 5)
    assert [f.at_ms - start for f in fires] == [h * HOUR_MS for h in range(1, 6)]
    assert fires[0].local.tzinfo == ZoneInfo("UTC")


# -- intervals and one-offs --------------------------------------------------------


def test_every_ms__fires_at_anchor_plus_multiples() -> None:
    anchor = 1_000_000_007
    schedule = parse_schedule({"every_ms": 250}, anchor_ms=anchor)
    assert schedule.next_after(0).at_ms == anchor + 250
    assert schedule.next_after(anchor).at_ms == anchor + 250
    assert schedule.next_after(anchor + 250).at_ms == anchor + 500
    assert schedule.next_after(anchor + 251).at_ms == anchor + 500
    fires = preview(schedule, anchor + 10_000, 4)
    assert [f.at_ms for f in fires] == [anchor + 250 * k for k in range(41, 45)]
    assert fires[0].local == utc(fires[0].at_ms) and fires[0].dst is None


def test_at__fires_once_strictly_after() -> None:
    schedule = parse_schedule({"at": "2026-03-08T02:30:00.123+01:00"}, anchor_ms=0)
    at = ms("2026-03-08T01:30:00.123+00:00")
    assert schedule.next_after(at - 1) == Fire(at, utc(at))
    assert schedule.next_after(at) is None
    assert preview(schedule, 0, 10) == [Fire(at, utc(at))]


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("2026-03-08T02:30:00.123Z", "2026-03-08T02:30:00.123+00:00"),
        ("2026-03-08t02:30:00z", "2026-03-08T02:30:00+00:00"),
        ("2026-03-08T02:30:00.5-05:30", "2026-03-08T08:00:00.500+00:00"),
        ("2024-02-29T23:59:59.999+14:00", "2024-02-29T09:59:59.999+00:00"),
    ],
)
def test_at__rfc3339_forms(text: str, iso: str) -> None:
    assert parse_schedule({"at": text}, anchor_ms=0).at_ms == ms(iso)


# -- jitter ------------------------------------------------------------------------


def test_jitter__deterministic_and_in_range() -> None:
    offsets = [jitter_offset_ms(f"job-{i}", 1_780_000_000_000, 60_000) for i in range(2000)]
    assert offsets == [jitter_offset_ms(f"job-{i}", 1_780_000_000_000, 60_000) for i in range(2000)]
    assert all(0 <= o < 60_000 for o in offsets)
    assert len({o // 6000 for o in offsets}) == 10  # spread over the whole range
    assert jitter_offset_ms("job-1", 1, 60_000) != jitter_offset_ms("job-1", 2, 60_000)
    assert jitter_offset_ms("job-1", 1, 0) == 0


# -- validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"cron": "0 24 * * *"}, "schedule.cron", "hour: 24 is out of range 0-23"),
        ({"cron": "0 0 31 2 *"}, "schedule.cron", "never fires"),
        ({"cron": "0 0 30 2 *"}, "schedule.cron", "never fires"),
        ({"cron": 5}, "schedule.cron", "string"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "schedule.timezone", "unknown"),
        ({"cron": "* * * * *", "timezone": "localtime"}, "schedule.timezone", "unknown"),
        ({"cron": "* * * * *", "timezone": "../etc/passwd"}, "schedule.timezone", "unknown"),
        ({"cron": "* * * * *", "timezone": None}, "schedule.timezone", "unknown"),
        ({"cron": "* * * * *", "dst": {"gap": "jump"}}, "schedule.dst.gap", "shift, skip"),
        (
            {"cron": "* * * * *", "dst": {"repeat": "twice"}},
            "schedule.dst.repeat",
            "first, last, both",
        ),
        ({"cron": "* * * * *", "dst": {"fold": 1}}, "schedule.dst.fold", "unknown"),
        ({"cron": "* * * * *", "dst": "shift"}, "schedule.dst", "object"),
        ({"every_ms": 99}, "schedule.every_ms", "from 100"),
        ({"every_ms": 100.0}, "schedule.every_ms", "integer"),
        ({"every_ms": True}, "schedule.every_ms", "integer"),
        ({"every_ms": "1000"}, "schedule.every_ms", "integer"),
        ({"every_ms": 10**18}, "schedule.every_ms", "from 100"),
        ({"at": "9999-12-31T23:59:59.999-23:59"}, "schedule.at", "not a valid instant"),
        ({"at": "9500-01-01T00:00:00Z"}, "schedule.at", "between 1970 and 9000"),
        ({"every_ms": 1000, "timezone": "UTC"}, "schedule.timezone", "only applies to cron"),
        ({"at": "2026-03-08T02:30:00.123"}, "schedule.at", "offset"),
        ({"at": "2026-03-08 02:30:00Z"}, "schedule.at", "RFC 3339"),
        ({"at": "2026-03-08T02:30:00.1234Z"}, "schedule.at", "3 fractional digits"),
        ({"at": "2026-02-30T02:30:00Z"}, "schedule.at", "not a valid instant"),
        ({"at": "2026-03-08T02:30:00+24:00"}, "schedule.at", "out of range"),
        ({"at": 1772937000000}, "schedule.at", "RFC 3339"),
        ({"at": "2026-03-08T02:30:00Z", "dst": {}}, "schedule.dst", "only applies to cron"),
        ({"cron": "* * * * *", "every_ms": 1000}, "schedule", "exactly one of cron, every_ms, at"),
        ({}, "schedule", "exactly one"),
        ({"timezone": "UTC"}, "schedule", "exactly one"),
        ({"cron": "* * * * *", "tz": "UTC"}, "schedule.tz", "unknown field"),
        ({"cron": "* * * * *", "jitter_ms": -1}, "schedule.jitter_ms", ">= 0"),
        ("0 * * * *", "schedule", "object"),
    ],
)
def test_parse_schedule__bad_input__names_the_field(spec: object, field: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        parse_schedule(spec, anchor_ms=0)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert message in caught.value.message
    assert str(caught.value) == f"{field}: {caught.value.message}"


def test_parse_schedule__defaults() -> None:
    schedule = parse_schedule({"cron": "0 0 * * *"}, anchor_ms=0)
    assert isinstance(schedule, CronSchedule)
    assert (schedule.zone.key, schedule.gap, schedule.repeat, schedule.jitter_ms) == (
        "UTC",
        "shift",
        "first",
        0,
    )


def test_parse_schedule__accepts_the_job_level_keys_of_the_contract() -> None:
    spec = {"every_ms": 1000, "jitter_ms": 500, "catchup": {"window_ms": 1}, "overlap": "skip"}
    assert parse_schedule(spec, anchor_ms=0).jitter_ms == 500
