"""A gateway app served on a free port, with a client holding a new tenant's key;
a clock the test moves; a queue job's triggered run.

A served app's sessions act as the gateway's role, as in production, whichever
login the test built it with (`database_url`, the platform's, narrows itself to
cronwheel_gateway; `gateway_database_url` is that role's own): checked here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from cronwheel.core.clock import now_ms
from cronwheel.store import roles
from services.gateway.service import GatewayService
from tests.support.running import running


def acts_as_gateway(app) -> None:
    """AssertionError unless the app's pooled sessions act as cronwheel_gateway."""
    pool = app.state.gateway.pool
    conn = pool.getconn()  # not pool.connection(), which some tests count
    try:
        role = conn.execute("SELECT current_user").fetchone()[0]
    finally:
        pool.putconn(conn)
    assert role == roles.GATEWAY, f"the gateway's sessions act as {role}, not {roles.GATEWAY}"


@contextmanager
def served(app) -> Iterator[httpx.Client]:
    """Serve `app` on a free port and yield a client of it; the app's pool is
    closed afterwards."""
    try:
        acts_as_gateway(app)
        with (
            running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc,
            httpx.Client(base_url=svc.url, timeout=10) as c,
        ):
            yield c
    finally:
        app.state.gateway.close()


@contextmanager
def tenant_client(app, operator_key: str, name: str = "acme") -> Iterator[httpx.Client]:
    """Serve `app`, create tenant `name` with the operator key, and yield a client
    that authenticates as that tenant; the app's pool is closed afterwards."""
    try:
        acts_as_gateway(app)
        with (
            running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc,
            httpx.Client(base_url=svc.url, timeout=10) as c,
        ):
            r = c.post(
                "/v1/tenants",
                json={"name": name},
                headers={"Authorization": f"Bearer {operator_key}"},
            )
            c.headers["Authorization"] = f"Bearer {r.json()['api_key']}"
            yield c
    finally:
        app.state.gateway.close()


class ManualClock:
    """The gateway's clock (create_app(clock=...)), moved by the test."""

    def __init__(self) -> None:
        self.now = now_ms()

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def new_run(client: httpx.Client, payload: dict | None = None, **job) -> str:
    """A queue job (retried up to 3 times, 1 s backoff) and the run its trigger made."""
    body = {
        "name": "work",
        "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
        "target": {"type": "queue", "queue": "work"},
        "payload": payload or {"n": 1},
        "retry": {"max_attempts": 3, "initial_backoff_ms": 1000},
        **job,
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return client.post(f"/v1/jobs/{r.json()['job_id']}/trigger").json()["run_id"]
