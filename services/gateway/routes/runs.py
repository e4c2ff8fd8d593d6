"""Runs: list and get (cronwheel.store.runs_read), the worker protocol and cancel
(cronwheel.store.lifecycle.Lifecycle).

Worker protocol (CONTRACT): start -> 200 {attempt, start_token,
lease_expires_at, payload} or 409 ALREADY_STARTED / NOT_RUNNABLE /
STALE_ATTEMPT; heartbeat -> 200 {lease_expires_at} or 409 STALE_ATTEMPT;
complete -> 200 {state} or 409 STALE_ATTEMPT. Fields a worker sends beyond
these are ignored, so newer workers keep working against this gateway.

start-batch and complete-batch do the same for up to MAX_BATCH runs in one
request and one transaction (Lifecycle.start_many / complete_many): the
per-request cost (HTTP, auth, BEGIN/COMMIT) was most of a cycle's. Each item is
answered as its single route would answer it alone: {status, body} or {status,
problem}. A malformed item refuses the whole batch (422 naming `runs[i].field`)
before anything changes, so a caller never has to guess which items applied.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from cronwheel.core.errors import ValidationError
from cronwheel.store import runs_read
from cronwheel.store.lifecycle import CompleteCall, StartCall
from services.gateway import openapi as oa
from services.gateway.auth import TenantCaller
from services.gateway.bodies import JsonObject, OptionalObject
from services.gateway.problems import from_exception
from services.gateway.routes import Gw

router = APIRouter(prefix="/v1/runs", tags=["runs"])
MAX_ATTEMPT = 2**31 - 1
MAX_BATCH = 100
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


def _attempt(value: Any, required: bool = True, field: str = "attempt") -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPT:
        raise ValidationError(field, f"must be an integer from 1 to {MAX_ATTEMPT}")
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


# -- batches ------------------------------------------------------------------------


def _items(body: dict) -> list[dict]:
    """`runs`: 1 to MAX_BATCH objects, each with a string `run_id`."""
    runs = body.get("runs")
    if not isinstance(runs, list) or not 1 <= len(runs) <= MAX_BATCH:
        raise ValidationError("runs", f"must be an array of 1 to {MAX_BATCH} objects")
    for i, item in enumerate(runs):
        if not isinstance(item, dict):
            raise ValidationError(f"runs[{i}]", "must be an object")
        if not isinstance(item.get("run_id"), str):
            raise ValidationError(f"runs[{i}].run_id", "must be a string")
    return runs


def _check_completion(i: int, item: dict) -> None:
    """What Lifecycle.complete refuses without reading the database (in its order;
    the result's size it checks itself), refused here before anything changes."""
    token, outcome = item.get("start_token"), item.get("outcome")
    if not isinstance(token, str) or not token:
        raise ValidationError(f"runs[{i}].start_token", "must be the token StartRun returned")
    if outcome not in ("SUCCEEDED", "FAILED"):
        raise ValidationError(f"runs[{i}].outcome", "must be SUCCEEDED or FAILED")
    if not isinstance(item.get("retryable", True), bool):
        raise ValidationError(f"runs[{i}].retryable", "must be true or false")
    if item.get("error") is not None and not isinstance(item["error"], str):
        raise ValidationError(f"runs[{i}].error", "must be a string")


def _answers(results: list) -> dict:
    """One {run_id, status, body | problem} per call, as the single route renders it.
    A ValidationError refuses the whole batch (the transaction rolls back)."""
    out = []
    for i, (run_id, got) in enumerate(results):
        if isinstance(got, ValidationError):
            field = got.field if got.field == "worker_id" else f"runs[{i}].{got.field}"
            raise ValidationError(field, got.message, code=got.code)
        if isinstance(got, Exception):
            status, doc, _headers = from_exception(got)
            out.append({"run_id": run_id, "status": status, "problem": doc})
        else:
            out.append({"run_id": run_id, "status": 200, "body": got})
    return {"results": out}


@router.post(
    "/start-batch",
    openapi_extra=oa.body(oa.START_BATCH),
    responses=oa.ok(oa.batch_results(STARTED), 200, 413),
    summary="StartRun for up to 100 runs in one transaction; one answer per run, in order",
)
def start_batch(gw: Gw, who: TenantCaller, body: JsonObject):
    worker_id = body.get("worker_id")
    if not isinstance(worker_id, str) or not 1 <= len(worker_id) <= 200:
        raise ValidationError("worker_id", "must be a string of 1-200 characters")
    runs = _items(body)
    attempts = [
        _attempt(r.get("attempt"), required=False, field=f"runs[{i}].attempt")
        for i, r in enumerate(runs)
    ]

    def call(tx):
        tenant = tx.tenant["tenant_id"]
        calls = [
            StartCall(tenant, r["run_id"], worker_id, a)
            for r, a in zip(runs, attempts, strict=True)
        ]
        got = gw.lifecycle.start_many(tx.conn, calls, tx.now)
        return _answers([(c.run_id, g) for c, g in zip(calls, got, strict=True)])

    return gw.as_tenant(who, call, pipeline=True)


@router.post(
    "/complete-batch",
    openapi_extra=oa.body(oa.COMPLETE_BATCH),
    responses=oa.ok(oa.batch_results(STATE), 200, 413),
    summary="CompleteRun for up to 100 attempts in one transaction; one answer per run, in order",
)
def complete_batch(gw: Gw, who: TenantCaller, body: JsonObject):
    runs = _items(body)
    attempts = [_attempt(r.get("attempt"), field=f"runs[{i}].attempt") for i, r in enumerate(runs)]
    for i, r in enumerate(runs):
        _check_completion(i, r)

    def call(tx):
        tenant = tx.tenant["tenant_id"]
        calls = [
            CompleteCall(
                tenant,
                r["run_id"],
                a,
                r.get("start_token"),
                r.get("outcome"),
                result=r.get("result"),
                error=r.get("error"),
                retryable=r.get("retryable", True),
            )
            for r, a in zip(runs, attempts, strict=True)
        ]
        got = gw.lifecycle.complete_many(tx.conn, calls, tx.now)
        return _answers([(c.run_id, g) for c, g in zip(calls, got, strict=True)])

    return gw.as_tenant(who, call, pipeline=True)


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
