"""The worker protocol's routes (start, heartbeat, complete) without FastAPI's
per-request machinery, which the profile showed cost more than the handlers:
routing tries the routes in order (~30 `matches` per request to reach
/v1/runs) and solves ~6 dependencies.

This ASGI middleware sits inside HttpMetrics and answers exactly
`POST /v1/runs/{run_id}/(start|heartbeat|complete)` and
`POST /v1/runs/(start|complete)-batch`. It does what the
dependencies do, with the same functions in the same order (auth.caller and
auth.tenant_caller, then bodies.json_object), then calls the route's own
endpoint function from routes/runs.py on the threadpool, as FastAPI does for a
sync endpoint. Errors go to the app's own exception handlers (problems.py), so
the answers are the same RFC 9457 documents. The FastAPI routes stay
registered: /openapi.json documents them unchanged, and every other request
passes through untouched.
"""

from __future__ import annotations

import re

from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from services.gateway import auth, bodies
from services.gateway.routes import runs

_PATH = re.compile(r"^/v1/runs/([^/]+)/(start|heartbeat|complete)$")
_BATCH_PATH = re.compile(r"^/v1/runs/(start-batch|complete-batch)$")
_ENDPOINTS = {"start": runs.start_run, "heartbeat": runs.heartbeat, "complete": runs.complete_run}
_BATCH_ENDPOINTS = {"start-batch": runs.start_batch, "complete-batch": runs.complete_batch}


def bearer(request: Request) -> HTTPAuthorizationCredentials | None:
    """What fastapi.security.HTTPBearer(auto_error=False) makes of the header."""
    authorization = request.headers.get("Authorization")
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if not (scheme and credentials) or scheme.lower() != "bearer":
        return None
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=credentials)


class WorkerFastPath:
    def __init__(self, app):
        self.app = app
        self._routes: dict[str, object] | None = None

    def _route_objects(self, fastapi_app) -> dict[str, object]:
        """A stand-in for the matched route of each verb the app documents, put in
        the scope as routing would: HttpMetrics labels requests by its `path`."""
        if self._routes is None:
            paths = fastapi_app.openapi()["paths"]
            self._routes = {
                verb: _Route(path)
                for verb in _ENDPOINTS
                if "post" in paths.get(path := f"/v1/runs/{{run_id}}/{verb}", {})
            } | {
                verb: _Route(path)
                for verb in _BATCH_ENDPOINTS
                if "post" in paths.get(path := f"/v1/runs/{verb}", {})
            }
        return self._routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        match = _PATH.match(path) or _BATCH_PATH.match(path)
        if match is None:
            await self.app(scope, receive, send)
            return
        run_id, verb = match.groups() if match.re is _PATH else (None, match.group(1))
        fastapi_app = scope["app"]
        route = self._route_objects(fastapi_app).get(verb)
        if route is None:  # not documented here: let FastAPI answer
            await self.app(scope, receive, send)
            return
        scope["route"] = route
        scope["path_params"] = {} if run_id is None else {"run_id": run_id}
        request = Request(scope, receive)
        try:
            who = await auth.tenant_caller(await auth.caller(request, bearer(request)))
            body = await bodies.json_object(request)
            gateway = fastapi_app.state.gateway
            if run_id is None:
                endpoint = _BATCH_ENDPOINTS[verb]
                response = await run_in_threadpool(endpoint, gateway, who, body)
            else:
                endpoint = _ENDPOINTS[verb]
                response = await run_in_threadpool(endpoint, gateway, who, run_id, body)
        except Exception as e:
            handler = _handler_for(fastapi_app, e)
            if handler is None:
                raise  # ServerErrorMiddleware: the app's 500 problem, logged
            response = await handler(request, e)
        await response(scope, receive, send)


class _Route:
    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


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
