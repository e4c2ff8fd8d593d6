"""Reading runs for the API: a tenant's runs filtered and paged, and one run with
the history of its attempts, from the day-partitioned runs_daily (v0.3.0),
cut at the tenant's retention. Writes to runs live in firing.py and
lifecycle.py (mirrored into runs_daily by migration 0025's triggers).

Cursors are keyset positions `<created_at in µs>.<run_id>` (opaque to clients):
a page is stable while new runs arrive, and a deep page costs what the first
one does.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime, timedelta

from psycopg.rows import dict_row

from cronwheel import config
from cronwheel.core.clock import iso, to_ms
from cronwheel.core.errors import NotFound, ValidationError
from cronwheel.core.ids import partition_of_run
from cronwheel.core.jobs import shown_target
from cronwheel.core.runs import RunState
from cronwheel.store.sql_loader import queries, splice

Q = splice(queries("runs_read"), {"runs_read": queries("runs_read")})
MAX_LIMIT = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


@functools.cache
def _default_days() -> int:
    """CRONWHEEL_RUN_RETENTION_DAYS: where a tenant's reads stop without its own."""
    return config.load(config.RunRetention).days


def _when(dt: datetime | None) -> str | None:
    return None if dt is None else iso(to_ms(dt))


def view(row: dict) -> dict:
    """A run as the API shows it."""
    out = {
        "run_id": row["run_id"],
        "tenant_id": row["tenant_id"],
        "job_id": row["job_id"],
        "workflow_run_id": row["workflow_run_id"],
        "node": row["node"],
        "state": row["state"],
        "attempt": row["attempt"],
        "priority": row["priority"],
        "target": shown_target(row["target"]),
        "scheduled_at": _when(row["scheduled_at"]),
        "covers": [iso(ms) for ms in row["covers"]] if row["covers"] else None,
        "worker_id": row["worker_id"],
        "lease_expires_at": _when(row["lease_expires_at"]),
        "result": row["result"],
        "error": row["error"],
        "created_at": _when(row["created_at"]),
        "started_at": _when(row["started_at"]),
        "finished_at": _when(row["finished_at"]),
        "updated_at": _when(row["updated_at"]),
        # PENDING past its deadline, announced again (docs/pending-deadline.md)
        "reannounced": row["reannounced"] or 0,
        "last_reannounced_at": _when(row["last_reannounced_at"]),
    }
    if "payload" in row:
        out["payload"] = json.loads(row["payload"]) if row["payload"] is not None else None
    return out


def _cursor(row: dict) -> str:
    return f"{(row['created_at'] - _EPOCH) // _US}.{row['run_id']}"


def _parse_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        us, run_id = cursor.split(".", 1)
        partition_of_run(run_id)
        return _EPOCH + int(us) * _US, run_id
    except (ValueError, OverflowError) as e:
        raise ValidationError("cursor", "is not a cursor this API returned") from e


def _id_filter(value: str | None, field: str) -> str | None:
    if value is not None and not _ID.match(value):
        raise ValidationError(field, "is not an id")
    return value


def list_runs(
    conn,
    tenant_id: str,
    *,
    job_id: str | None = None,
    state: str | None = None,
    workflow_run_id: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> dict:
    """{"items": [...], "next_cursor": str | None}, newest first."""
    if state is not None and state not in RunState.__members__:
        raise ValidationError("state", f"must be one of {', '.join(RunState.__members__)}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError("limit", f"must be an integer from 1 to {MAX_LIMIT}")
    after_created, after_id = _parse_cursor(cursor) if cursor else (None, None)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            Q["list_runs"],
            {
                "tenant_id": tenant_id,
                "default_days": _default_days(),
                "job_id": _id_filter(job_id, "job_id"),
                "state": state,
                "workflow_run_id": _id_filter(workflow_run_id, "workflow_run_id"),
                "after_created": after_created,
                "after_id": after_id,
                "limit": limit + 1,
            },
        ).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [view(r) for r in rows],
        "next_cursor": _cursor(rows[-1]) if more else None,
    }


def get_run(conn, tenant_id: str, run_id: str) -> dict:
    """The run and its attempts, oldest first; NotFound for another tenant's run."""
    try:
        p = partition_of_run(run_id)
    except ValueError as e:
        raise NotFound("run") from e
    args = {"p": p, "run_id": run_id, "tenant_id": tenant_id, "default_days": _default_days()}
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["get_run"], args).fetchone()
        if row is None:
            raise NotFound("run")
        attempts = cur.execute(
            Q["run_attempts"], {**args, "scheduled_at": row["scheduled_at"]}
        ).fetchall()
    out = view(row)
    out["attempts"] = [
        {
            "attempt": a["attempt"],
            "worker_id": a["worker_id"],
            "started_at": _when(a["started_at"]),
            "finished_at": _when(a["finished_at"]),
            "outcome": a["outcome"],
            "error": a["error"],
        }
        for a in attempts
    ]
    return out
