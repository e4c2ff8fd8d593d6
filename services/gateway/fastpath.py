"""A few hot POST routes answered without FastAPI's per-request machinery:
routing tries every route in order until one matches, and each request solves
its dependency tree again. For a short handler that machinery is a large part
of the request's CPU (docs/api.md, "Worker processes, the fast paths, and
/metrics").

This ASGI middleware sits inside HttpMetrics and answers exactly the routes of
its table (`WORKER` and `JOBS` below), each only while the app has it. It
does what the route's dependencies do, with the same functions in the same
order (auth.bearer, auth.caller, auth.tenant_caller, then the route's body
dependency from bodies.py), then calls the route's own endpoint function on the
threadpool, as FastAPI does for a sync endpoint. Errors go to the app's own
exception handlers (problems.py), so the answers are the same RFC 9457
documents. The FastAPI routes stay registered: /openapi.json documents them
unchanged, and every other request passes through untouched.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import NoMatchFound

from services.gateway import auth, bodies
from services.gateway.routes import jobs, runs


@dataclass(frozen=True)
class Shortcut:
    """One POST route answered here. `path` is its template as the app documents
    it; its `{name}` segments are passed to `endpoint` by name (as FastAPI passes
    path parameters), with `gw`, `who` and `body` (what `body_of` returns)."""

    path: str
    endpoint: Callable[..., Response]
    body_of: Callable[[Request], Awaitable[dict]] = bodies.json_object
    pattern: re.Pattern[str] | None = field(init=False, default=None)

    def __post_init__(self):
        if "{" in self.path:  # Starlette's default convertor: one non-empty segment
            regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.path)
            object.__setattr__(self, "pattern", re.compile(f"^{regex}$"))


WORKER = (
    Shortcut("/v1/runs/{run_id}/start", runs.start_run),
    Shortcut("/v1/runs/{run_id}/heartbeat", runs.heartbeat),
    Shortcut("/v1/runs/{run_id}/complete", runs.complete_run),
    Shortcut("/v1/runs/start-batch", runs.start_batch),
    Shortcut("/v1/runs/complete-batch", runs.complete_batch),
)
JOBS = (
    Shortcut("/v1/jobs", jobs.create_job),
    Shortcut("/v1/jobs/batch", jobs.create_jobs, bodies.batch_object),
)


class FastPath:
    def __init__(self, app, shortcuts: Sequence[Shortcut]):
        self.app = app
        self.shortcuts = tuple(shortcuts)
        self._table: _Table | None = None

    def _match(self, fastapi_app, path: str) -> tuple[Shortcut, _Route, dict] | None:
        if self._table is None:
            self._table = _Table([s for s in self.shortcuts if _served(fastapi_app, s)])
        found = self._table.exact.get(path)
        if found is not None:
            return *found, {}
        for shortcut, route in self._table.patterns:
            m = shortcut.pattern.match(path)  # type: ignore[union-attr]
            if m is not None:
                return shortcut, route, m.groupdict()
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        fastapi_app = scope["app"]
        match = self._match(fastapi_app, scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        shortcut, scope["route"], path_params = match
        scope["path_params"] = path_params
        request = Request(scope, receive)
        try:
            who = await auth.tenant_caller(await auth.caller(request, await auth.bearer(request)))
            body = await shortcut.body_of(request)
            gateway = fastapi_app.state.gateway
            response = await run_in_threadpool(
                shortcut.endpoint, gw=gateway, who=who, **path_params, body=body
            )
        except Exception as e:
            handler = _handler_for(fastapi_app, e)
            if handler is None:
                raise  # ServerErrorMiddleware: the app's 500 problem, logged
            response = await handler(request, e)
        await response(scope, receive, send)


class _Route:
    """A stand-in for the matched route, put in the scope as routing would:
    HttpMetrics labels requests by its `path`."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


class _Table:
    """The shortcuts: fixed paths by path, the others (with path parameters) in order."""

    def __init__(self, shortcuts: Sequence[Shortcut]):
        ours = [(s, _Route(s.path)) for s in shortcuts]
        self.exact = {s.path: (s, r) for s, r in ours if s.pattern is None}
        self.patterns = [(s, r) for s, r in ours if s.pattern is not None]


def _served(fastapi_app, shortcut: Shortcut) -> bool:
    """Whether the app has the route at `shortcut.path`, named for its endpoint
    (FastAPI's default name). Asked of the routes themselves, not of the OpenAPI
    document, which would be generated (with its warnings) on a request."""
    params = (
        {name: f"{{{name}}}" for name in shortcut.pattern.groupindex} if shortcut.pattern else {}
    )
    try:
        return fastapi_app.url_path_for(shortcut.endpoint.__name__, **params) == shortcut.path
    except NoMatchFound:
        return False


def _handler_for(fastapi_app, e: Exception):
    """The app's exception handler for `e`, as Starlette's ExceptionMiddleware
    picks it (the most specific class first); None for the catch-all one."""
    handlers = fastapi_app.exception_handlers
    for cls in type(e).__mro__:
        if cls is Exception:
            return None
        if cls in handlers:
            return handlers[cls]
    return None
