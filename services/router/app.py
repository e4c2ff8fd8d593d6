"""The router's ASGI app: find the request's cell, forward it to that cell's
gateway, stream the answer back (docs/cells.md, "Routing").

Which cell, by the caller's key and nothing else of the cell's:
- a tenant key names its tenant (`cw_<tenant_id>.<random>`,
  cronwheel/store/jobs.py), and the directory (through its cache) names the
  tenant's cell. The key itself is checked by the cell's gateway, which holds
  the tenant's keys: the router keeps no key material, and a revoked key stops
  at once. A key of before keys named their tenant, or a tenant the directory
  does not know (made before cells), goes to the default cell, where such
  tenants are;
- the operator key: `POST /v1/tenants` goes to the cell its body names (the
  default cell when it names none; an unknown one is a 422 naming `cell`
  here), `GET /v1/system?cell=NAME` to that cell (likewise), `/v1/tenants/{id}...`
  to that tenant's cell, `GET /v1/tenants` to every cell (one page merged by
  tenant id), anything else to the default cell;
- no key: the default cell (its gateway answers 401, or serves what needs no
  key: /openapi.json, /ui/).

Forwarding keeps the method, path, query, headers (but the hop-by-hop ones),
status and body, each body streamed, and adds X-Forwarded-For and
X-Forwarded-Proto (the gateway's uvicorn trusts them from loopback, so its
per-address limits see the client, not the router). A cell whose gateway
does not answer is a 502 for its tenants alone; a 502 / 503 / 504 a cell's
gateway answers itself (its database down: 503 with Retry-After) comes back
with `cell` added to its problem document, so a tenant sees which cell is
down. A 421 from a cell (a move flipped the tenant since the cache read it)
drops the cache's entry and the directory is read again: a request whose
body the router kept (no body, or a declared length up to 1 MiB) goes once
to the cell it names now, so a client does not see the move.
With the directory away, routing goes on from the cache
(cronwheel/directory.py); a tenant it never saw gets 503 with Retry-After.
"""

from __future__ import annotations

import hmac
import json
import time
from http import HTTPStatus
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cronwheel.directory import Directory, DirectoryUnavailable, tenant_of_key, tenant_of_path
from cronwheel.moves import Mover
from services.router import metrics
from services.router.moves import MOVE_PATH as _MOVE_PATH
from services.router.moves import Moves

MEDIA_TYPE = "application/problem+json"
MAX_KEPT_BODY = 1 << 20  # POST /v1/tenants is read whole to find its `cell`; a body kept for a 421
MAX_PAGE = 200  # GET /v1/tenants: as the gateway's limit
# A cell's answers that say the cell is in trouble: the router names the cell in them.
CELL_TROUBLE = frozenset({502, 503, 504})
# RFC 9110 7.6.1: a proxy's own connection's, never passed on.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)


def problem(status: int, code: str, detail: str, **extra: Any) -> Response:
    doc = {
        "type": "urn:cronwheel:problem:" + code.lower().replace("_", "-"),
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }
    headers = {"Retry-After": "1"} if status == 503 else None
    return Response(json.dumps(doc), status, media_type=MEDIA_TYPE, headers=headers)


class Routing(Exception):
    """A request the router answers itself (the problem in `response`)."""

    def __init__(self, response: Response):
        self.response = response


