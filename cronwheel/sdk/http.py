"""The SDK's HTTP client: JSON POSTs (and the odd GET) over a few kept-alive HTTP/1.1 connections,
on the standard library's http.client.

Why not httpx, which the SDK used before: a worker posts one small JSON body
per start or complete batch, and at a low rate a batch is one run, so the
client's cost per request is most of the worker's CPU per run. Against a stub
server, httpx cost ~2.4x the client CPU of http.client per POST; in
bench_lifecycle.py at 200 runs/s the two SDK worker processes used 36-37% of
a core between them with httpx (docs/workers.md has the figure after).

Connections are reused last in, first out (the warmest first) up to
`max_connections` at once. A server may close a connection that sat idle
(uvicorn after 5 s): a request that fails on a reused connection before any
answer is sent again once on a new one. Every other failure is an HttpError
for the caller's retry policy (cronwheel.sdk.api).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit


class HttpError(Exception):
    """No answer: the connection could not be made, broke, or timed out."""


class Response:
    __slots__ = ("status_code", "content")

    def __init__(self, status_code: int, content: bytes):
        self.status_code = status_code
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class Client:
    def __init__(
        self, base_url: str, headers: dict[str, str], timeout: float, max_connections: int
    ):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._timeout = timeout
        self._context = ssl.create_default_context() if self._https else None
        self._headers = {"Content-Type": "application/json", **headers}
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)

    def post_json(self, path: str, body: Any) -> Response:
        return self._call("POST", path, json.dumps(body, separators=(",", ":")).encode())

    def get(self, path: str) -> Response:
        return self._call("GET", path, None)

    def _call(self, method: str, path: str, data: bytes | None) -> Response:
        with self._slots:
            conn, reused = self._take()
            while True:
                try:
                    return self._exchange(conn, method, path, data)
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    if not (reused and _closed_while_idle(e)):
                        raise HttpError(f"{method} {path}: {e!r}") from e
                conn, reused = self._new(), False

    def _exchange(
        self, conn: http.client.HTTPConnection, method: str, path: str, data: bytes | None
    ) -> Response:
        # One send() for headers and a bytes body (http.client joins them): no
        # Nagle / delayed-ACK stall between the two.
        conn.request(method, self._prefix + path, body=data, headers=self._headers)
        answer = conn.getresponse()
        content = answer.read()
        if answer.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.append(conn)
        return Response(answer.status, content)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _new(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._context
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _closed_while_idle(e: Exception) -> bool:
    """The server had closed the kept-alive connection before this request."""
    return isinstance(
        e,
        http.client.RemoteDisconnected
        | BrokenPipeError
        | ConnectionResetError
        | http.client.BadStatusLine,
    )
