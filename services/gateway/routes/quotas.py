"""Operator routes for what a tenant may use and how fast: its entitled priority
classes, its token buckets on firing and dispatch rates (docs/priority.md), and
its object quotas (how many live jobs, workflows and keys; docs/tenancy.md),
whose check the creating routes make through `admit`.

Entitlement is checked when a job is written (403 PRIORITY_NOT_ALLOWED), so
taking a class away while live jobs still use it would leave jobs that cannot
be edited: that is refused (409 PRIORITY_IN_USE, with the counts) until they
move to another class or are deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter

from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.runs import PRIORITIES
from cronwheel.store import quotas
from services.gateway import accounts
from services.gateway import openapi as oa
from services.gateway.auth import AnyCaller
from services.gateway.bodies import JsonObject
from services.gateway.routes import Gw, ident, of_tenant
from services.gateway.routes.tenants import TENANT

router = APIRouter(tags=["tenants"])

CLASSES_BODY = {
    "type": "object",
    "required": ["priority_classes"],
    "additionalProperties": False,
    "properties": {
        "priority_classes": {"type": "array", "items": oa.PRIORITY, "minItems": 1},
    },
}
_BUCKET_IN = {
    "anyOf": [
        {
            "type": "object",
            "required": ["rate_per_s"],
            "additionalProperties": False,
            "properties": {
                "rate_per_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6},
                "burst": {"type": "number", "minimum": 1, "maximum": 1e6},
            },
        },
        {"type": "null"},
    ]
}
_LIMIT_IN = {
    "anyOf": [{"type": "integer", "minimum": 0, "maximum": quotas.MAX_OBJECTS}, {"type": "null"}],
    "description": "the tenant's limit; null: the gateway's default",
}
_OBJECTS_IN = {
    "type": "object",
    "additionalProperties": False,
    "properties": {kind: _LIMIT_IN for kind in quotas.OBJECTS},
}
QUOTAS_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"fire": _BUCKET_IN, "dispatch": _BUCKET_IN},
}
_BUCKET = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "rate_per_s": {"type": "number"},
                "burst": {"type": "number"},
                "tokens": {"type": "number"},
                "held_total": {"type": "integer"},
                "held_at": oa.NULLABLE_INSTANT,
                "updated_at": oa.INSTANT,
            },
        },
        {"type": "null"},
    ]
}
_LIMIT = {
    "type": "object",
    "properties": {
        "limit": {"type": "integer"},
        "count": {"type": "integer"},
        "default": {"type": "boolean", "description": "the gateway's default applies"},
    },
}
QUOTAS = {"type": "object", "properties": {"fire": _BUCKET, "dispatch": _BUCKET}}
OBJECT_QUOTAS = {"type": "object", "properties": {kind: _LIMIT for kind in quotas.OBJECTS}}


def admit(tx, who, kind: str, n: int, validate: Callable[[Any], None]) -> Callable[[Any], None]:
    """The object quota of `kind` for creating up to `n` objects in this
    transaction: count under the tenant's lock (quotas.room), and return a check
    to call on each body, in order, before it is written. When all `n` fit the
    check does nothing. Otherwise the bodies that `validate` accepts (a bad one
    raises its own error, as it would below the limit) take the free slots in
    order, and the rest raise 409 QUOTA_EXCEEDED."""
    room = quotas.room(
        tx.conn, tx.tenant["tenant_id"], kind, accounts.object_defaults(who.request.app)
    )
    if room.free >= n:
        return lambda _body: None
    taken = [0]

    def check(body) -> None:
        validate(body)
        if taken[0] >= room.free:
            raise room.exceeded(taken[0])
        taken[0] += 1

    return check


def _classes(body: dict) -> list[str]:
    unknown = sorted(set(body) - {"priority_classes"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    raw = body.get("priority_classes")
    if not isinstance(raw, list) or not raw or not all(isinstance(c, str) for c in raw):
        raise ValidationError("priority_classes", "must be a non-empty list of class names")
    bad = [c for c in raw if c not in PRIORITIES]
    if bad:
        raise ValidationError("priority_classes", f"unknown class {bad[0]!r}")
    return [c for c in PRIORITIES if c in raw]  # canonical order, no duplicates


def set_classes(conn, tenant_id: str, body: dict) -> dict:
    classes = _classes(body)
    accounts.get_tenant(conn, tenant_id)  # 404 first
    outside = quotas.jobs_outside(conn, tenant_id, classes)
    if outside:
        counts = ", ".join(f"{n} {c}" for c, n in outside.items())
        raise Conflict("PRIORITY_IN_USE", f"live jobs use a class being taken away: {counts}")
    if quotas.set_classes(conn, tenant_id, classes) is None:
        raise NotFound("tenant")
    return accounts.get_tenant(conn, tenant_id)


@router.put(
    "/v1/tenants/{tenant_id}/priority-classes",
    openapi_extra=oa.body(CLASSES_BODY),
    responses=oa.ok(TENANT, 200, 403, 404, 409),
    summary="Set the priority classes a tenant may use (operator); critical only when granted",
)
def put_priority_classes(gw: Gw, who: AnyCaller, tenant_id: str, body: JsonObject):
    tid = ident(tenant_id, "tenant")
    return gw.as_operator(who, lambda tx: set_classes(tx.conn, tid, body))


@router.get(
    "/v1/tenants/{tenant_id}/quotas",
    responses=oa.ok(QUOTAS, 200, 403, 404),
    summary="A tenant's fire and dispatch rate quotas and what they held back (operator)",
)
def get_quotas(gw: Gw, who: AnyCaller, tenant_id: str):
    return of_tenant(gw, who, tenant_id, lambda tx, tid: quotas.get_quotas(tx.conn, tid, tx.now))


@router.put(
    "/v1/tenants/{tenant_id}/quotas",
    openapi_extra=oa.body(QUOTAS_BODY),
    responses=oa.ok(QUOTAS, 200, 403, 404),
    summary="Set or remove a tenant's token buckets on firing and dispatch rates (operator)",
)
def put_quotas(gw: Gw, who: AnyCaller, tenant_id: str, body: JsonObject):
    return of_tenant(
        gw, who, tenant_id, lambda tx, tid: quotas.set_quotas(tx.conn, tid, body, tx.now)
    )


@router.get(
    "/v1/tenants/{tenant_id}/quotas/objects",
    responses=oa.ok(OBJECT_QUOTAS, 200, 403, 404),
    summary="How many live jobs, workflows and keys a tenant may hold, and holds (operator)",
)
def get_object_quotas(gw: Gw, who: AnyCaller, tenant_id: str):
    defaults = accounts.object_defaults(who.request.app)
    return of_tenant(
        gw, who, tenant_id, lambda tx, tid: quotas.object_limits(tx.conn, tid, defaults)
    )


@router.put(
    "/v1/tenants/{tenant_id}/quotas/objects",
    openapi_extra=oa.body(_OBJECTS_IN),
    responses=oa.ok(OBJECT_QUOTAS, 200, 403, 404),
    summary="Raise (or lower) a tenant's object quotas; null returns one to the default (operator)",
)
def put_object_quotas(gw: Gw, who: AnyCaller, tenant_id: str, body: JsonObject):
    defaults = accounts.object_defaults(who.request.app)
    return of_tenant(
        gw,
        who,
        tenant_id,
        lambda tx, tid: quotas.set_object_limits(tx.conn, tid, body, defaults, tx.now),
    )
