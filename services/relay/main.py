"""`cronwheel serve relay`."""

from __future__ import annotations

import os

from cronwheel import config, metrics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.relay.service import Relay


def main() -> None:
    log = setup_logging("relay")
    metrics.serve("relay")
    relay = Relay(
        config.database_url(),
        config.kafka_bootstrap(),
        batch=int(os.environ.get("CRONWHEEL_RELAY_BATCH", "5000")),
        lease_ttl_ms=int(os.environ.get("CRONWHEEL_LEASE_TTL_MS", "10000")),
        # Read held rows well before their time: a run fired ahead must be in
        # memory by its instant, whatever the notifications did.
        hold_ms=config.fire_ahead_ms() + 1_000,
    )
    log.info("relay %s starting", relay.leases.owner)
    relay.run(stop_on_signals())


if __name__ == "__main__":
    main()
