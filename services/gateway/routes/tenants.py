"""Tenants and their keys, for the operator key; a tenant's own keys, for it.

Keys: more than one per tenant (rotate: issue a new key, move clients, revoke
the old one); the secret is shown once, when issued.

Placement (docs/cells.md): a tenant is created in the cell its `cell` names
(omitted: the default cell), by that cell's gateway, which records it in the
directory in the same request; another cell's gateway answers 421 naming it.
"""

from __future__ import annotations

from typing import Annotated

from confluent_kafka import KafkaException
from fastapi import APIRouter, Query

from cronwheel import kafka
from cronwheel.core.errors import ValidationError
from services.gateway import accounts, kafka_credentials
from services.gateway import openapi as oa
from services.gateway.auth import AnyCaller, TenantCaller
from services.gateway.bodies import JsonObject, OptionalObject
from services.gateway.cells import homing_of
from services.gateway.problems import Problem
from services.gateway.routes import _ID, Gw, ident

router = APIRouter(tags=["tenants"])

KEY = {
    "type": "object",
    "properties": {
        "key_id": {"type": "string"},
        "label": {"type": ["string", "null"]},
        "created_at": oa.INSTANT,
        "revoked_at": oa.NULLABLE_INSTANT,
        "api_key": {"type": "string", "description": "the secret; in this answer only"},
    },
}
TENANT = {
    "type": "object",
    "properties": {
        "tenant_id": {"type": "string"},
        "name": {"type": "string"},
        "cell": {"type": "string"},
        "state": {
            "type": "string",
            "enum": ["active", "moving", "frozen"],
            "description": "as the directory of cells has it; `active` with one cell",
        },
        "priority_classes": {"type": "array", "items": oa.PRIORITY},
        "api_key": {"type": "string", "description": "at creation only"},
        "kafka": kafka_credentials.KAFKA,
    },
}
OWN_TENANT = {
    "type": "object",
    "properties": {
        "tenant_id": {"type": "string"},
        "cell": {"type": "string"},
        "kafka_bootstrap": {
            "type": "string",
            "description": "the broker of the tenant's cell: its workers consume there",
        },
    },
}


@router.post(
    "/v1/tenants",
    status_code=201,
    openapi_extra=oa.body(oa.TENANT_CREATE),
    responses=oa.ok(TENANT, 201, 403, 409, 421, 503),
    summary="Create a tenant and its first API key in a cell (operator)",
)
def create_tenant(gw: Gw, who: AnyCaller, body: JsonObject):
    homing = homing_of(who.request.app)
    # A tenant key gets its 403 from as_operator, not a word about the cells.
    cell = _cell_asked(homing, body) if who.operator else homing.cell

    made: list[str] = []  # its run topic: made before the answer (topics_ready.py)

    def create(tx):
        tenant = accounts.new_tenant(tx.conn, {**body, "cell": cell}, gw.cell)
        # Made before the transaction commits: no tenant without its principal.
        tenant["kafka"] = kafka_credentials.provision(gw, tenant["tenant_id"], tx.conn)
        # Last: a directory that does not answer rolls the tenant back (503).
        homing.place(tenant["tenant_id"], cell)
        made.append(tenant["tenant_id"])
        return tenant

    return gw.answer_with_topics(gw.as_operator(who, create, 201), tenants=made)


def _cell_asked(homing, body: dict) -> str:
    """The cell a new tenant is for: `cell`, else the default cell. 422 naming
    `cell` for one that is not a cell; 421 for another cell (its gateway
    creates it, in its own database and broker)."""
    cell = body.get("cell")
    if cell is None:
        cell = homing.default_cell()
    elif not isinstance(cell, str) or not accounts.CELL.match(cell):
        raise ValidationError("cell", "must be 1-50 of a-z 0-9 -")
    known = homing.known_cells()
    if cell not in known:
        raise ValidationError("cell", f"unknown cell {cell!r}; the cells: {', '.join(known)}")
    if cell != homing.cell:
        raise homing.misdirected(cell, "a tenant for cell")
    return cell


