"""Jobs: create, list, get, change, delete, pause, resume, trigger, backfill.

Each handler is one call into cronwheel.store.jobs.Jobs. The gateway adds the
webhook destination check (cronwheel.core.ssrf) before a webhook target is
stored, since it needs the network and the operator's allow list: the lookup
runs before the request's transaction, with a timeout (destinations.py), and
its verdict is applied inside it.

A managed target's `env` is write-only: every answer shows its names with the
values masked (`shown`); the executor reads the values from the database. A
PATCH that sends a masked value back keeps the value the job holds.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from cronwheel.core.clock import to_ms
from cronwheel.core.errors import ValidationError
from cronwheel.core.jobs import ENV_MASK, parse_job, shown_target
from services.gateway import bodies, problems
from services.gateway import openapi as oa
from services.gateway.auth import TenantCaller
from services.gateway.bodies import BatchObject, JsonObject, OptionalObject
from services.gateway.destinations import LookupTimedOut, Verdicts, webhook_url
from services.gateway.routes import Gw, ident
from services.gateway.routes.quotas import admit
from services.gateway.transactions import Gateway, Reply

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
MAX_PAGE = 200
_CURSOR = re.compile(r"^\d{1,15}\.[A-Za-z0-9_-]{1,100}$")
_MIN_INSTANT = 0  # 1970-01-01: backfills start no earlier
TRIGGERED = {
    "type": "object",
    "properties": {"run_id": {"type": "string"}, "created": {"type": "boolean"}},
}
ROTATED = {
    "type": "object",
    "properties": {
        "secret_id": {"type": "string"},
        "secret": {"type": "string"},
        "created_at": {"type": "string"},
        "previous": {"type": "array", "items": {"type": "object"}},
    },
}
BACKFILLED = {
    "type": "object",
    "properties": {
        "instants": {"type": "integer"},
        "created": {"type": "integer"},
        "already_existed": {"type": "integer"},
    },
}


def shown(job: dict) -> dict:
    """The job as answers show it: a managed target's env values masked."""
    if "target" not in job:
        return job
    return {**job, "target": shown_target(job["target"])}


def _unmask_env(gw: Gateway, tx, job_id: str, body: dict) -> dict:
    """A PATCH whose target.env sends ENV_MASK back for a name keeps that name's
    stored value (a client may PATCH back a target it read); a masked value for
    a name the job does not hold is refused."""
    target = body.get("target")
    env = target.get("env") if isinstance(target, dict) else None
    if not isinstance(env, dict) or ENV_MASK not in env.values():
        return body
    held = gw.jobs.get(tx.conn, tx.tenant["tenant_id"], job_id, tx.now)["target"]
    held_env = held.get("env") or {} if held.get("type") == "managed" else {}
    for name, value in env.items():
        if value == ENV_MASK and name not in held_env:
            raise ValidationError(
                f"target.env.{name}", "is masked, but the job holds no value for it"
            )
    unmasked = {k: held_env[k] if v == ENV_MASK else v for k, v in env.items()}
    return {**body, "target": {**target, "env": unmasked}}


def _target_url(body: object) -> object | None:
    return webhook_url(body.get("target")) if isinstance(body, dict) else None


def looked_up(gw: Gateway, bodies_: list) -> Verdicts:
    """The webhook destinations of `bodies_` (each a job or a workflow node),
    looked up now, before any transaction (destinations.py)."""
    return gw.destinations.verdicts(_target_url(body) for body in bodies_)


def check_destination(verdicts: Verdicts, body: object) -> None:
    """Inside the transaction: refuse the body's webhook URL as its lookup found."""
    verdicts.check(_target_url(body))