class Router:
    def __init__(
        self,
        directory: Directory,
        operator_key: str,
        timeout_s: float = 60.0,
        moves: Moves | None = None,
    ):
        self.directory = directory
        self.operator_key = operator_key
        self.moves = moves
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
            follow_redirects=False,
        )

    # -- which cell ----------------------------------------------------------
    async def _cells(self) -> dict:
        try:
            return await run_in_threadpool(self.directory.cells)
        except DirectoryUnavailable as e:
            raise Routing(problem(503, "UNAVAILABLE", f"{e}; retry")) from e

    async def _default(self) -> str:
        cells = await self._cells()
        if not cells:
            raise Routing(problem(503, "UNAVAILABLE", "no cell is registered in the directory"))
        return next(iter(cells))

    async def _cell_of_tenant(self, tenant_id: str) -> str:
        placed = self.directory.cached(tenant_id)
        if placed is False:
            try:
                placed = await run_in_threadpool(self.directory.placement, tenant_id)
            except DirectoryUnavailable as e:
                raise Routing(problem(503, "UNAVAILABLE", f"{e}; retry")) from e
        return placed.cell if placed is not None else await self._default()

    # -- the request ---------------------------------------------------------
    async def handle(self, request: Request) -> Response:
        began = time.perf_counter()
        response, cell = await self._route(request)
        metrics.observe(cell, response.status_code, time.perf_counter() - began)
        return response

    async def _route(self, request: Request) -> tuple[Response, str | None]:
        """The answer, and the cell it came from (None: the router's own)."""
        if request.url.path in ("/healthz", "/readyz"):
            return await self._health(request.url.path), None
        try:
            token = _bearer(request)
            tenant_id = None
            body = None
            if token is not None and hmac.compare_digest(
                token.encode(), self.operator_key.encode()
            ):
                path = request.url.path
                if path == "/v1/tenants" and request.method == "GET":
                    return await self._list_tenants(request), metrics.EVERY
                if self.moves is not None and (moving := _MOVE_PATH.match(path)):
                    return await self.moves.handle(request, moving.group(1)), None
                if path == "/v1/tenants" and request.method == "POST":
                    body = await _read_whole(request)
                    cell = await self._cell_asked(body)
                elif path == "/v1/system" and (named := request.query_params.get("cell")):
                    cell = await self._known_cell(named)
                elif (tenant_id := tenant_of_path(path)) is not None:
                    cell = await self._cell_of_tenant(tenant_id)
                else:
                    cell = await self._default()
            elif self.moves is not None and _MOVE_PATH.match(request.url.path):
                forbidden = problem(403, "FORBIDDEN", "moving a tenant needs the operator key")
                return forbidden, None
            elif token is not None and (tenant_id := tenant_of_key(token)) is not None:
                cell = await self._cell_of_tenant(tenant_id)
            else:
                cell = await self._default()
            if tenant_id is not None and body is None and _replayable(request):
                body = await _read_whole(request)  # kept, to send again after a 421
            base = (await self._cells())[cell].api_url
        except Routing as r:
            return r.response, None
        response = await self._forward(request, base, cell, body)
        if response.status_code == 421 and tenant_id is not None:
            return await self._misdirected(request, tenant_id, cell, body, response)
        return response, cell

    async def _misdirected(
        self, request: Request, tenant_id: str, cell: str, body: bytes | None, answer: Response
    ) -> tuple[Response, str | None]:
        """A cell's 421: the tenant is homed elsewhere now (a move flipped it
        since the cache read it). The cache's entry goes and the directory is
        read again; when it names another cell, the request goes there, once.
        Safe for every method: a gateway answers 421 before any transaction
        (services/gateway/cells.py). Otherwise the 421 goes back as it came."""
        self.directory.forget(tenant_id)
        try:
            now = await self._cell_of_tenant(tenant_id)
            base = (await self._cells())[now].api_url
        except Routing:
            now = cell  # the directory is away: the 421 (with the home cell) is the answer
        if now == cell or body is None:
            metrics.MISDIRECTED.labels("returned").inc()
            return answer, cell
        if answer.background is not None:
            await answer.background()  # the first cell's stream, closed unread
        metrics.MISDIRECTED.labels("retried").inc()
        return await self._forward(request, base, now, body), now

    async def _cell_asked(self, body: bytes) -> str:
        """The cell a new tenant is for, as the gateway reads it (422 naming `cell`)."""
        try:
            doc = json.loads(body)
        except ValueError:
            return await self._default()  # the gateway answers the bad body
        cell = doc.get("cell") if isinstance(doc, dict) else None
        if cell is None:
            return await self._default()
        return await self._known_cell(cell)

    async def _known_cell(self, cell: object) -> str:
        """`cell` if the directory has it; else a 422 naming the field `cell`."""
        cells = await self._cells()
        if cell not in cells:
            raise Routing(
                problem(
                    422,
                    "INVALID_FIELD",
                    f"unknown cell {cell!r}; the cells: {', '.join(cells)}",
                    field="cell",
                )
            )
        return cell

    async def _forward(
        self, request: Request, base: str, cell: str, body: bytes | None
    ) -> Response:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        client = request.client.host if request.client else None
        if client:
            before = request.headers.get("x-forwarded-for")
            headers.append(("x-forwarded-for", f"{before}, {client}" if before else client))
        headers.append(("x-forwarded-proto", request.url.scheme))
        upstream = self.client.build_request(
            request.method,
            base + request.url.path,
            params=request.url.query or None,
            headers=headers,
            content=body if body is not None else request.stream(),
        )
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.TimeoutException:
            return problem(504, "CELL_TIMEOUT", f"cell {cell!r} did not answer in time", cell=cell)
        except httpx.TransportError as e:
            return problem(502, "CELL_UNREACHABLE", f"cell {cell!r} is unreachable: {e}", cell=cell)
        if answer.status_code in CELL_TROUBLE:
            return await _naming_the_cell(answer, cell)
        out = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        response = StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            background=BackgroundTask(answer.aclose),
        )
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out]
        return response

    async def _list_tenants(self, request: Request) -> Response:
        """GET /v1/tenants across every cell: each cell's page after the same
        cursor, merged by tenant id (the order each cell pages in), cut to the
        limit; the next cursor is the last id shown when any cell had more.
        A tenant two cells list (a move's copy in its target, or the copy a
        move kept in the cell it left) is shown once, as its home cell has it."""
        try:
            cells = await self._cells()
        except Routing as r:
            return r.response
        pages = []
        listed_by: dict[str, list[str]] = {}
        for cell, info in cells.items():
            answer = await self._forward(request, info.api_url, cell, b"")
            if isinstance(answer, StreamingResponse):
                text = b"".join([chunk async for chunk in answer.body_iterator])
            else:  # answered whole (a cell in trouble, named)
                text = bytes(answer.body)
            if answer.status_code != 200:
                return Response(text, answer.status_code, media_type=MEDIA_TYPE)
            page = json.loads(text)
            for item in page["items"]:
                listed_by.setdefault(item["tenant_id"], []).append(cell)
            pages.append((cell, page))
        try:
            homes = {
                tenant_id: await self._cell_of_tenant(tenant_id)
                for tenant_id, by in listed_by.items()
                if len(by) > 1
            }
        except Routing as r:
            return r.response
        try:
            limit = min(MAX_PAGE, max(1, int(request.query_params.get("limit", "50"))))
        except ValueError:
            limit = 50  # the cells answered 200, so they read it so too
        items = sorted(
            (
                item
                for cell, page in pages
                for item in page["items"]
                if homes.get(item["tenant_id"], cell) == cell
            ),
            key=lambda i: i["tenant_id"],
        )
        more = len(items) > limit or any(p.get("next_cursor") for _cell, p in pages)
        items = items[:limit]
        doc = {"items": items, "next_cursor": items[-1]["tenant_id"] if more and items else None}
        return Response(json.dumps(doc), 200, media_type="application/json")

    async def _health(self, path: str) -> Response:
        if path == "/healthz":
            return Response(json.dumps({"status": "ok"}), media_type="application/json")
        try:
            cells = await self._cells()
        except Routing as r:
            return r.response
        return Response(
            json.dumps({"status": "ready", "cells": list(cells)}), media_type="application/json"
        )

    async def close(self) -> None:
        await self.client.aclose()


