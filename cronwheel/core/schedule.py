"""Schedules: when a job fires, as UTC millisecond instants.

Three kinds (CONTRACT "Schedules"): a cron expression in an IANA time zone,
a fixed interval (``every_ms``) and a one-off instant (``at``).

Cron is evaluated on naive local wall-clock time (``cronwheel.core.cron``) and
each matching local time is mapped to real instants with ``zoneinfo``. The DST
policy (DESIGN "DST policy", docs/schedules.md) decides what happens to a
local time that does not exist (a spring-forward gap) or exists twice (a
fall-back repeat):

* hour field starting with ``*``: fire at every real instant whose local
  reading matches, so spacing is kept; a gap fires nothing, a repeat fires
  twice.
* otherwise: a gap fires once at the instant the clock jumps (``gap:
  shift``) or not at all (``skip``); a repeat fires at the first occurrence
  (``repeat: first``), the second (``last``) or both (``both``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any, Literal, Protocol
from zoneinfo import ZoneInfo

from cronwheel.core.cron import Cron, CronError, parse_cron

__all__ = [
    "CronSchedule",
    "Fire",
    "IntervalSchedule",
    "OnceSchedule",
    "Schedule",
    "ScheduleError",
    "jitter_offset_ms",
    "parse_schedule",
    "preview",
]

MIN_EVERY_MS = 100
MAX_EVERY_MS = 366 * 86_400_000  # a year: longer intervals are `at` or cron
GAP_POLICIES = ("shift", "skip")
REPEAT_POLICIES = ("first", "last", "both")

DstMark = Literal["gap", "repeat"] | None

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_TICK = timedelta(microseconds=1)  # next_local(t - _TICK) may return t itself
_KINDS = ("cron", "every_ms", "at")
# Keys of the job's `schedule` object that other layers validate and use.
_FOREIGN_KEYS = ("catchup", "overlap")
_KEYS = {*_KINDS, "timezone", "dst", "jitter_ms", *_FOREIGN_KEYS}
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,3}))?"
    r"(?:[Zz]|([+-])(\d{2}):(\d{2}))"
)


class ScheduleError(ValueError):
    """Bad schedule input; ``field`` is the path of the offending value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Fire:
    """One scheduled instant.

    ``local`` is the instant read in the schedule's zone (UTC for intervals
    and one-offs); ``dst`` says whether the DST policy shaped it: "gap" (a
    local time that did not exist was shifted here) or "repeat" (the local
    time occurs twice that day).
    """

    at_ms: int
    local: datetime
    dst: DstMark = None


class Schedule(Protocol):
    @property
    def jitter_ms(self) -> int: ...

    def next_after(self, after_ms: int) -> Fire | None:
        """The first fire strictly after ``after_ms``, or None if there is none."""
        ...


