"""Cron expressions with the semantics of cronie, the Linux cron.

Evaluated by our own code rather than croniter, which misplaces fires around
DST with tz-aware datetimes, reads a one-value range such as ``21-21`` as
``*`` (7.0.0) and treats ``*/2`` in day-of-week as a restriction where cronie
does not (see docs/schedules.md).

This module knows nothing about time zones: it matches naive local
wall-clock times. ``cronwheel.core.schedule`` maps those to real instants.
"""

from __future__ import annotations

import calendar
import functools
from bisect import bisect_left
from dataclasses import dataclass
from datetime import MAXYEAR, datetime, timedelta
from functools import cached_property

__all__ = ["Cron", "CronError", "parse_cron"]


class CronError(ValueError):
    """A cron expression that cronie would refuse; the message names the field."""


_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTH_NAMES = {name: i + 1 for i, name in enumerate(_MONTHS)}
_DAY_NAMES = {name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}

# cronie's @-shortcuts, as the five fields they stand for.
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# The longest wait between two fires of an expression that can fire at all:
# 29 February on a given weekday recurs at most 40 years apart (across 2100).
_HORIZON_YEARS = 41
_LAST_SECOND = datetime(MAXYEAR, 12, 31, 23, 59, 59)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day of month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTH_NAMES)
_DOW = _Field("day of week", 0, 7, _DAY_NAMES)


def _value(field: _Field, token: str) -> int:
    if token.isascii() and token.isdigit():
        value = int(token)
    elif field.names is not None and token.lower() in field.names:
        return field.names[token.lower()]
    else:
        kind = "a number or a name" if field.names else "a number"
        raise CronError(f"{field.name}: {token!r} is not {kind}")
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name}: {value} is out of range {field.low}-{field.high}")
    return value


