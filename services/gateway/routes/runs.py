"""Runs: list and get (cronwheel.store.runs_read), the worker protocol and cancel
(cronwheel.store.lifecycle.Lifecycle).

Worker protocol (CONTRACT): start -> 200 {attempt, start_token,
lease_expires_at, payload} or 409 ALREADY_STARTED / NOT_RUNNABLE /
STALE_ATTEMPT; heartbeat -> 200 {lease_expires_at} or 409 STALE_ATTEMPT;
complete -> 200 {state} or 409 STALE_ATTEMPT. Fields a worker sends beyond
these are ignored, so newer workers keep working against this gateway.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from cronwheel.core.errors import ValidationError
from cronwheel.store import runs_read
from services.gateway import openapi as oa
from services.gateway.auth import TenantCaller
from services.gateway.bodies import JsonObject, OptionalObject
from services.gateway.routes import Gw

router = APIRouter(prefix="/v1/runs", tags=["runs"])
MAX_ATTEMPT = 2**31 - 1
STARTED = {
    "type": "object",
    "required": ["attempt", "start_token", "lease_expires_at", "payload"],
    "properties": {
        "attempt": {"type": "integer"},
        "start_token": {"type": "string"},
        "lease_expires_at": oa.INSTANT,
        "lease_ms": {"type": "integer"},
        "payload": {},
    },
}
LEASE = {"type": "object", "properties": {"lease_expires_at": oa.INSTANT}}
STATE = {"type": "object", "properties": {"state": oa.RUN_STATE}}


def _attempt(value: Any, required: bool = True) -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPT:
        raise ValidationError("attempt", f"must be an integer from 1 to {MAX_ATTEMPT}")
    return value


@router.get(
    "",
    responses=oa.ok(oa.page(oa.RUN)),
    summary="The tenant's runs, newest first, filtered by job, state or workflow run",
)
def list_runs(
    gw: Gw,
    who: TenantCaller,
    job_id: str | None = None,
    state: Annotated[str | None, Query(json_schema_extra={"enum": oa.RUN_STATE["enum"]})] = None,
    workflow_run_id: str | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=runs_read.MAX_LIMIT)] = 50,
):
    return gw.as_tenant(
        who,
        lambda tx: runs_read.list_runs(
            tx.conn,
            tx.tenant["tenant_id"],
            job_id=job_id,
            state=state,
            workflow_run_id=workflow_run_id,
            cursor=cursor,
            limit=limit,
        ),
    )


@router.get("/{run_id}", responses=oa.ok(oa.RUN, 200, 404), summary="One run and its attempts")
def get_run(gw: Gw, who: TenantCaller, run_id: str):
    return gw.as_tenant(who, lambda tx: runs_read.get_run(tx.conn, tx.tenant["tenant_id"], run_id))


@router.post(
    "/{run_id}/start",
    openapi_extra=oa.body(oa.START),
    responses=oa.ok(STARTED, 200, 404, 409),
    summary="StartRun: one worker wins the attempt, its start token and a lease",
)
def start_run(gw: Gw, who: TenantCaller, run_id: str, body: JsonObject):
    attempt = _attempt(body.get("attempt"), required=False)
    return gw.as_tenant(
        who,
        lambda tx: gw.lifecycle.start(
            tx.conn, tx.tenant["tenant_id"], run_id, body.get("worker_id"), tx.now, attempt
        ),
        pipeline=True,
    )


@router.post(
    "/{run_id}/heartbeat",
    openapi_extra=oa.body(oa.HEARTBEAT),
    responses=oa.ok(LEASE, 200, 404, 409),
    summary="Heartbeat: extend the lease of the attempt the token names",
)
def heartbeat(gw: Gw, who: TenantCaller, run_id: str, body: JsonObject):
    attempt = _attempt(body.get("attempt"))
    return gw.as_tenant(
        who,
        lambda tx: gw.lifecycle.heartbeat(
            tx.conn, tx.tenant["tenant_id"], run_id, attempt, body.get("start_token"), tx.now
        ),
        pipeline=True,
    )


@router.post(
    "/{run_id}/complete",
    openapi_extra=oa.body(oa.COMPLETE),
    responses=oa.ok(STATE, 200, 404, 409, 413),
    summary="CompleteRun: the attempt's outcome; a duplicate is STALE_ATTEMPT",
)
def complete_run(gw: Gw, who: TenantCaller, run_id: str, body: JsonObject):
    attempt = _attempt(body.get("attempt"))
    return gw.as_tenant(
        who,
        lambda tx: gw.lifecycle.complete(
            tx.conn,
            tx.tenant["tenant_id"],
            run_id,
            attempt,
            body.get("start_token"),
            body.get("outcome"),
            tx.now,
            result=body.get("result"),
            error=body.get("error"),
            retryable=body.get("retryable", True),
        ),
        pipeline=True,
    )


@router.post(
    "/{run_id}/cancel",
    openapi_extra=oa.body(oa.CANCEL, required=False),
    responses=oa.ok(STATE, 200, 404, 409),
    summary="Cancel a pending, running or retrying run",
)
def cancel_run(gw: Gw, who: TenantCaller, run_id: str, body: OptionalObject):
    reason = body.get("reason", "cancelled")
    if not isinstance(reason, str) or not 1 <= len(reason) <= 1000:
        raise ValidationError("reason", "must be a string of 1-1000 characters")
    return gw.as_tenant(
        who, lambda tx: gw.lifecycle.cancel(tx.conn, tx.tenant["tenant_id"], run_id, tx.now, reason)
    )