@router.post(
    "",
    status_code=201,
    openapi_extra=oa.body(oa.JOB_CREATE),
    responses=oa.ok(oa.JOB, 201, 403, 409, 413),
    summary="Create a job",
)
def create_job(gw: Gw, who: TenantCaller, body: JsonObject):
    verdicts = looked_up(gw, [body])
    verdicts.raise_timeout()  # 503, before the transaction, never recorded

    made: list[dict] = []

    def create(tx):
        check_destination(verdicts, body)
        admit(tx, who, "jobs", 1, _parses(tx))(body)  # 409 QUOTA_EXCEEDED
        made.append(shown(gw.jobs.create(tx.conn, tx.tenant, body, tx.now)))
        return made[-1]

    return gw.answer_with_topics(gw.as_tenant(who, create, 201), jobs=made)


@router.post(
    "/batch",
    openapi_extra=oa.body(oa.JOB_BATCH),
    responses=oa.ok(oa.JOB_BATCH_RESULTS, 200, 403, 409, 413),
    summary="Create 1 to 1,000 jobs; each answered as its own POST /v1/jobs would be",
)
def create_jobs(gw: Gw, who: TenantCaller, body: BatchObject):
    unknown = sorted(set(body) - {"jobs"})
    if unknown:
        raise ValidationError(unknown[0], "is not a field of a job batch")
    items = body.get("jobs")
    if not isinstance(items, list) or not 1 <= len(items) <= oa.MAX_JOB_BATCH:
        raise ValidationError("jobs", f"must be a list of 1 to {oa.MAX_JOB_BATCH} jobs")

    verdicts = looked_up(gw, items)  # a lookup that timed out: a 503 in its job's slot
    made: list[dict] = []

    def check(item) -> None:
        """What the single call checks before the store: an object, a destination."""
        if not isinstance(item, dict):
            raise ValidationError("body", bodies.NOT_AN_OBJECT)
        check_destination(verdicts, item)

    def create(tx):
        quota = admit(tx, who, "jobs", len(items), _parses(tx))  # a job past it: 409 in its slot

        def check_all(item) -> None:
            check(item)
            quota(item)

        results = [
            _batch_result(r)
            for r in gw.jobs.create_many(tx.conn, tx.tenant, items, tx.now, check=check_all)
        ]
        made.extend(r["job"] for r in results if r["status"] == 201)
        return {"results": results}

    return gw.answer_with_topics(gw.as_tenant(who, create), jobs=made)


def _parses(tx):
    """What the store checks of a job body (for the quota, at its limit only)."""
    classes = tuple(tx.tenant["priority_classes"])
    return lambda body: parse_job(body, now_ms=tx.now, allowed_priorities=classes)


def _batch_result(result: dict | Exception) -> dict:
    if isinstance(result, LookupTimedOut):
        result = result.problem  # 503, as the single call answers it
    if isinstance(result, Exception):
        status, doc, _headers = problems.from_exception(result)
        return {"status": status, "problem": doc}
    return {"status": 201, "job": shown(result)}


@router.get("", responses=oa.ok(oa.page(oa.JOB)), summary="The tenant's jobs, oldest first")
def list_jobs(
    gw: Gw,
    who: TenantCaller,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
):
    if cursor is not None and not _CURSOR.match(cursor):
        raise ValidationError("cursor", "is not a cursor this API returned")

    def page(tx):
        out = gw.jobs.list(tx.conn, tx.tenant["tenant_id"], cursor=cursor, limit=limit)
        return {**out, "items": [shown(job) for job in out["items"]]}

    return gw.as_tenant(who, page)


@router.get("/{job_id}", responses=oa.ok(oa.JOB, 200, 404), summary="One job")
def get_job(gw: Gw, who: TenantCaller, job_id: str):
    jid = ident(job_id, "job")
    return gw.as_tenant(who, lambda tx: shown(gw.jobs.get(tx.conn, tx.tenant["tenant_id"], jid)))


@router.patch(
    "/{job_id}",
    openapi_extra=oa.body(oa.JOB_PATCH),
    responses=oa.ok(oa.JOB, 200, 403, 404, 413),
    summary="Change a job: the fields given replace the job's",
)
def update_job(gw: Gw, who: TenantCaller, job_id: str, body: JsonObject):
    jid = ident(job_id, "job")
    verdicts = looked_up(gw, [body])
    verdicts.raise_timeout()

    made: list[dict] = []  # a new target's topics: made before the answer, as a new job's

    def update(tx):
        check_destination(verdicts, body)
        patch = _unmask_env(gw, tx, jid, body)
        made.append(shown(gw.jobs.update(tx.conn, tx.tenant, jid, patch, tx.now)))
        return made[-1]

    return gw.answer_with_topics(gw.as_tenant(who, update), jobs=made if "target" in body else [])


