"""A tenant's own run retention (docs/migrations.md, "Worked example: run
retention"): its days, or null for the platform's CRONWHEEL_RUN_RETENTION_DAYS."""

from __future__ import annotations

from psycopg.rows import dict_row

from cronwheel.core.errors import NotFound, ValidationError
from cronwheel.store.sql_loader import queries

Q = queries("retention")
FIELD = "run_retention_days"


def checked_days(body: dict, maximum: int) -> int | None:
    """`run_retention_days` of a request body: an integer from 1 to `maximum`,
    or null for the default; 422 naming the field otherwise (or naming an
    unknown field)."""
    unknown = sorted(set(body) - {FIELD})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    if FIELD not in body:
        raise ValidationError(FIELD, "is required (null: the platform's default)")
    days = body[FIELD]
    if days is None:
        return None
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= maximum:
        raise ValidationError(FIELD, f"must be an integer from 1 to {maximum}, or null")
    return days


def view(row: dict, default_days: int) -> dict:
    own = row["run_retention_days"]
    return {
        "tenant_id": row["tenant_id"],
        FIELD: own,
        "default_days": default_days,
        "effective_days": default_days if own is None else own,
    }


def get(conn, tenant_id: str, default_days: int) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["get_retention"], {"tenant_id": tenant_id}).fetchone()
    if row is None:
        raise NotFound("tenant")
    return view(row, default_days)


def set_days(conn, tenant_id: str, days: int | None, default_days: int) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["set_retention"], {"tenant_id": tenant_id, "days": days}).fetchone()
    if row is None:
        raise NotFound("tenant")
    return view(row, default_days)
