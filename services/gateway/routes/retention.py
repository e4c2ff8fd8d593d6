"""A tenant's run retention (operator; issue 25): how many days its runs are
kept after their scheduled instant, or null for the platform's
CRONWHEEL_RUN_RETENTION_DAYS. `cronwheel retention` drops run history by
whole days once the longest retention has passed; a tenant's run reads stop
at its own (docs/migrations.md, "Worked example: run retention")."""

from __future__ import annotations

import functools

from fastapi import APIRouter

from cronwheel import config
from cronwheel.store import retention
from services.gateway import openapi as oa
from services.gateway.auth import AnyCaller
from services.gateway.bodies import JsonObject
from services.gateway.routes import Gw, of_tenant

router = APIRouter(tags=["tenants"])

RETENTION_BODY = {
    "type": "object",
    "required": [retention.FIELD],
    "additionalProperties": False,
    "properties": {
        retention.FIELD: {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": config.MAX_RUN_RETENTION_DAYS},
                {"type": "null"},
            ],
            "description": "days; null: the platform's default",
        }
    },
}
RETENTION = {
    "type": "object",
    "properties": {
        "tenant_id": {"type": "string"},
        retention.FIELD: {"type": ["integer", "null"]},
        "default_days": {"type": "integer", "description": "CRONWHEEL_RUN_RETENTION_DAYS"},
        "effective_days": {"type": "integer"},
    },
}


@functools.cache
def _default_days() -> int:
    return config.load(config.RunRetention).days


@router.get(
    "/v1/tenants/{tenant_id}/retention",
    responses=oa.ok(RETENTION, 200, 403, 404),
    summary="How many days a tenant's runs are kept (operator)",
)
def get_retention(gw: Gw, who: AnyCaller, tenant_id: str):
    return of_tenant(
        gw, who, tenant_id, lambda tx, tid: retention.get(tx.conn, tid, _default_days())
    )


@router.put(
    "/v1/tenants/{tenant_id}/retention",
    openapi_extra=oa.body(RETENTION_BODY),
    responses=oa.ok(RETENTION, 200, 403, 404),
    summary="Set a tenant's run retention in days; null returns it to the default (operator)",
)
def put_retention(gw: Gw, who: AnyCaller, tenant_id: str, body: JsonObject):
    def put(tx, tid: str):
        days = retention.checked_days(body, config.MAX_RUN_RETENTION_DAYS)  # 422 naming the field
        return retention.set_days(tx.conn, tid, days, _default_days())

    return of_tenant(gw, who, tenant_id, put)
