"""The /v1 routes, one module per resource. Each handler only translates: HTTP
in, one call into cronwheel/store (inside Gateway.as_tenant / as_operator), JSON
out. Validation belongs to the core; these modules add only what HTTP knows."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Depends, Request

from cronwheel.core.errors import NotFound
from services.gateway.transactions import Gateway

_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


async def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


Gw = Annotated[Gateway, Depends(_gateway)]


def ident(value: str, what: str) -> str:
    """A path id that cannot name anything (wrong characters, too long) is a 404,
    answered before it reaches the database."""
    if not _ID.match(value):
        raise NotFound(what)
    return value