@dataclass(frozen=True)
class IntervalSchedule:
    """Fires at ``anchor_ms + k * every_ms`` for k >= 1."""

    every_ms: int
    anchor_ms: int
    jitter_ms: int = 0

    def next_after(self, after_ms: int) -> Fire | None:
        k = max(1, (after_ms - self.anchor_ms) // self.every_ms + 1)
        at_ms = self.anchor_ms + k * self.every_ms
        return Fire(at_ms, _utc(at_ms))


@dataclass(frozen=True)
class OnceSchedule:
    """Fires once, at ``at_ms``."""

    at_ms: int
    jitter_ms: int = 0

    def next_after(self, after_ms: int) -> Fire | None:
        return Fire(self.at_ms, _utc(self.at_ms)) if self.at_ms > after_ms else None


@dataclass(frozen=True)
class CronSchedule:
    """A cron expression in a time zone, with the DST policy applied."""

    cron: Cron
    zone: ZoneInfo
    gap: Literal["shift", "skip"] = "shift"
    repeat: Literal["first", "last", "both"] = "first"
    jitter_ms: int = 0

    def next_after(self, after_ms: int) -> Fire | None:
        """The earliest fire strictly after ``after_ms``.

        Local times are enumerated in order and mapped to instants. That
        order is the order of the fires except inside a fall-back repeat:
        while the first pass of a repeat runs, the second pass brings back
        earlier local times. So when ``after_ms`` lies in a first pass, the
        fires of the second pass (from the transition on) are searched
        separately and the earlier of the two wins.
        """
        local = self._local(after_ms)
        best = self._first_fire(local.replace(tzinfo=None, fold=0), after_ms)
        if local.fold == 0 and (length := _repeat_length(local)):
            switch = self._transition(after_ms, after_ms + length // _MS)
            second = self._first_fire(self._reading(switch) - _TICK, switch - 1)
            if best is None or (second is not None and second.at_ms < best.at_ms):
                best = second
        return best

    def _first_fire(self, local: datetime, after_ms: int) -> Fire | None:
        """The earliest fire after ``after_ms`` that comes from a local time after ``local``.

        Callers ensure that these fires come in the order of their local
        times, so the first one found wins. A shifted fire is found before a
        regular fire at the same instant (the local time the clock jumps to),
        and keeps its "gap" mark.
        """
        wildcard = self.cron.hour_field_is_wildcard
        while (found := self.cron.next_local(local)) is not None:
            local = found
            instants = self._instants(local)
            if not instants:
                at_ms = self._transition(*self._fold_readings(local))
                if not wildcard and self.gap == "shift":
                    return Fire(at_ms, self._local(at_ms), "gap")
                # Nothing else in this gap fires at another instant: resume after it.
                local = self._reading(at_ms) - _TICK
                continue
            repeated = len(instants) == 2
            if repeated and not wildcard and self.repeat == "first":
                if instants[0] <= after_ms:
                    # after_ms is past this repeat's first pass: skip the rest of it.
                    local += (self._transition(*instants) - instants[0]) * _MS - _TICK
                    continue
                instants = instants[:1]
            elif repeated and not wildcard and self.repeat == "last":
                instants = instants[1:]
            later = [ms for ms in instants if ms > after_ms]
            if later:
                return Fire(later[0], self._local(later[0]), "repeat" if repeated else None)
        return None

    def _instants(self, local: datetime) -> list[int]:
        """The real instants whose reading is ``local``: none in a gap, two in a repeat."""
        return sorted({ms for ms in self._fold_readings(local) if self._reading(ms) == local})

    def _fold_readings(self, local: datetime) -> tuple[int, int]:
        """``local`` read with the offsets before and after a nearby transition."""
        first, second = (_ms(local.replace(tzinfo=self.zone, fold=f)) for f in (0, 1))
        return min(first, second), max(first, second)

    def _transition(self, lo: int, hi: int) -> int:
        """The instant in (lo, hi] at which the zone's UTC offset changes (bisection)."""
        offset = self._local(lo).utcoffset()
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._local(mid).utcoffset() == offset:
                lo = mid
            else:
                hi = mid
        return hi

    def _local(self, ms: int) -> datetime:
        return _utc(ms).astimezone(self.zone)

    def _reading(self, ms: int) -> datetime:
        return self._local(ms).replace(tzinfo=None, fold=0)


def _repeat_length(local: datetime) -> timedelta:
    """How long the repeat containing this reading lasts (zero if it is not repeated)."""
    first, second = local.replace(fold=0).utcoffset(), local.replace(fold=1).utcoffset()
    assert first is not None and second is not None
    return max(first - second, timedelta())


def preview(schedule: Schedule, after_ms: int, count: int) -> list[Fire]:
    """The next ``count`` fires strictly after ``after_ms``."""
    fires: list[Fire] = []
    while len(fires) < count:
        fire = schedule.next_after(fires[-1].at_ms if fires else after_ms)
        if fire is None:
            break
        fires.append(fire)
    return fires


def jitter_offset_ms(job_id: str, at_ms: int, jitter_ms: int) -> int:
    """A delay in [0, jitter_ms) that spreads a herd of jobs due at the same instant.

    Derived from a hash of (job, instant), not from randomness, so every
    replica and every retry of the firing transaction computes the same value.
    """
    if jitter_ms <= 0:
        return 0
    digest = hashlib.blake2b(f"{job_id}\x00{at_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % jitter_ms


def parse_schedule(spec: dict[str, Any], *, anchor_ms: int) -> Schedule:
    """Validate a job's ``schedule`` object (CONTRACT) and build its schedule.

    ``anchor_ms`` is when the job was created: intervals count from it.
    ``catchup`` and ``overlap`` are accepted here but belong to the caller.
    """
    if not isinstance(spec, dict):
        raise ScheduleError("schedule", "must be an object")
    unknown = sorted(map(str, set(spec) - _KEYS))
    if unknown:
        raise ScheduleError(f"schedule.{unknown[0]}", "unknown field")
    kinds = [k for k in _KINDS if k in spec]
    if len(kinds) != 1:
        raise ScheduleError("schedule", "needs exactly one of cron, every_ms, at")
    jitter_ms = spec.get("jitter_ms", 0)
    if not _is_int(jitter_ms) or jitter_ms < 0:
        raise ScheduleError("schedule.jitter_ms", "must be an integer >= 0")
    if kinds == ["cron"]:
        return _parse_cron_schedule(spec, jitter_ms)
    for key in ("timezone", "dst"):
        if key in spec:
            raise ScheduleError(f"schedule.{key}", "only applies to cron schedules")
    if kinds == ["every_ms"]:
        every_ms = spec["every_ms"]
        if not _is_int(every_ms) or not MIN_EVERY_MS <= every_ms <= MAX_EVERY_MS:
            raise ScheduleError(
                "schedule.every_ms", f"must be an integer from {MIN_EVERY_MS} to {MAX_EVERY_MS}"
            )
        return IntervalSchedule(every_ms, anchor_ms, jitter_ms)
    return OnceSchedule(_parse_instant(spec["at"]), jitter_ms)


def _parse_cron_schedule(spec: dict[str, Any], jitter_ms: int) -> CronSchedule:
    text = spec["cron"]
    if not isinstance(text, str):
        raise ScheduleError("schedule.cron", "must be a string")
    try:
        cron = parse_cron(text)
    except CronError as e:
        raise ScheduleError("schedule.cron", str(e)) from None
    if not cron.can_fire:
        raise ScheduleError("schedule.cron", "never fires: no calendar date matches it")
    zone = _zone(spec.get("timezone", "UTC"))
    dst = spec.get("dst", {})
    if not isinstance(dst, dict):
        raise ScheduleError("schedule.dst", "must be an object")
    unknown = sorted(map(str, set(dst) - {"gap", "repeat"}))
    if unknown:
        raise ScheduleError(f"schedule.dst.{unknown[0]}", "unknown field")
    gap, repeat = dst.get("gap", "shift"), dst.get("repeat", "first")
    if gap not in GAP_POLICIES:
        raise ScheduleError("schedule.dst.gap", f"must be one of {', '.join(GAP_POLICIES)}")
    if repeat not in REPEAT_POLICIES:
        raise ScheduleError("schedule.dst.repeat", f"must be one of {', '.join(REPEAT_POLICIES)}")
    return CronSchedule(cron, zone, gap, repeat, jitter_ms)


def _zone(name: Any) -> ZoneInfo:
    if not isinstance(name, str) or name not in _zone_names():
        raise ScheduleError("schedule.timezone", f"unknown IANA time zone {name!r}")
    return ZoneInfo(name)


@cache
def _zone_names() -> frozenset[str]:
    # The IANA names that the tzdata package lists: trying ZoneInfo(name)
    # would also accept files such as "localtime" that are not zone names.
    return frozenset(resources.files("tzdata").joinpath("zones").read_text().split())


def _parse_instant(text: Any) -> int:
    """RFC 3339 with an offset (``Z`` or ``+hh:mm``) and at most millisecond digits."""
    match = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ScheduleError(
            "schedule.at",
            "must be an RFC 3339 instant with an offset and at most 3 fractional digits, "
            "e.g. 2026-03-08T02:30:00.123Z",
        )
    year, month, day, hour, minute, second, frac, sign, off_h, off_m = match.groups()
    try:
        if int(off_h or 0) > 23 or int(off_m or 0) > 59:
            raise ValueError(f"offset {sign}{off_h}:{off_m} out of range")
        wall = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second))
        offset = timedelta(hours=int(off_h or 0), minutes=int(off_m or 0))
        utc = wall - offset if sign == "+" else wall + offset
    except (ValueError, OverflowError) as e:
        raise ScheduleError("schedule.at", f"not a valid instant: {e}") from None
    if not 1970 <= utc.year <= 9000:
        raise ScheduleError("schedule.at", "must be between 1970 and 9000")
    return _ms(utc.replace(tzinfo=UTC)) + int((frac or "0").ljust(3, "0"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _utc(ms: int) -> datetime:
    return _EPOCH + ms * _MS


def _ms(moment: datetime) -> int:
    return (moment - _EPOCH) // _MS
