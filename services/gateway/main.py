"""`cronwheel serve gateway`: the API on CRONWHEEL_HTTP_ADDR (default 127.0.0.1:8080),
one process. Settings: CRONWHEEL_OPERATOR_KEY, CRONWHEEL_RATE_LIMIT (requests per
second per key, default 1000), CRONWHEEL_RATE_BURST (default 2000),
CRONWHEEL_WEBHOOK_ALLOW_CIDRS, CRONWHEEL_GATEWAY_POOL (connections, default 10)."""

from __future__ import annotations

import os

from cronwheel import config
from cronwheel.demo import operator_key
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.gateway.app import create_app
from services.gateway.service import GatewayService


def main() -> None:
    log = setup_logging("gateway")
    host, _, port = config.http_addr().rpartition(":")
    app = create_app(
        config.database_url(),
        Topics.from_env(),
        config.kafka_bootstrap(),
        operator_key(),
        rate_per_s=float(os.environ.get("CRONWHEEL_RATE_LIMIT", "1000")),
        burst=float(os.environ.get("CRONWHEEL_RATE_BURST", "2000")),
        pool_max=int(os.environ.get("CRONWHEEL_GATEWAY_POOL", "10")),
    )
    try:
        service = GatewayService(
            app,
            host.strip("[]") or "127.0.0.1",
            int(port),
            log_level=os.environ.get("CRONWHEEL_LOG_LEVEL", "info").lower(),
        )
        log.info("gateway listening on %s/v1", service.url)
        service.run(stop_on_signals())
    finally:
        app.state.gateway.close()


if __name__ == "__main__":
    main()
