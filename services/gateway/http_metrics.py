"""Request counts and latencies per route template (never per raw path, which
would make one time series per job id), as plain ASGI middleware."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram

from cronwheel.metrics import LabelledOnce

REQUESTS = Counter(
    "cronwheel_http_requests_total", "HTTP requests answered", ["method", "route", "status"]
)
LATENCY = Histogram(
    "cronwheel_http_request_seconds",
    "From request to the start of the response",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


class HttpMetrics:
    def __init__(self, app):
        self.app = app
        self._children = LabelledOnce(
            lambda method, template, status: (
                LATENCY.labels(method, template),
                REQUESTS.labels(method, template, str(status)),
            )
        )

    def _observe(self, method: str, template: str, status: int, seconds: float) -> None:
        latency, requests = self._children(method, template, status)
        latency.observe(seconds)
        requests.inc()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_and_observe(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                self._observe(scope["method"], template, status[0], time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, send_and_observe)
