"""Who is calling: `Authorization: Bearer <key>`.

The operator key (CRONWHEEL_OPERATOR_KEY) manages tenants; a tenant key sees
and changes only its tenant. Here the header is parsed, the key's tenant found
(KeyGuard), the rate limit applied (per tenant, before the request's
transaction) and the Idempotency-Key read. Whether a tenant key is valid is
decided again in the request's own transaction (transactions.py), so a revoked
key stops working at once.

KeyGuard keeps, per process, what it learned of each key's hash for `cache_s`:
its tenant, or that it is unknown or revoked. A key it has not seen is looked
up in one statement outside any transaction block (cronwheel_authenticate in
autocommit), on first use; after that an unknown key costs no database work at
all. A known key's tenant names its rate-limit bucket, so every key of a tenant
shares one. Failed authentications (an unknown or revoked key) are counted per
client address in the same shared table of buckets (ratelimit.py):
`failures_per_minute` of them, then `429 RATE_LIMITED` with Retry-After, and an
address over its budget gets no lookup for a key the guard does not know (a
key it knows to be good still works from there). docs/api.md, "Rate limits".

With cells, a request for a tenant homed in another cell is refused with 421
before any of that tenant's work (cells.py): a tenant key's tenant, an
operator path's `/v1/tenants/{id}`, and an unknown key that names a tenant
homed elsewhere (a key of that cell, sent here).
"""

from __future__ import annotations

import functools
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from cronwheel.store.jobs import hash_key
from cronwheel.store.sql_loader import queries
from services.gateway import idempotency
from services.gateway.cells import homing_of, tenant_of_key, tenant_of_path
from services.gateway.problems import Problem
from services.gateway.ratelimit import bucket_key, retry_after

bearer = HTTPBearer(auto_error=False, description="An operator key or a tenant API key")


@dataclass
class Caller:
    token: str = field(repr=False)  # a key: never in a log line or a traceback's repr
    operator: bool
    request: Request = field(repr=False)
    idempotency_key: str | None
    tenant_id: str | None = None  # as KeyGuard knew it; the transaction checks again

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


@dataclass(frozen=True)
class AuthLimits:
    """Settings of KeyGuard (GatewaySettings: CRONWHEEL_AUTH_FAILURES_PER_MINUTE,
    CRONWHEEL_AUTH_CACHE_S)."""

    failures_per_minute: int = 30
    cache_s: float = 30.0


_REFUSED = ""  # the cached answer for an unknown or revoked key
# A frozen tenant's requests that go on (cells.py, transactions.py); the rest are writes.
READS = frozenset({"GET", "HEAD", "OPTIONS"})


@functools.cache
def _q() -> dict[str, str]:
    return queries("auth")


class KeyGuard:
    """What this process knows of keys (by hash, for `cache_s`, at most
    `max_keys` of them) and the failed-authentication budget per address."""

    def __init__(
        self,
        limits: AuthLimits = AuthLimits(),
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ):
        if limits.failures_per_minute < 1 or limits.cache_s < 0:
            raise ValueError("failures_per_minute must be >= 1 and cache_s >= 0")
        self.limits = limits
        self.clock = clock
        self.max_keys = max_keys
        self._keys: OrderedDict[bytes, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def known(self, key_hash: bytes) -> str | None:
        """The key's tenant id, "" for a key known to be refused, None: not known."""
        with self._lock:
            got = self._keys.get(key_hash)
            if got is None:
                return None
            if got[1] <= self.clock():
                del self._keys[key_hash]
                return None
            self._keys.move_to_end(key_hash)
            return got[0]

    def learn(self, key_hash: bytes, tenant_id: str) -> None:
        with self._lock:
            self._keys[key_hash] = (tenant_id, self.clock() + self.limits.cache_s)
            self._keys.move_to_end(key_hash)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)

    def forget(self, key_hash: bytes) -> None:
        with self._lock:
            self._keys.pop(key_hash, None)

    @staticmethod
    def lookup(pool, key_hash: bytes) -> str | None:
        """The key's tenant from the database: one statement, no transaction block."""
        with pool.connection() as conn:
            row = conn.execute(_q()["key_tenant"], {"hash": key_hash}).fetchone()
        return None if row is None else row[0]

    def failure_wait(self, limiter, address: str, cost: int) -> float:
        """Count a failed authentication from `address` (cost 1) or only look
        (cost 0): seconds until the address may fail again, 0.0 if it may now."""
        n = self.limits.failures_per_minute
        return limiter.take(
            bucket_key("auth-failures", address), rate=n / 60.0, burst=float(n), cost=cost
        )