def _parse_field(field: _Field, text: str) -> frozenset[int]:
    """cronie's grammar: list = range {"," range}; range = ("*" | a | a "-" b) ["/" step].

    ``a/step`` means ``a-high/step`` (as in current cronie); a step larger than
    the range is allowed and selects the first value only.
    """
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
                raise CronError(f"{field.name}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, stop = field.low, field.high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, stop = _value(field, first), _value(field, last)
            if start > stop:
                raise CronError(f"{field.name}: range {base} runs backwards")
        elif base:
            start = _value(field, base)
            stop = field.high if slash else start
        else:
            raise CronError(f"{field.name}: empty element in {text!r}")
        values.update(range(start, stop + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the allowed values of each field, and cronie's star flags.

    ``dom_star``/``dow_star`` record whether the raw field text starts with
    ``*``: cronie then ANDs the two day fields, otherwise it ORs them.
    """

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday (7 folded into 0)
    hour_star: bool
    dom_star: bool
    dow_star: bool
    has_seconds: bool

    @property
    def hour_field_is_wildcard(self) -> bool:
        """True if the hour field starts with ``*``: the DST rule then keeps spacing."""
        return self.hour_star

    @cached_property
    def can_fire(self) -> bool:
        """False when no calendar date ever matches (e.g. ``0 0 30 2 *``).

        With the days ORed, every month has every weekday. With them ANDed,
        any real date (29 February included) falls on every weekday over the
        400-year Gregorian cycle, so a real (month, day) pair is enough.
        """
        if not (self.dom_star or self.dow_star):
            return True
        return any(d <= _longest_month(m) for m in self.months for d in self.days)

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """cronie's day rule (ignores the month field)."""
        weekday = (calendar.weekday(year, month, day) + 1) % 7
        return self._day_rule(day, weekday)

    def matches(self, local: datetime) -> bool:
        """Whether a naive wall-clock time (to the second) matches."""
        return (
            local.second in self.seconds
            and local.minute in self.minutes
            and local.hour in self.hours
            and local.month in self.months
            and self.day_matches(local.year, local.month, local.day)
        )

    def next_local(self, after: datetime) -> datetime | None:
        """The first matching naive wall-clock time strictly after ``after``.

        Skips whole months, days, hours and minutes that cannot match, so the
        cost does not depend on the field resolution. Returns None for an
        expression that can never fire, or past year 9999.
        """
        if not self.can_fire:
            return None
        start = after.replace(tzinfo=None, microsecond=0)
        if start >= _LAST_SECOND:
            return None
        t = start + timedelta(seconds=1)
        year, month, day = t.year, t.month, t.day
        hour, minute, second = t.hour, t.minute, t.second
        last_year = min(year + _HORIZON_YEARS, MAXYEAR)
        while year <= last_year:
            # Each step moves to the smallest candidate that could still match
            # and restarts from the top; an overflow (month 13, hour 24, ...)
            # finds no value and carries into the next larger unit.
            m = _ceil(self.months, month)
            if m is None:
                year, month, day, hour, minute, second = year + 1, 1, 1, 0, 0, 0
                continue
            if m != month:
                month, day, hour, minute, second = m, 1, 0, 0, 0
            d = self._next_day(year, month, day)
            if d is None:
                month, day, hour, minute, second = month + 1, 1, 0, 0, 0
                continue
            if d != day:
                day, hour, minute, second = d, 0, 0, 0
            h = _ceil(self.hours, hour)
            if h is None:
                day, hour, minute, second = day + 1, 0, 0, 0
                continue
            if h != hour:
                hour, minute, second = h, 0, 0
            mi = _ceil(self.minutes, minute)
            if mi is None:
                hour, minute, second = hour + 1, 0, 0
                continue
            if mi != minute:
                minute, second = mi, 0
            s = _ceil(self.seconds, second)
            if s is None:
                minute, second = minute + 1, 0
                continue
            return datetime(year, month, day, hour, minute, s)
        return None

    def _day_rule(self, day: int, weekday: int) -> bool:
        dom, dow = day in self.days, weekday in self.weekdays
        return (dom and dow) if (self.dom_star or self.dow_star) else (dom or dow)

    def _next_day(self, year: int, month: int, day: int) -> int | None:
        first_weekday, length = calendar.monthrange(year, month)
        for d in range(day, length + 1):
            if self._day_rule(d, (first_weekday + d) % 7):
                return d
        return None


def parse_cron(text: str) -> Cron:
    """Parse 5 fields (minute hour dom month dow), 6 with seconds first, or an @-shortcut.

    Cached by text: a Cron is immutable, and thousands of jobs share a handful
    of expressions (registering a batch parsed each one twice)."""
    if not isinstance(text, str):
        raise CronError("expression must be a string")
    return _parse_cron(text)


@functools.lru_cache(maxsize=4096)
def _parse_cron(text: str) -> Cron:
    text = text.strip()
    if text.startswith("@") and text.lower() not in _MACROS:
        raise CronError(f"unknown shortcut {text!r}")
    fields = _MACROS.get(text.lower(), text).split()
    has_seconds = len(fields) == 6
    if len(fields) == 5:
        fields.insert(0, "0")
    elif not has_seconds:
        raise CronError(f"expected 5 or 6 fields, got {len(fields)}")
    sec, minute, hour, dom, month, dow = fields
    weekdays = frozenset(d % 7 for d in _parse_field(_DOW, dow))
    return Cron(
        text=text,
        seconds=tuple(sorted(_parse_field(_SECOND, sec))),
        minutes=tuple(sorted(_parse_field(_MINUTE, minute))),
        hours=tuple(sorted(_parse_field(_HOUR, hour))),
        days=_parse_field(_DOM, dom),
        months=tuple(sorted(_parse_field(_MONTH, month))),
        weekdays=weekdays,
        hour_star=hour.startswith("*"),
        dom_star=dom.startswith("*"),
        dow_star=dow.startswith("*"),
        has_seconds=has_seconds,
    )


def _ceil(values: tuple[int, ...], v: int) -> int | None:
    """The smallest of the sorted ``values`` that is >= v."""
    i = bisect_left(values, v)
    return values[i] if i < len(values) else None


def _longest_month(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]
