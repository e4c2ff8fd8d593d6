"""Who is calling: `Authorization: Bearer <key>`.

The operator key (CRONWHEEL_OPERATOR_KEY) manages tenants; a tenant key sees
and changes only its tenant. Here the header is parsed, the rate limit applied
(per key, before any database work) and the Idempotency-Key read. Whether a
tenant key is valid is decided in the request's own transaction
(transactions.py), so a revoked key stops working at once.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cronwheel.store.jobs import hash_key
from services.gateway import idempotency
from services.gateway.problems import Problem
from services.gateway.ratelimit import retry_after

bearer = HTTPBearer(auto_error=False, description="An operator key or a tenant API key")


@dataclass
class Caller:
    token: str
    operator: bool
    request: Request
    idempotency_key: str | None

    def idempotent_request(self) -> idempotency.IdempotentRequest | None:
        if self.idempotency_key is None:
            return None
        body = getattr(self.request.state, "body", None)
        return idempotency.IdempotentRequest(
            self.idempotency_key,
            idempotency.fingerprint(self.request.method, self.request.url.path, body),
        )


def unauthenticated(detail: str) -> Problem:
    return Problem(401, "UNAUTHENTICATED", detail, headers={"WWW-Authenticate": "Bearer"})


async def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if credentials is None or not credentials.credentials:
        raise unauthenticated("send Authorization: Bearer <key>")
    token = credentials.credentials
    gateway = request.app.state.gateway
    wait = gateway.limiter.take(hash_key(token))
    if wait > 0:
        raise Problem(
            429,
            "RATE_LIMITED",
            f"this key is over its rate limit of {gateway.limiter.rate:g}/s",
            headers={"Retry-After": retry_after(wait)},
        )
    key = None
    if request.method == "POST":
        key = idempotency.parse_key(request.headers.get(idempotency.HEADER))
    operator = hmac.compare_digest(token.encode(), gateway.operator_key.encode())
    return Caller(token, operator, request, key)


async def tenant_caller(who: Annotated[Caller, Depends(caller)]) -> Caller:
    if who.operator:
        raise Problem(403, "FORBIDDEN", "the operator key manages tenants; use a tenant key")
    return who


AnyCaller = Annotated[Caller, Depends(caller)]
TenantCaller = Annotated[Caller, Depends(tenant_caller)]