def guard_of(app) -> KeyGuard:
    """The app's KeyGuard (main.py sets one from the settings; else the defaults)."""
    guard = getattr(app.state, "key_guard", None)
    if guard is None:
        guard = app.state.key_guard = KeyGuard()
    return guard


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


def _failed(guard: KeyGuard, limiter, address: str) -> Problem:
    """The answer to an unknown or revoked key: 401, or 429 once the address has
    spent its failures."""
    wait = guard.failure_wait(limiter, address, 1)
    if wait > 0:
        return _too_many_failures(guard, wait)
    return unauthenticated("unknown or revoked key")


def _too_many_failures(guard: KeyGuard, wait: float) -> Problem:
    return Problem(
        429,
        "RATE_LIMITED",
        f"too many failed authentications from this address"
        f" (at most {guard.limits.failures_per_minute} a minute)",
        headers={"Retry-After": retry_after(wait)},
    )


async def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if credentials is None or not credentials.credentials:
        raise unauthenticated("send Authorization: Bearer <key>")
    token = credentials.credentials
    gateway = request.app.state.gateway
    limiter = gateway.limiter
    operator = hmac.compare_digest(token.encode(), gateway.operator_key.encode())
    tenant_id = None
    homing = homing_of(request.app)
    if operator:
        if (about := tenant_of_path(request.url.path)) is not None:
            await homing.refuse_elsewhere(about)
        bucket, who = bucket_key("operator", hash_key(token)), "the operator key"
    else:
        tenant_id = await _tenant_of(request, gateway, token)
        await homing.refuse_elsewhere(tenant_id, write=request.method not in READS)
        bucket, who = bucket_key("tenant", tenant_id), "this tenant"
    wait = limiter.take(bucket)
    if wait > 0:
        raise Problem(
            429,
            "RATE_LIMITED",
            f"{who} is over its rate limit of {limiter.rate:g}/s",
            headers={"Retry-After": retry_after(wait)},
        )
    key = None
    if request.method == "POST":
        key = idempotency.parse_key(request.headers.get(idempotency.HEADER))
    return Caller(token, operator, request, key, tenant_id)


async def _tenant_of(request: Request, gateway, token: str) -> str:
    """The tenant of a key that is not the operator's, or the failure raised."""
    guard = guard_of(request.app)
    key_hash = hash_key(token)
    known = guard.known(key_hash)
    if known:
        return known
    address = _address(request)
    if known == _REFUSED:
        await _elsewhere(request, token)
        raise _failed(guard, gateway.limiter, address)
    wait = guard.failure_wait(gateway.limiter, address, 0)
    if wait > 0:  # no lookup for an address that spent its failures
        raise _too_many_failures(guard, wait)
    tenant_id = await run_in_threadpool(guard.lookup, gateway.pool, key_hash)
    guard.learn(key_hash, tenant_id or _REFUSED)
    if tenant_id is None:
        await _elsewhere(request, token)
        raise _failed(guard, gateway.limiter, address)
    return tenant_id


async def _elsewhere(request: Request, token: str) -> None:
    """421 for a key this cell does not know whose tenant is homed in another
    cell (cells.py); nothing for any other unknown key."""
    if (named := tenant_of_key(token)) is not None:
        await homing_of(request.app).refuse_elsewhere(named)


async def tenant_caller(who: Annotated[Caller, Depends(caller)]) -> Caller:
    if who.operator:
        raise Problem(403, "FORBIDDEN", "the operator key manages tenants; use a tenant key")
    return who


AnyCaller = Annotated[Caller, Depends(caller)]
TenantCaller = Annotated[Caller, Depends(tenant_caller)]
