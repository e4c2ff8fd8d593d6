"""Unauthenticated operations endpoints: liveness, readiness, Prometheus."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

from cronwheel import metrics as families  # the system's series exist here too
from services.gateway.routes import Gw

router = APIRouter(tags=["operations"])
log = logging.getLogger("cronwheel.gateway")


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz():
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: PostgreSQL answers a query and Kafka returns metadata",
    responses={503: {"description": "a dependency is down"}},
)
def readyz(gw: Gw):
    checks = {}
    for name, check in (("postgres", gw.check_database), ("kafka", gw.check_kafka)):
        try:
            check()
            checks[name] = "ok"
        except Exception as e:  # any failure means not ready; say which and why
            log.warning("readiness: %s is not ready: %s", name, e)
            checks[name] = f"error: {type(e).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", summary="Prometheus metrics of this process")
def metrics(gw: Gw):
    body, kind = families.render(gw.cell)  # every sample with cell="<this gateway's cell>"
    return Response(body, media_type=kind)