async def _naming_the_cell(answer: httpx.Response, cell: str) -> Response:
    """A cell's own 502 / 503 / 504 (its database down, a tenant being moved)
    with the cell named: `cell` added to its problem document, and a 503
    keeps or gets Retry-After. Other bodies pass unchanged."""
    try:
        body = await answer.aread()  # decoded: content-encoding is dropped below
    finally:
        await answer.aclose()
    headers = {
        k: v
        for k, v in answer.headers.items()
        if k.lower() not in HOP_BY_HOP and k.lower() not in ("content-length", "content-encoding")
    }
    if answer.status_code == 503:
        headers.setdefault("retry-after", "1")
    kind = answer.headers.get("content-type", "")
    doc = None
    if kind.startswith(MEDIA_TYPE) or kind.startswith("application/json"):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
    if isinstance(doc, dict):
        doc.setdefault("cell", cell)
        body = json.dumps(doc).encode()
    return Response(body, answer.status_code, headers=headers)


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _replayable(request: Request) -> bool:
    """Whether the body is small enough to keep for sending again: a declared
    length up to 1 MiB, or no body at all. A longer or chunked one is
    streamed through, and a 421 for it goes back to the client."""
    length = request.headers.get("content-length")
    if length is None:
        return "transfer-encoding" not in request.headers
    return length.isdigit() and int(length) <= MAX_KEPT_BODY


async def _read_whole(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_KEPT_BODY:
            raise Routing(problem(413, "PAYLOAD_TOO_LARGE", "the body is over 1 MiB"))
        chunks.append(chunk)
    return b"".join(chunks)


METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_app(directory: Directory, operator_key: str, mover: Mover | None = None) -> Starlette:
    """`mover`: the move protocol (POST / GET /v1/tenants/{id}/move are the
    router's own); without it those requests go to the tenant's cell."""
    moves = Moves(mover, directory) if mover is not None else None
    router = Router(directory, operator_key, moves=moves)
    app = Starlette(
        routes=[
            Route("/{path:path}", router.handle, methods=METHODS),
        ]
    )
    app.state.router = router
    return app
