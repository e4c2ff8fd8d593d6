"""The schedule preview shared by `cronwheel preview` and
`GET /v1/schedules/preview`: the same code the timer fires with."""

from __future__ import annotations

from datetime import datetime

from cronwheel.core.clock import iso, now_ms, to_ms
from cronwheel.core.errors import ValidationError
from cronwheel.core.schedule import ScheduleError, parse_schedule, preview

MAX_COUNT = 1000


def parse_from(text: str | None) -> int:
    if text is None:
        return now_ms()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise ValidationError("from", "must be an RFC 3339 instant") from e
    if moment.tzinfo is None:
        raise ValidationError("from", "must carry an offset or Z")
    return to_ms(moment)


def preview_json(spec: dict, *, count: int = 10, from_iso: str | None = None) -> dict:
    """{"fires": [{"at", "local", "dst"}...]} for the fires strictly after `from`."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValidationError("count", f"must be an integer from 1 to {MAX_COUNT}")
    after = parse_from(from_iso)
    try:
        sched = parse_schedule(spec, anchor_ms=after)
    except ScheduleError as e:
        raise ValidationError(e.field.removeprefix("schedule."), e.message) from e
    return {
        "fires": [
            {"at": iso(f.at_ms), "local": _local_iso(f.local), "dst": f.dst}
            for f in preview(sched, after, count)
        ]
    }


def _local_iso(local: datetime) -> str:
    return local.isoformat(timespec="milliseconds")


def render_table(doc: dict) -> str:
    lines = [f"{'UTC':<26} {'local':<31} dst"]
    for f in doc["fires"]:
        lines.append(f"{f['at']:<26} {f['local']:<31} {f['dst'] or ''}")
    return "\n".join(lines)
