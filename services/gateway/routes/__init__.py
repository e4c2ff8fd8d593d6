"""The /v1 routes, one module per resource. Each handler only translates: HTTP
in, one call into cronwheel/store (inside Gateway.as_tenant / as_operator), JSON
out. Validation belongs to the core; these modules add only what HTTP knows."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from cronwheel.core.errors import NotFound
from services.gateway import accounts
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


def of_tenant(gw: Gateway, who, tenant_id: str, fn: Callable[[Any, str], Any]):
    """An operator request on one tenant: 404 for an unknown one, else `fn(tx, tid)`."""
    tid = ident(tenant_id, "tenant")

    def run(tx):
        accounts.get_tenant(tx.conn, tid)
        return fn(tx, tid)

    return gw.as_operator(who, run)
