"""Tenants and API keys as the gateway manages them: create a tenant (operator),
issue more than one key per tenant (rotation), list keys, revoke one.

A key's secret is shown once, when issued; only its SHA-256 is stored. Tenant
creation itself is cronwheel.store.jobs.create_tenant; this module adds what
only the admin API needs. Its SQL is cronwheel/store/sql/accounts.sql.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.errors import NotFound, ValidationError
from cronwheel.store import quotas
from cronwheel.store.jobs import create_tenant, hash_key, new_api_key
from cronwheel.store.quotas import ObjectLimits
from cronwheel.store.sql_loader import queries

CELL = re.compile(r"^[a-z0-9-]{1,50}$")
MAX_TENANT_PAGE = 200
MAX_KEY_PAGE = 200
KEY_CURSOR = re.compile(r"^(\d{1,18})\.([A-Za-z0-9_-]{1,100})$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def object_defaults(app) -> ObjectLimits:
    """The gateway's default object quotas (main.py sets them from its settings
    on `app.state.object_limits`; else the built-in defaults)."""
    limits = getattr(app.state, "object_limits", None)
    return limits if isinstance(limits, ObjectLimits) else ObjectLimits()


def _q() -> dict[str, str]:
    return queries("accounts")


def _tenant_view(row: dict) -> dict:
    return {
        "tenant_id": row["tenant_id"],
        "name": row["name"],
        "cell": row["cell"],
        "priority_classes": list(row["priority_classes"]),
        "created_at": iso(to_ms(row["created_at"])),
    }


def _key_view(row: dict) -> dict:
    return {
        "key_id": row["key_id"],
        "label": row["label"],
        "created_at": iso(to_ms(row["created_at"])),
        "revoked_at": iso(to_ms(row["revoked_at"])) if row["revoked_at"] else None,
    }


def _label(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not 1 <= len(value) <= 100):
        raise ValidationError("label", "must be a string of 1-100 characters")
    return value


def new_tenant(conn, body: dict, default_cell: str) -> dict:
    """POST /v1/tenants: {name, cell?, priority_classes?} -> the tenant and its first key."""
    unknown = sorted(set(body) - {"name", "cell", "priority_classes"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    cell = body.get("cell", default_cell)
    if not isinstance(cell, str) or not CELL.match(cell):
        raise ValidationError("cell", "must be 1-50 of a-z 0-9 -")
    classes = body.get("priority_classes")
    if classes is not None and (
        not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)
    ):
        raise ValidationError("priority_classes", "must be a list of class names")
    tenant = create_tenant(conn, body.get("name"), cell=cell, priority_classes=classes)
    return {
        "tenant_id": tenant["tenant_id"],
        "name": tenant["name"],
        "cell": tenant["cell"],
        "priority_classes": list(tenant["priority_classes"]),
        "api_key": tenant["api_key"],
    }


def list_tenants(conn, cursor: str | None, limit: int) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_q()["list_tenants"], {"after": cursor, "limit": limit + 1}).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [_tenant_view(r) for r in rows],
        "next_cursor": rows[-1]["tenant_id"] if more else None,
    }


def get_tenant(conn, tenant_id: str) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_q()["get_tenant"], {"tenant_id": tenant_id}).fetchone()
    if row is None:
        raise NotFound("tenant")
    return _tenant_view(row)


def issue_key(
    conn, tenant_id: str, body: dict, now: int, limits: ObjectLimits | None = None
) -> dict:
    """A new key beside the existing ones; its secret is in this answer only.
    Within the tenant's keys quota (unrevoked keys; 409 QUOTA_EXCEEDED)."""
    unknown = sorted(set(body) - {"label"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    label = _label(body.get("label"))
    get_tenant(conn, tenant_id)
    quotas.reserve(conn, tenant_id, "keys", 1, limits or ObjectLimits())
    key_id, secret = new_api_key(tenant_id)
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            _q()["insert_key"],
            {
                "key_id": key_id,
                "tenant_id": tenant_id,
                "hash": hash_key(secret),
                "label": label,
                "now": to_dt(now),
            },
        ).fetchone()
    return {**_key_view(row), "api_key": secret}


def key_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    """A keys page's cursor, `<microseconds>.<key_id>`; 422 `cursor` if it is
    not one this API returned."""
    if cursor is None:
        return None
    m = KEY_CURSOR.match(cursor)
    try:
        if m is None:
            raise ValueError(cursor)
        return _EPOCH + int(m.group(1)) * _US, m.group(2)
    except (ValueError, OverflowError) as e:
        raise ValidationError("cursor", "is not a cursor this API returned") from e


def list_keys(conn, tenant_id: str, cursor: str | None = None, limit: int = 50) -> dict:
    """`{items, next_cursor}`, oldest first on (created_at, key_id), as jobs page."""
    after = key_cursor(cursor)
    get_tenant(conn, tenant_id)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            _q()["list_keys"],
            {
                "tenant_id": tenant_id,
                "after_created": after[0] if after else None,
                "after_id": after[1] if after else None,
                "limit": limit + 1,
            },
        ).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = None
    if more:
        last = rows[-1]
        nxt = f"{(last['created_at'] - _EPOCH) // _US}.{last['key_id']}"
    return {"items": [_key_view(r) for r in rows], "next_cursor": nxt}


def revoke_key(conn, tenant_id: str, key_id: str, now: int) -> dict:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            _q()["revoke_key"], {"tenant_id": tenant_id, "key_id": key_id, "now": to_dt(now)}
        ).fetchone()
    if row is None:
        raise NotFound("key")
    return _key_view(row)
