"""Instants are ints of UTC milliseconds in the core; datetimes only at the edges
(the database and the API), converted here so precision is never lost."""

from __future__ import annotations

import time
from datetime import UTC, datetime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)


def to_ms(dt: datetime) -> int:
    if dt.tzinfo is None:
        raise ValueError("naive datetime: instants must be aware")
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def iso(ms: int) -> str:
    """RFC 3339 in UTC with milliseconds and Z, as the API prints instants."""
    d = to_dt(ms)
    return f"{d.year:04d}-" + d.strftime("%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
