"""Workflows: create, list, get, delete, pause, resume, trigger; workflow runs:
list, get (every node's state and run id), cancel. Each handler is one call into
cronwheel.store.workflows.Workflows; the graph is validated by the core."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query

from cronwheel.core.errors import ValidationError
from cronwheel.core.workflows import parse_workflow
from services.gateway import openapi as oa
from services.gateway.auth import TenantCaller
from services.gateway.bodies import JsonObject, OptionalObject
from services.gateway.routes import Gw, ident
from services.gateway.routes.jobs import check_destination, looked_up
from services.gateway.routes.quotas import admit
from services.gateway.transactions import Reply

router = APIRouter(tags=["workflows"])
MAX_PAGE = 200
_CURSOR = re.compile(r"^[A-Za-z0-9_.-]{1,140}$")

NODE = {
    "type": "object",
    "required": ["name", "target"],
    "properties": {
        "name": {"type": "string"},
        "target": {"type": "object"},
        "payload": {"description": "any JSON"},
        "retry": oa.RETRY,
        "timeout_ms": {"type": ["integer", "null"]},
        "lease_ms": {"type": "integer"},
        "priority": oa.PRIORITY,
        "depends_on": {"type": "array", "items": {"type": "string"}},
    },
}
WORKFLOW_CREATE = {
    "type": "object",
    "required": ["name", "nodes"],
    "properties": {
        "name": {"type": "string"},
        "schedule": {"type": "object"},
        "nodes": {"type": "array", "minItems": 1, "maxItems": 500, "items": NODE},
    },
}
WORKFLOW = {
    "type": "object",
    "properties": {"workflow_id": {"type": "string"}, **WORKFLOW_CREATE["properties"]},
}
WORKFLOW_RUN = {
    "type": "object",
    "properties": {
        "workflow_run_id": {"type": "string"},
        "state": {"type": "string"},
        "nodes": {"type": "array", "items": {"type": "object"}},
    },
}
TRIGGERED = {"type": "object", "properties": {"workflow_run_id": {"type": "string"}}}


def _cursor(cursor: str | None) -> str | None:
    if cursor is not None and not _CURSOR.match(cursor):
        raise ValidationError("cursor", "is not a cursor this API returned")
    return cursor


def _nodes(body: dict) -> list:
    nodes = body.get("nodes")
    return nodes if isinstance(nodes, list) else []


@router.post(
    "/v1/workflows",
    status_code=201,
    openapi_extra=oa.body(WORKFLOW_CREATE),
    responses=oa.ok(WORKFLOW, 201, 403, 409, 413),
    summary="Create a workflow (a static DAG of node templates)",
)
def create_workflow(gw: Gw, who: TenantCaller, body: JsonObject):
    verdicts = looked_up(gw, _nodes(body))  # before the transaction (destinations.py)
    verdicts.raise_timeout()

    def create(tx):
        for node in _nodes(body):
            check_destination(verdicts, node)
        classes = tuple(tx.tenant["priority_classes"])
        admit(  # 409 QUOTA_EXCEEDED; at the limit a bad body still gets its own 4xx
            tx, who, "workflows", 1,
            lambda b: parse_workflow(b, now_ms=tx.now, allowed_priorities=classes),
        )(body)  # fmt: skip
        return gw.workflows.create(tx.conn, tx.tenant, body, tx.now)

    return gw.as_tenant(who, create, 201)


@router.get("/v1/workflows", responses=oa.ok(oa.page(WORKFLOW)), summary="The tenant's workflows")
def list_workflows(
    gw: Gw,
    who: TenantCaller,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
):
    c = _cursor(cursor)
    return gw.as_tenant(
        who, lambda tx: gw.workflows.list(tx.conn, tx.tenant, cursor=c, limit=limit)
    )


@router.get(
    "/v1/workflows/{workflow_id}", responses=oa.ok(WORKFLOW, 200, 404), summary="One workflow"
)
def get_workflow(gw: Gw, who: TenantCaller, workflow_id: str):
    wid = ident(workflow_id, "workflow")
    return gw.as_tenant(who, lambda tx: gw.workflows.get(tx.conn, tx.tenant, wid))


@router.delete(
    "/v1/workflows/{workflow_id}",
    status_code=204,
    responses=oa.errors(404),
    summary="Delete a workflow; its running workflow runs are cancelled",
)
def delete_workflow(gw: Gw, who: TenantCaller, workflow_id: str):
    wid = ident(workflow_id, "workflow")
    return gw.as_tenant(who, lambda tx: gw.workflows.delete(tx.conn, tx.tenant, wid, tx.now), 204)


@router.post(
    "/v1/workflows/{workflow_id}/pause",
    responses=oa.ok(WORKFLOW, 200, 404),
    summary="Pause a workflow's schedule",
)
def pause_workflow(gw: Gw, who: TenantCaller, workflow_id: str, _body: OptionalObject):
    wid = ident(workflow_id, "workflow")
    return gw.as_tenant(who, lambda tx: gw.workflows.pause(tx.conn, tx.tenant, wid, tx.now))


@router.post(
    "/v1/workflows/{workflow_id}/resume",
    responses=oa.ok(WORKFLOW, 200, 404),
    summary="Resume a workflow's schedule",
)
def resume_workflow(gw: Gw, who: TenantCaller, workflow_id: str, _body: OptionalObject):
    wid = ident(workflow_id, "workflow")
    return gw.as_tenant(who, lambda tx: gw.workflows.resume(tx.conn, tx.tenant, wid, tx.now))


@router.post(
    "/v1/workflows/{workflow_id}/trigger",
    status_code=201,
    responses=oa.ok(TRIGGERED, 201, 404),
    summary="Start a workflow run now",
)
def trigger_workflow(gw: Gw, who: TenantCaller, workflow_id: str, _body: OptionalObject):
    wid = ident(workflow_id, "workflow")

    def trigger(tx):
        out = gw.workflows.trigger(tx.conn, tx.tenant, wid, tx.now)
        return Reply(201 if out.get("created", True) else 200, out)

    return gw.as_tenant(who, trigger)


@router.get(
    "/v1/workflows/{workflow_id}/runs",
    responses=oa.ok(oa.page(WORKFLOW_RUN), 200, 404),
    summary="A workflow's runs, newest first",
)
def list_workflow_runs(
    gw: Gw,
    who: TenantCaller,
    workflow_id: str,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
):
    wid, c = ident(workflow_id, "workflow"), _cursor(cursor)
    return gw.as_tenant(
        who, lambda tx: gw.workflows.list_runs(tx.conn, tx.tenant, wid, cursor=c, limit=limit)
    )


@router.get(
    "/v1/workflow-runs/{workflow_run_id}",
    responses=oa.ok(WORKFLOW_RUN, 200, 404),
    summary="A workflow run: its state and every node's state and run_id",
)
def get_workflow_run(gw: Gw, who: TenantCaller, workflow_run_id: str):
    rid = ident(workflow_run_id, "workflow run")
    return gw.as_tenant(who, lambda tx: gw.workflows.get_run(tx.conn, tx.tenant, rid))


@router.post(
    "/v1/workflow-runs/{workflow_run_id}/cancel",
    responses=oa.ok(WORKFLOW_RUN, 200, 404, 409),
    summary="Cancel a workflow run: pending and running nodes are cancelled",
)
def cancel_workflow_run(gw: Gw, who: TenantCaller, workflow_run_id: str, _body: OptionalObject):
    rid = ident(workflow_run_id, "workflow run")
    return gw.as_tenant(who, lambda tx: gw.workflows.cancel_run(tx.conn, tx.tenant, rid, tx.now))
