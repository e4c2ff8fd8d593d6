"""`GET /v1/schedules/preview`: the same JSON as `cronwheel preview --json`,
computed by the same code the timer fires with (cronwheel.core.preview)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from cronwheel.core.errors import ValidationError
from cronwheel.core.preview import MAX_COUNT, parse_from, preview_json
from services.gateway import openapi as oa
from services.gateway.auth import AnyCaller
from services.gateway.routes import Gw

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
# Fires are computed from instants the calendar can hold in every zone.
EARLIEST_FROM = parse_from("1970-01-01T00:00:00Z")
LATEST_FROM = parse_from("9000-01-01T00:00:00Z")


@router.get(
    "/preview",
    responses=oa.ok(oa.PREVIEW),
    summary="The next fire instants of a cron schedule, in UTC and local time",
)
def preview(
    gw: Gw,
    who: AnyCaller,
    cron: str,
    timezone: str = "UTC",
    count: Annotated[int, Query(ge=1, le=MAX_COUNT)] = 10,
    from_: Annotated[
        str | None, Query(alias="from", json_schema_extra={"format": "date-time"})
    ] = None,
    gap: Annotated[str, Query(json_schema_extra={"enum": ["shift", "skip"]})] = "shift",
    repeat: Annotated[str, Query(json_schema_extra={"enum": ["first", "last", "both"]})] = "first",
):
    if from_ is not None and not EARLIEST_FROM <= parse_from(from_) <= LATEST_FROM:
        raise ValidationError("from", "must be between 1970 and 9000")
    spec = {"cron": cron, "timezone": timezone, "dst": {"gap": gap, "repeat": repeat}}

    def compute() -> dict:
        try:
            return preview_json(spec, count=count, from_iso=from_)
        except ValidationError as e:
            field = e.field.removeprefix("dst.")
            raise ValidationError(field, e.message, e.code) from e

    return gw.as_anyone(who, compute)