@router.post(
    "/v1/tenants/{tenant_id}/kafka-credentials",
    responses=oa.ok(
        {"type": "object", "properties": {"kafka": kafka_credentials.KAFKA}},
        200,
        403,
        404,
        409,
        503,
    ),  # fmt: skip
    summary="A new Kafka password for a tenant, shown once; the old one stops working (operator)",
)
def rotate_kafka_credentials(gw: Gw, who: AnyCaller, tenant_id: str):
    tid = ident(tenant_id, "tenant")

    def rotate(tx):
        accounts.get_tenant(tx.conn, tid)  # 404 for an unknown tenant
        return {"tenant_id": tid, "kafka": kafka_credentials.rotate(gw, tid, tx.conn)}

    return gw.as_operator(who, rotate)


@router.get(
    "/v1/tenants",
    responses=oa.ok(oa.page(TENANT), 200, 403),
    summary="List tenants (operator)",
)
def list_tenants(
    gw: Gw,
    who: AnyCaller,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=accounts.MAX_TENANT_PAGE)] = 50,
):
    if cursor is not None and not _ID.match(cursor):
        raise ValidationError("cursor", "is not a cursor this API returned")
    return gw.as_operator(who, lambda tx: accounts.list_tenants(tx.conn, cursor, limit))


@router.get(
    "/v1/tenants/{tenant_id}",
    responses=oa.ok(TENANT, 200, 403, 404),
    summary="One tenant (operator)",
)
def get_tenant(gw: Gw, who: AnyCaller, tenant_id: str):
    tid = ident(tenant_id, "tenant")
    state = homing_of(who.request.app).state_of(tid)
    return gw.as_operator(who, lambda tx: {**accounts.get_tenant(tx.conn, tid), "state": state})


@router.get(
    "/v1/tenant",
    responses=oa.ok(OWN_TENANT, 200, 403),
    summary="The caller's tenant: its cell, and the broker its workers consume from",
)
def get_own_tenant(gw: Gw, who: TenantCaller):
    def own(tx):
        return {
            "tenant_id": tx.tenant["tenant_id"],
            "cell": gw.cell,
            "kafka_bootstrap": gw.bootstrap,
        }

    return gw.as_tenant(who, own)


MAX_QUEUE_PARTITIONS = 64
QUEUE_PARTITIONS = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "partitions": {"type": "integer"}},
}
QUEUE_PARTITIONS_BODY = {
    "type": "object",
    "required": ["partitions"],
    "additionalProperties": False,
    "properties": {
        "partitions": {"type": "integer", "minimum": 1, "maximum": MAX_QUEUE_PARTITIONS}
    },
}