@router.delete(
    "/{job_id}",
    status_code=204,
    responses=oa.errors(404),
    summary="Delete a job; its pending runs are cancelled",
)
def delete_job(gw: Gw, who: TenantCaller, job_id: str):
    jid = ident(job_id, "job")
    return gw.as_tenant(who, lambda tx: gw.jobs.delete(tx.conn, tx.tenant, jid, tx.now), 204)


@router.post("/{job_id}/pause", responses=oa.ok(oa.JOB, 200, 404), summary="Pause a job")
def pause_job(gw: Gw, who: TenantCaller, job_id: str, _body: OptionalObject):
    jid = ident(job_id, "job")
    return gw.as_tenant(who, lambda tx: shown(gw.jobs.pause(tx.conn, tx.tenant, jid, tx.now)))


@router.post(
    "/{job_id}/resume",
    responses=oa.ok(oa.JOB, 200, 404),
    summary="Resume a job; missed instants go through its catch-up window",
)
def resume_job(gw: Gw, who: TenantCaller, job_id: str, _body: OptionalObject):
    jid = ident(job_id, "job")
    return gw.as_tenant(who, lambda tx: shown(gw.jobs.resume(tx.conn, tx.tenant, jid, tx.now)))


@router.post(
    "/{job_id}/trigger",
    status_code=201,
    responses=oa.ok(TRIGGERED, 201, 404),
    summary="A run now, outside the schedule (201; 200 when that run already existed)",
)
def trigger_job(gw: Gw, who: TenantCaller, job_id: str, _body: OptionalObject):
    jid = ident(job_id, "job")

    def trigger(tx):
        out = gw.jobs.trigger(tx.conn, tx.tenant, jid, tx.now)
        return Reply(201 if out["created"] else 200, out)

    return gw.as_tenant(who, trigger)


@router.post(
    "/{job_id}/rotate-secret",
    responses=oa.ok(ROTATED, 200, 404, 409),
    summary="A new webhook signing secret (shown once); old ones sign on for overlap_ms",
)
def rotate_secret(gw: Gw, who: TenantCaller, job_id: str, body: OptionalObject):
    jid = ident(job_id, "job")
    body = body or {}
    unknown = sorted(set(body) - {"overlap_ms"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    overlap = body.get("overlap_ms", 86_400_000)
    return gw.as_tenant(
        who, lambda tx: gw.jobs.rotate_secret(tx.conn, tx.tenant, jid, tx.now, overlap)
    )


@router.post(
    "/{job_id}/backfill",
    openapi_extra=oa.body(oa.BACKFILL),
    responses=oa.ok(BACKFILLED, 200, 404),
    summary="Runs for the schedule's instants in [from, to]; instants that ran are not rerun",
)
def backfill_job(gw: Gw, who: TenantCaller, job_id: str, body: JsonObject):
    jid = ident(job_id, "job")
    unknown = sorted(set(body) - {"from", "to"})
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    start, end = _instant(body, "from"), _instant(body, "to")
    return gw.as_tenant(
        who, lambda tx: gw.jobs.backfill(tx.conn, tx.tenant, jid, start, end, tx.now)
    )


def _instant(body: dict, field: str) -> int:
    text: Any = body.get(field)
    if not isinstance(text, str):
        raise ValidationError(field, "must be an RFC 3339 instant")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            raise ValueError("no offset")
        ms = to_ms(moment)
    except (ValueError, OverflowError) as e:
        raise ValidationError(field, "must be an RFC 3339 instant with an offset or Z") from e
    if ms < _MIN_INSTANT:
        raise ValidationError(field, "must not be before 1970-01-01T00:00:00Z")
    return ms
