"""A job's definition: validation and the normalised form the store keeps.

Defaults are what a platform user would expect: retry 3 attempts with
exponential backoff, a 30 s lease, overlap allowed, and a catch-up window of
5 minutes firing every missed instant in it (at most 100).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cronwheel.core.errors import ValidationError
from cronwheel.core.runs import PRIORITIES
from cronwheel.core.schedule import ScheduleError, parse_schedule

MAX_PAYLOAD_BYTES = 256 * 1024
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
SCHEDULE_EXTRAS = ("jitter_ms", "catchup", "overlap")
OVERLAP = ("allow", "skip", "buffer_one")


@dataclass(frozen=True)
class Retry:
    max_attempts: int = 3
    initial_backoff_ms: int = 1000
    max_backoff_ms: int = 60_000
    multiplier: float = 2.0


@dataclass(frozen=True)
class Catchup:
    window_ms: int = 300_000
    policy: str = "all"
    max_runs: int = 100


@dataclass(frozen=True)
class JobSpec:
    name: str
    schedule: dict  # the schedule proper: cron/timezone/dst, every_ms or at
    target: dict
    payload: str = "null"  # JSON text, kept as the user sent it
    priority: str = "normal"
    retry: Retry = field(default_factory=Retry)
    timeout_ms: int | None = None
    lease_ms: int = 30_000
    overlap: str = "allow"
    catchup: Catchup = field(default_factory=Catchup)
    jitter_ms: int = 0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["payload"] = json.loads(self.payload)
        return d


def _int(value: Any, field_name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field_name, "must be an integer")
    if not lo <= value <= hi:
        raise ValidationError(field_name, f"must be between {lo} and {hi}")
    return value


def _obj(value: Any, field_name: str, allowed: set[str]) -> dict:
    if not isinstance(value, dict):
        raise ValidationError(field_name, "must be an object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        where = unknown[0] if field_name == "body" else f"{field_name}.{unknown[0]}"
        raise ValidationError(where, "unknown field")
    return value


def parse_retry(raw: Any, field_name: str = "retry") -> Retry:
    if raw is None:
        return Retry()
    d = _obj(
        raw, field_name, {"max_attempts", "initial_backoff_ms", "max_backoff_ms", "multiplier"}
    )
    base = Retry()
    mult = d.get("multiplier", base.multiplier)
    if isinstance(mult, bool) or not isinstance(mult, int | float) or not 1.0 <= mult <= 10.0:
        raise ValidationError(f"{field_name}.multiplier", "must be a number between 1 and 10")
    r = Retry(
        max_attempts=_int(
            d.get("max_attempts", base.max_attempts), f"{field_name}.max_attempts", 1, 100
        ),
        initial_backoff_ms=_int(
            d.get("initial_backoff_ms", base.initial_backoff_ms),
            f"{field_name}.initial_backoff_ms",
            0,
            86_400_000,
        ),
        max_backoff_ms=_int(
            d.get("max_backoff_ms", base.max_backoff_ms),
            f"{field_name}.max_backoff_ms",
            0,
            86_400_000,
        ),
        multiplier=float(mult),
    )
    if r.max_backoff_ms < r.initial_backoff_ms:
        raise ValidationError(f"{field_name}.max_backoff_ms", "must be at least initial_backoff_ms")
    return r


def parse_catchup(raw: Any) -> Catchup:
    if raw is None:
        return Catchup()
    d = _obj(raw, "schedule.catchup", {"window_ms", "policy", "max_runs"})
    base = Catchup()
    policy = d.get("policy", base.policy)
    if policy not in ("all", "latest"):
        raise ValidationError("schedule.catchup.policy", "must be 'all' or 'latest'")
    return Catchup(
        window_ms=_int(
            d.get("window_ms", base.window_ms), "schedule.catchup.window_ms", 0, 7 * 86_400_000
        ),
        policy=policy,
        max_runs=_int(d.get("max_runs", base.max_runs), "schedule.catchup.max_runs", 1, 1000),
    )


def parse_target(raw: Any, field_name: str = "target") -> dict:
    if not isinstance(raw, dict):
        raise ValidationError(field_name, "must be an object")
    kind = raw.get("type")
    if kind == "queue":
        _obj(raw, field_name, {"type", "queue"})
        queue = raw.get("queue")
        if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
            raise ValidationError(f"{field_name}.queue", "must be 1-100 of A-Z a-z 0-9 _ -")
        return {"type": "queue", "queue": queue}
    if kind == "webhook":
        _obj(raw, field_name, {"type", "url", "method", "headers", "timeout_ms"})
        url = raw.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if not parts or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValidationError(f"{field_name}.url", "must be an http(s) URL with a host")
        method = raw.get("method", "POST")
        if method not in ("POST", "PUT", "PATCH", "GET", "DELETE"):
            raise ValidationError(f"{field_name}.method", "must be POST, PUT, PATCH, GET or DELETE")
        headers = raw.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ValidationError(f"{field_name}.headers", "must be an object of strings")
        out = {"type": "webhook", "url": url, "method": method, "headers": headers}
        if "timeout_ms" in raw:
            out["timeout_ms"] = _int(raw["timeout_ms"], f"{field_name}.timeout_ms", 100, 900_000)
        return out
    if kind == "managed":
        _obj(raw, field_name, {"type", "command", "env", "limits"})
        cmd = raw.get("command")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise ValidationError(f"{field_name}.command", "must be a non-empty list of strings")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValidationError(f"{field_name}.env", "must be an object of strings")
        limits = _obj(
            raw.get("limits", {}),
            f"{field_name}.limits",
            {"memory_mb", "cpu_ms", "pids", "network"},
        )
        out_limits: dict[str, Any] = {}
        for key, lo, hi in (
            ("memory_mb", 16, 16384),
            ("cpu_ms", 10, 86_400_000),
            ("pids", 1, 4096),
        ):
            if key in limits:
                out_limits[key] = _int(limits[key], f"{field_name}.limits.{key}", lo, hi)
        if "network" in limits:
            if not isinstance(limits["network"], bool):
                raise ValidationError(f"{field_name}.limits.network", "must be true or false")
            out_limits["network"] = limits["network"]
        return {"type": "managed", "command": cmd, "env": env, "limits": out_limits}
    raise ValidationError(f"{field_name}.type", "must be one of queue, webhook, managed")


ENV_MASK = "********"  # what an answer shows for each value of a managed target's env


def shown_target(target: Any) -> Any:
    """A target as answers show it: a managed target's env values are
    write-only (names kept, values masked). Jobs, runs and workflow nodes
    all carry targets, and every answer goes through here."""
    if isinstance(target, dict) and isinstance(target.get("env"), dict) and target["env"]:
        return {**target, "env": dict.fromkeys(target["env"], ENV_MASK)}
    return target


def payload_text(raw: Any, present: bool = True) -> str:
    text = json.dumps(raw if present else None, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise ValidationError(
            "payload", "is larger than 256 KiB", code="PAYLOAD_TOO_LARGE", status=413
        )
    return text


def parse_job(
    body: Any, *, now_ms: int, allowed_priorities: tuple[str, ...] = PRIORITIES
) -> JobSpec:
    """Validate a job as the API receives it; raises ValidationError naming the field."""
    d = _obj(
        body,
        "body",
        {"name", "schedule", "target", "payload", "priority", "retry", "timeout_ms", "lease_ms"},
    )
    name = d.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise ValidationError("name", "must be a string of 1-200 characters")
    raw_sched = d.get("schedule")
    if not isinstance(raw_sched, dict):
        raise ValidationError("schedule", "must be an object")
    schedule = {k: v for k, v in raw_sched.items() if k not in SCHEDULE_EXTRAS}
    try:
        parse_schedule(schedule, anchor_ms=now_ms)
    except ScheduleError as e:
        raise ValidationError(e.field, e.message) from e
    overlap = raw_sched.get("overlap", "allow")
    if overlap not in OVERLAP:
        raise ValidationError("schedule.overlap", "must be allow, skip or buffer_one")
    priority = d.get("priority", "normal")
    if priority not in PRIORITIES:
        raise ValidationError("priority", "must be critical, high, normal or low")
    if priority not in allowed_priorities:
        raise ValidationError(
            "priority",
            f"this tenant may not use class {priority!r}",
            code="PRIORITY_NOT_ALLOWED",
            status=403,
        )
    timeout = d.get("timeout_ms")
    return JobSpec(
        name=name,
        schedule=schedule,
        target=parse_target(d.get("target")),
        payload=payload_text(d.get("payload"), "payload" in d),
        priority=priority,
        retry=parse_retry(d.get("retry")),
        timeout_ms=None if timeout is None else _int(timeout, "timeout_ms", 100, 7 * 86_400_000),
        lease_ms=_int(d.get("lease_ms", 30_000), "lease_ms", 1000, 3_600_000),
        overlap=overlap,
        catchup=parse_catchup(raw_sched.get("catchup")),
        jitter_ms=_int(raw_sched.get("jitter_ms", 0), "schedule.jitter_ms", 0, 3_600_000),
    )
