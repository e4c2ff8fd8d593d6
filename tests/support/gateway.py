"""A gateway app served on a free port, with a client holding a new tenant's key."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from services.gateway.service import GatewayService
from tests.support.running import running


@contextmanager
def tenant_client(app, operator_key: str, name: str = "acme") -> Iterator[httpx.Client]:
    """Serve `app`, create tenant `name` with the operator key, and yield a client
    that authenticates as that tenant; the app's pool is closed afterwards."""
    try:
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