@router.post(
    "/v1/tenants/{tenant_id}/queues/{queue}/partitions",
    openapi_extra=oa.body(QUEUE_PARTITIONS_BODY),
    responses=oa.ok(QUEUE_PARTITIONS, 200, 403, 404, 503),
    summary="Give a tenant's queue topic at least N partitions, online (operator)",
)
def grow_queue(gw: Gw, who: AnyCaller, tenant_id: str, queue: str, body: JsonObject):
    """A queue topic starts with one partition (an idle tenant costs little);
    a tenant running more worker processes on a queue needs as many partitions.
    Kafka adds partitions online and never removes any: asking for fewer than
    the topic has changes nothing, so a retry is harmless."""
    tid = ident(tenant_id, "tenant")
    unknown = sorted(set(body) - {"partitions"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    n = body.get("partitions")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_QUEUE_PARTITIONS:
        raise ValidationError("partitions", f"must be an integer from 1 to {MAX_QUEUE_PARTITIONS}")
    try:
        topic = gw.topics.queue(tid, queue)
    except ValueError:
        raise ValidationError("queue", "must be 1-100 letters, digits, '_' or '-'") from None

    def grow(tx):
        accounts.get_tenant(tx.conn, tid)  # 404 for an unknown tenant
        try:
            have = kafka.grow_topic(topic, n, gw.kafka_admin())
        except (KafkaException, RuntimeError) as e:
            raise Problem(503, "UNAVAILABLE", f"the broker did not answer: {e}",
                          headers={"Retry-After": "1"}) from e  # fmt: skip
        return {"topic": topic, "partitions": have}

    return gw.as_operator(who, grow)


@router.post(
    "/v1/tenants/{tenant_id}/keys",
    status_code=201,
    openapi_extra=oa.body(oa.KEY_CREATE, required=False),
    responses=oa.ok(KEY, 201, 403, 404, 409),
    summary="Issue another key for a tenant (operator)",
)
def issue_tenant_key(gw: Gw, who: AnyCaller, tenant_id: str, body: OptionalObject):
    tid = ident(tenant_id, "tenant")
    limits = accounts.object_defaults(who.request.app)
    return gw.as_operator(
        who, lambda tx: accounts.issue_key(tx.conn, tid, body, tx.now, limits), 201
    )


KeyLimit = Annotated[int, Query(ge=1, le=accounts.MAX_KEY_PAGE)]


@router.get(
    "/v1/tenants/{tenant_id}/keys",
    responses=oa.ok(oa.page(KEY), 200, 403, 404),
    summary="A tenant's keys, without secrets, oldest first (operator)",
)
def list_tenant_keys(
    gw: Gw, who: AnyCaller, tenant_id: str, cursor: str | None = None, limit: KeyLimit = 50
):
    tid = ident(tenant_id, "tenant")
    accounts.key_cursor(cursor)  # 422 before the transaction
    return gw.as_operator(who, lambda tx: accounts.list_keys(tx.conn, tid, cursor, limit))


@router.delete(
    "/v1/tenants/{tenant_id}/keys/{key_id}",
    status_code=204,
    responses=oa.errors(403, 404),
    summary="Revoke one of a tenant's keys (operator)",
)
def revoke_tenant_key(gw: Gw, who: AnyCaller, tenant_id: str, key_id: str):
    tid, kid = ident(tenant_id, "tenant"), ident(key_id, "key")
    return gw.as_operator(
        who, lambda tx: _revoked(accounts.revoke_key(tx.conn, tid, kid, tx.now)), 204
    )


@router.post(
    "/v1/keys",
    status_code=201,
    openapi_extra=oa.body(oa.KEY_CREATE, required=False),
    responses=oa.ok(KEY, 201, 403, 409),
    summary="Issue another key for the caller's tenant (rotation)",
)
def issue_key(gw: Gw, who: TenantCaller, body: OptionalObject):
    limits = accounts.object_defaults(who.request.app)
    return gw.as_tenant(
        who,
        lambda tx: accounts.issue_key(tx.conn, tx.tenant["tenant_id"], body, tx.now, limits),
        201,
    )


@router.get(
    "/v1/keys",
    responses=oa.ok(oa.page(KEY), 200, 403),
    summary="The caller's tenant's keys, without secrets, oldest first",
)
def list_keys(gw: Gw, who: TenantCaller, cursor: str | None = None, limit: KeyLimit = 50):
    accounts.key_cursor(cursor)  # 422 before the transaction
    return gw.as_tenant(
        who, lambda tx: accounts.list_keys(tx.conn, tx.tenant["tenant_id"], cursor, limit)
    )


@router.delete(
    "/v1/keys/{key_id}",
    status_code=204,
    responses=oa.errors(403, 404),
    summary="Revoke one of the caller's tenant's keys (also the one in use)",
)
def revoke_key(gw: Gw, who: TenantCaller, key_id: str):
    kid = ident(key_id, "key")
    return gw.as_tenant(
        who,
        lambda tx: _revoked(accounts.revoke_key(tx.conn, tx.tenant["tenant_id"], kid, tx.now)),
        204,
    )


def _revoked(_key: dict) -> None:
    return None
