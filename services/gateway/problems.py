"""Errors as `application/problem+json` (RFC 9457): type, title, status, detail,
plus a stable machine-readable `code` and, for bad input, the `field` at fault.

The core raises ValidationError / NotFound / Conflict, each with a code and no
HTTP; `status_of` says which status each answers with. The gateway adds its own
Problem for what only HTTP knows (auth, size, rate, idempotency). Every bad
input becomes a 4xx here; a 5xx means a bug, and is logged as one.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.logs import run_fields

log = logging.getLogger("cronwheel.gateway")
MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:cronwheel:problem:"


class Problem(Exception):
    """An HTTP-level error raised by the gateway itself."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        extensions: dict[str, Any] | None = None,
    ):
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        # RFC 9457 extension members beside `code` (a 421's home `cell`).
        self.extensions = extensions or {}


def document(status: int, code: str, detail: str, field: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "type": TYPE_PREFIX + code.lower().replace("_", "-"),
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if field is not None:
        doc["field"] = field
    return doc


def render(status: int, body: dict | str, headers: dict[str, str] | None = None) -> Response:
    text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
    return Response(text, status_code=status, media_type=MEDIA_TYPE, headers=headers)


# The core's codes that answer with another status than their kind's.
STATUS_BY_CODE = {
    "PAYLOAD_TOO_LARGE": 413,  # a payload, node graph or result over its limit
    "PRIORITY_NOT_ALLOWED": 403,  # a class the tenant is not entitled to
}
STATUS_BY_KIND: dict[type[Exception], int] = {ValidationError: 422, NotFound: 404, Conflict: 409}


def status_of(e: ValidationError | NotFound | Conflict) -> int:
    """The HTTP status of a core error: by its code, else by its kind."""
    if e.code in STATUS_BY_CODE:
        return STATUS_BY_CODE[e.code]
    return next(status for kind, status in STATUS_BY_KIND.items() if isinstance(e, kind))


def from_exception(e: Exception) -> tuple[int, dict, dict[str, str]]:
    """(status, problem document, headers) for the errors requests may raise."""
    if isinstance(e, Problem):
        doc = document(e.status, e.code, e.detail, e.field)
        doc.update({k: v for k, v in e.extensions.items() if k not in doc})
        return e.status, doc, e.headers
    if isinstance(e, ValidationError):
        status = status_of(e)
        return status, document(status, e.code, e.message, e.field), {}
    if isinstance(e, NotFound):
        return 404, document(404, e.code, f"no such {e.what}"), {}
    if isinstance(e, Conflict):
        status = status_of(e)
        return status, document(status, e.code, e.message), {}
    if isinstance(e, OverflowError):
        return 422, out_of_range(), {}
    raise TypeError(f"not a request error: {e!r}")


def out_of_range() -> dict:
    # A stopgap: the core should name the field (see the gateway's report);
    # an instant or interval beyond what a calendar holds is still bad input.
    return document(422, "OUT_OF_RANGE", "a number or instant is out of range", "body")


REQUEST_ERRORS = (Problem, ValidationError, NotFound, Conflict)


def _field_of(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("query", "path", "header", "body")]
    return ".".join(parts) or "request"


def _methods_for(request: Request) -> list[str]:
    """Every method served at this path (Starlette's 405 names only the first
    route's), read from the app's own OpenAPI paths once."""
    table = getattr(request.app.state, "methods_by_path", None)
    if table is None:
        table = [
            (compile_path(path)[0], sorted(m.upper() for m in ops))
            for path, ops in request.app.openapi()["paths"].items()
        ]
        request.app.state.methods_by_path = table
    for regex, methods in table:
        if regex.match(request.url.path):
            return methods
    return ["GET"]


def install(app: FastAPI) -> None:
    """Route every error through one renderer."""

    async def request_error(request: Request, e: Exception) -> Response:
        status, doc, headers = from_exception(e)
        return render(status, doc, headers)

    async def parameter_error(request: Request, e: Exception) -> Response:
        assert isinstance(e, RequestValidationError)
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        field = _field_of(tuple(first.get("loc", ())))
        return render(422, document(422, "INVALID_FIELD", str(first.get("msg")), field))

    async def http_error(request: Request, e: Exception) -> Response:
        assert isinstance(e, StarletteHTTPException)
        codes = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}
        code = codes.get(e.status_code, HTTPStatus(e.status_code).name)
        detail = e.detail if isinstance(e.detail, str) else HTTPStatus(e.status_code).phrase
        headers = dict(e.headers or {})
        if e.status_code == 404:
            detail = f"no route {request.url.path}"
        elif e.status_code == 405:
            allowed = _methods_for(request)
            headers["Allow"] = ", ".join(allowed)
            detail = f"{request.method} is not allowed here; use {' or '.join(allowed)}"
        return render(e.status_code, document(e.status_code, code, detail), headers)

    async def unavailable(request: Request, e: Exception) -> Response:
        log.warning(
            "database unavailable on %s %s: %s",
            request.method,
            request.url.path,
            e,
            extra=run_fields(run_id=request.path_params.get("run_id")),
        )
        doc = document(503, "UNAVAILABLE", "the database is unavailable or busy; retry")
        return render(503, doc, {"Retry-After": "1"})

    async def overflow(request: Request, e: Exception) -> Response:
        log.warning(
            "out-of-range input on %s %s: %s",
            request.method,
            request.url.path,
            e,
            extra=run_fields(run_id=request.path_params.get("run_id")),
        )
        return render(422, out_of_range())

    async def server_error(request: Request, e: Exception) -> Response:
        log.exception(
            "unhandled error on %s %s",
            request.method,
            request.url.path,
            extra=run_fields(run_id=request.path_params.get("run_id")),
        )
        return render(500, document(500, "INTERNAL", "an internal error; it has been logged"))

    for exc in REQUEST_ERRORS:
        app.add_exception_handler(exc, request_error)
    app.add_exception_handler(RequestValidationError, parameter_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    for exc in (psycopg.OperationalError, psycopg.errors.TransactionRollback, PoolTimeout):
        app.add_exception_handler(exc, unavailable)
    app.add_exception_handler(OverflowError, overflow)
    app.add_exception_handler(Exception, server_error)
