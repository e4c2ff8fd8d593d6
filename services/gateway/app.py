"""The gateway's app factory: the `/v1` API of CONTRACT.md over one connection pool.

`create_app` wires the pieces; each lives in a module named for it:
auth (bearer keys), ratelimit, bodies (size cap, strict JSON), idempotency,
problems (RFC 9457 errors), transactions (one request = one transaction in the
caller's scope), accounts (tenants and keys), routes/* (one module per resource).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence

from anyio import to_thread
from fastapi import FastAPI

from cronwheel import config
from cronwheel.core.clock import now_ms
from cronwheel.core.ssrf import Network, allowed_networks
from cronwheel.kafka import Topics
from services.gateway import console, fastpath, problems, topics_ready
from services.gateway.http_metrics import HttpMetrics
from services.gateway.ratelimit import RateLimiter, SharedRateLimiter
from services.gateway.routes import (
    health,
    jobs,
    quotas,
    retention,
    runs,
    schedules,
    system,
    tenants,
    workflows,
)
from services.gateway.transactions import Gateway

DESCRIPTION = """\
cronwheel's admin and worker API. Authenticate with `Authorization: Bearer <key>`:
the operator key manages tenants; a tenant key sees and changes only its tenant.
Errors are `application/problem+json` with a stable `code` and the `field` at fault.
See docs/api.md."""


def create_app(
    dsn: str,
    topics: Topics,
    bootstrap: str,
    operator_key: str,
    *,
    rate_per_s: float = 1000.0,
    burst: float = 2000.0,
    clock: Callable[[], int] = now_ms,
    cell: str | None = None,
    webhook_allow: Sequence[Network] | None = None,
    pool_max: int = 10,
    worker_fastpath: bool = True,
    jobs_fastpath: bool | None = None,
    rate_limit_table: str | None = None,
    make_topics: bool = False,
    topics_wait_s: float = topics_ready.WAIT_S,
) -> FastAPI:
    """The ASGI app. Its pool opens now; call `app.state.gateway.close()` when done.
    `worker_fastpath`: serve start, heartbeat and complete (and their batches)
    past FastAPI's routing and dependencies (fastpath.py); the same answers
    either way. `jobs_fastpath`: the same for POST /v1/jobs and /v1/jobs/batch;
    None follows `worker_fastpath`.
    `rate_limit_table`: the rate-limit buckets shared by the gateway's worker
    processes (ratelimit.create_table); None keeps them in this process.
    `make_topics`: tenants' topics made before the calls that create tenants
    and jobs answer, waiting for the broker `topics_wait_s` at most
    (topics_ready.py); the gateway's process turns it on
    (CRONWHEEL_GATEWAY_MAKES_TOPICS, CRONWHEEL_GATEWAY_TOPICS_WAIT_MS)."""
    if rate_limit_table is None:
        limiter = RateLimiter(rate_per_s, burst)
    else:
        limiter = SharedRateLimiter(rate_limit_table, rate_per_s, burst)
    gateway = Gateway(
        dsn,
        topics,
        bootstrap,
        operator_key,
        limiter=limiter,
        clock=clock,
        cell=cell or config.cell(),
        webhook_allow=allowed_networks() if webhook_allow is None else webhook_allow,
        pool_max=pool_max,
        make_topics=make_topics,
        topics_wait_s=topics_wait_s,
    )
    app = FastAPI(
        title="cronwheel",
        version="1",
        description=DESCRIPTION,
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.gateway = gateway
    problems.install(app)
    for module in (tenants, quotas, retention, jobs, runs, workflows, schedules, health, system):
        app.include_router(module.router)
    app.include_router(console.router)  # /ui/: static files over the same /v1 API
    if jobs_fastpath is None:
        jobs_fastpath = worker_fastpath
    shortcuts = (fastpath.WORKER if worker_fastpath else ()) + (
        fastpath.JOBS if jobs_fastpath else ()
    )
    if shortcuts:  # added first: inside HttpMetrics
        app.add_middleware(fastpath.FastPath, shortcuts=shortcuts)
    app.add_middleware(HttpMetrics)
    app.add_middleware(ThreadsForPool, threads=pool_max + SPARE_THREADS)
    return app


SPARE_THREADS = 2  # for sync endpoints that use no pool connection (/metrics, /readyz)


class ThreadsForPool:
    """Sizes the threadpool that runs the sync endpoints (anyio's default one,
    40 threads, per event loop) to the connection pool plus a spare few: every
    request past the pool's size would only block a thread waiting for a
    connection, and those waiting threads cost GIL hand-offs. At 300 requests/s
    on one worker, 12 threads instead of 40 halved the gateway's context
    switches and cut its CPU per request by 7-14% (two A/B pairs of
    bench_gateway.py on a loaded machine).
    Requests past the threads wait on the event loop instead (as they did past
    40); one blocked on the pool for its 5 s still gets 503."""

    def __init__(self, app, threads: int):
        self.app = app
        self.threads = threads
        self._sized = weakref.WeakSet()  # the event loops done (tests run several)

    async def __call__(self, scope, receive, send):
        loop = asyncio.get_running_loop()
        if loop not in self._sized:
            to_thread.current_default_thread_limiter().total_tokens = self.threads
            self._sized.add(loop)
        await self.app(scope, receive, send)
