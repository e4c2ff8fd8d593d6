"""The platform's health as the database knows it, for the operator
(GET /v1/system; the broker's half is the gateway's, services/gateway/system.py).

What each figure is made of (sql/system.sql): which services lease the
partitions and whether all 1024 are held; the relay's backlog (ready outbox
rows and the age of the oldest); timers overdue (the firing loop behind);
firing and start lateness of recent runs of jobs, p50 and p99; open runs by
state, and those the pending-deadline sweep announced again. Every statement
is bounded (a LIMIT on an index scan, or a table of the platform's whose size
does not grow with the work), so each section says `capped` when it stopped
counting rather than reading on.

Each section runs in a savepoint of the caller's transaction: one that fails
(a database not yet migrated to 0024, a statement timeout) is reported in
words in its place and the others still answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.ids import PARTITIONS
from cronwheel.store.sql_loader import queries

Q = queries("system")

CAP = 100_000  # rows a counting statement reads at most
SAMPLE = 20_000  # runs in the lateness sample, about: an equal share a tenant
MIN_SHARE = 20  # runs a tenant may bring to it at least, however many tenants
OVERDUE_MS = 10_000  # a timer this long past due is overdue (a healthy one: ms)
TIMER_KIND = ("timer", "relay")  # lease services named without the topic prefix


@dataclass(frozen=True)
class LeaseService:
    service: str
    partitions: int
    leased: int
    owners: int
    lease_until: datetime | None
    members: int
    member_until: datetime | None


@dataclass(frozen=True)
class Backlog:
    scanned: int
    ready: int
    held: int
    oldest_ready_at: datetime | None


@dataclass(frozen=True)
class Overdue:
    scanned: int
    oldest_due_at: datetime | None


@dataclass(frozen=True)
class Lateness:
    runs: int
    fired_p50_ms: int | None
    fired_p99_ms: int | None
    fired_max_ms: int | None
    started: int
    started_p50_ms: int | None
    started_p99_ms: int | None
    started_max_ms: int | None
    sampled: bool


@dataclass(frozen=True)
class OpenRuns:
    scanned: int
    pending: int
    running: int
    retry_wait: int
    reannounced_waiting: int
    reannounced_recently: int
    last_reannounced_at: datetime | None


def _at(dt: datetime | None) -> str | None:
    return None if dt is None else iso(to_ms(dt))


def _one(conn: psycopg.Connection, cls, name: str, params: dict):
    with conn.cursor(row_factory=class_row(cls)) as cur:
        return cur.execute(Q[name], params).fetchone()


def kind_of(service: str, prefix: str) -> str | None:
    """The service kind a lease service names: `timer`, `relay`, or a
    consumer's group `<prefix>.<kind>`; None for another deployment's group."""
    if service in TIMER_KIND:
        return service
    head, _, kind = service.partition(".")
    return kind if head == prefix and kind else None


def services(conn: psycopg.Connection, now: int, prefix: str) -> dict:
    """Each service kind that leases partitions, with `ready`: an instance
    alive and every partition held."""
    with conn.cursor(row_factory=class_row(LeaseService)) as cur:
        rows = cur.execute(Q["lease_services"], {"now": to_dt(now)}).fetchall()
    out = []
    for r in rows:
        kind = kind_of(r.service, prefix)
        if kind is None:
            continue
        instances = max(r.owners, r.members)
        # The newest lease's or announcement's end: renewed every third of
        # its time to live while an instance is alive, in the past once none is.
        until = max((t for t in (r.lease_until, r.member_until) if t is not None), default=None)
        out.append(
            {
                "kind": kind,
                "service": r.service,
                "instances": instances,
                "partitions": r.partitions,
                "partitions_leased": r.leased,
                "ready": instances > 0 and r.leased == PARTITIONS,
                "lease_until": _at(until),
            }
        )
    return {"items": out}


def outbox(conn: psycopg.Connection, now: int) -> dict:
    b = _one(conn, Backlog, "outbox_backlog", {"now": to_dt(now), "cap": CAP})
    return {
        "ready": b.ready,
        "held": b.held,
        "capped": b.scanned >= CAP,
        "oldest_ready_at": _at(b.oldest_ready_at),
        "oldest_ready_age_ms": (
            None if b.oldest_ready_at is None else max(0, now - to_ms(b.oldest_ready_at))
        ),
    }


def overdue_timers(conn: psycopg.Connection, now: int) -> dict:
    o = _one(conn, Overdue, "overdue_timers", {"before": to_dt(now - OVERDUE_MS), "cap": CAP})
    return {
        "overdue": o.scanned,
        "capped": o.scanned >= CAP,
        "overdue_after_ms": OVERDUE_MS,
        "oldest_due_at": _at(o.oldest_due_at),
    }


def lateness(conn: psycopg.Connection, now: int, window_ms: int) -> dict:
    since = to_dt(now - window_ms)
    row = _one(
        conn,
        Lateness,
        "lateness",
        {"since": since, "now": to_dt(now), "sample": SAMPLE, "min_share": MIN_SHARE},
    )
    return {
        "window_ms": window_ms,
        "measured_from": "scheduled_at",
        "sampled": row.sampled,
        "fired": {
            "runs": row.runs,
            "p50_ms": row.fired_p50_ms,
            "p99_ms": row.fired_p99_ms,
            "max_ms": row.fired_max_ms,
        },
        "started": {
            "runs": row.started,
            "p50_ms": row.started_p50_ms,
            "p99_ms": row.started_p99_ms,
            "max_ms": row.started_max_ms,
        },
    }


def open_runs(conn: psycopg.Connection, now: int, window_ms: int) -> dict:
    o = _one(conn, OpenRuns, "open_runs", {"since": to_dt(now - window_ms), "cap": CAP})
    out = asdict(o)
    out["capped"] = out.pop("scanned") >= CAP
    out["last_reannounced_at"] = _at(o.last_reannounced_at)
    return out


def _section(conn: psycopg.Connection, fn: Callable[[], dict]) -> dict:
    """`fn()`'s answer, or {"error": words} when it failed; in a savepoint,
    so a failed section leaves the transaction usable for the next."""
    try:
        with conn.transaction():
            return fn()
    except psycopg.Error as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def figures(conn: psycopg.Connection, now: int, window_ms: int, prefix: str) -> dict:
    """Every section: its figures, or {"error": words}."""
    conn.execute(Q["time_limit"])
    return {
        "services": _section(conn, lambda: services(conn, now, prefix)),
        "outbox": _section(conn, lambda: outbox(conn, now)),
        "timers": _section(conn, lambda: overdue_timers(conn, now)),
        "lateness": _section(conn, lambda: lateness(conn, now, window_ms)),
        "runs": _section(conn, lambda: open_runs(conn, now, window_ms)),
    }
