"""GET /v1/system: the platform's health, for the operator key (a tenant key
gets 403). What each figure is made of: cronwheel/store/system.py (the
database's) and services/gateway/system.py (the broker's); docs/api.md,
"The platform's health"."""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Query

from services.gateway import openapi as oa
from services.gateway.auth import AnyCaller
from services.gateway.cells import homing_of
from services.gateway.routes import Gw
from services.gateway.system import SystemHealth

router = APIRouter(tags=["operations"])

MAX_MINUTES = 60
_ERROR = {"type": "string", "description": "why this section has no figures, in words"}
_COUNT = {"type": "integer"}
_MS = {"type": ["integer", "null"]}
_CAPPED = {"type": "boolean", "description": "counting stopped at 100,000: at least that many"}


def _section(properties: dict) -> dict:
    return {"type": "object", "properties": {**properties, "error": _ERROR}}


def _percentiles(what: str) -> dict:
    return {
        "type": "object",
        "description": what,
        "properties": {"runs": _COUNT, "p50_ms": _MS, "p99_ms": _MS, "max_ms": _MS},
    }


SYSTEM = {
    "type": "object",
    "properties": {
        "cell": {"type": "string", "description": "the cell this gateway serves"},
        "as_of": oa.INSTANT,
        "broker_as_of": oa.INSTANT,
        "cache_ms": {"type": "integer", "description": "figures are at most this old"},
        "services": _section(
            {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "kind": {"type": "string", "example": "timer"},
                            "service": {"type": "string", "description": "its lease name"},
                            "instances": _COUNT,
                            "partitions": _COUNT,
                            "partitions_leased": _COUNT,
                            "ready": {"type": "boolean"},
                            "lease_until": oa.NULLABLE_INSTANT,
                        },
                    },
                }
            }
        ),
        "outbox": _section(
            {
                "ready": _COUNT,
                "held": _COUNT,
                "capped": _CAPPED,
                "oldest_ready_at": oa.NULLABLE_INSTANT,
                "oldest_ready_age_ms": _MS,
            }
        ),
        "timers": _section(
            {
                "overdue": _COUNT,
                "capped": _CAPPED,
                "overdue_after_ms": _COUNT,
                "oldest_due_at": oa.NULLABLE_INSTANT,
            }
        ),
        "lateness": _section(
            {
                "window_ms": _COUNT,
                "measured_from": {"type": "string", "enum": ["scheduled_at"]},
                "sampled": {
                    "type": "boolean",
                    "description": "a tenant had more runs than its share of the 20,000 sampled",
                },
                "fired": _percentiles("the run's creation less its instant (0 if created ahead)"),
                "started": _percentiles("a first attempt's start less its instant"),
            }
        ),
        "runs": _section(
            {
                "pending": _COUNT,
                "running": _COUNT,
                "retry_wait": _COUNT,
                "reannounced_waiting": _COUNT,
                "reannounced_recently": _COUNT,
                "last_reannounced_at": oa.NULLABLE_INSTANT,
                "capped": _CAPPED,
            }
        ),
        "consumers": _section(
            {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "consumer": {"type": "string", "example": "dispatcher"},
                            "group": {"type": "string"},
                            "lag": _COUNT,
                            "partitions": _COUNT,
                            "committed_partitions": _COUNT,
                            "members": {
                                "type": ["integer", "null"],
                                "description": "null when the group could not be described",
                            },
                            "state": {"type": "string"},
                            "error": _ERROR,
                        },
                    },
                }
            }
        ),
        "dead_letters": _section(
            {
                "topic": {"type": "string"},
                "exists": {"type": "boolean"},
                "count": {"type": "integer", "description": "records retained on the topic"},
                "recent": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "at": oa.INSTANT,
                            "consumer": {"type": "string"},
                            "reason": {"type": "string"},
                            "source_topic": {"type": "string"},
                            "source_partition": _COUNT,
                            "source_offset": _COUNT,
                            "key": {"type": ["string", "null"]},
                            "partition": _COUNT,
                            "offset": _COUNT,
                        },
                    },
                },
            }
        ),
    },
}

_made = threading.Lock()


def _health(gw, app) -> SystemHealth:
    """The app's one SystemHealth (its caches), made on first use."""
    with _made:
        health = getattr(app.state, "system_health", None)
        if health is None:
            health = app.state.system_health = SystemHealth(gw)
        return health


@router.get(
    "/v1/system",
    responses=oa.ok(SYSTEM, 200, 403, 421),
    summary="The platform's health (operator): services, lag, dead letters, lateness, backlogs",
)
def get_system(
    gw: Gw,
    who: AnyCaller,
    minutes: Annotated[int, Query(ge=1, le=MAX_MINUTES)] = 5,
    cell: Annotated[
        str | None,
        Query(
            description="the cell whose health is asked for (through the router, any cell;"
            " a cell's gateway answers for its own and 421 for another)",
            pattern=r"^[a-z0-9-]{1,50}$",
        ),
    ] = None,
):
    """`minutes`: the window of the lateness figures and of `reannounced_recently`."""
    if cell is not None:
        homing = homing_of(who.request.app)
        if cell != homing.cell:
            raise homing.misdirected(cell, "the health asked for is of cell")
    health = _health(gw, who.request.app)
    # The broker first, and only for the operator key: no pool connection
    # waits on the broker, and no other key makes the gateway ask it.
    broker = health.broker_figures() if who.operator else None
    return gw.as_operator(who, lambda tx: health.answer(tx, broker, minutes * 60_000))
