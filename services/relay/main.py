"""`cronwheel serve relay`. Settings: RelaySettings (docs/settings.md)."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel import config, metrics
from cronwheel.config import Common, Firing, Metrics, group, setting
from cronwheel.runtime import setup_logging, stop_on_signals
from services.relay.service import Relay


@dataclass(frozen=True)
class RelaySettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    firing: Firing = group(Firing)
    batch: int = setting("CRONWHEEL_RELAY_BATCH", 5000, minimum=1)


def main() -> None:
    settings = config.load(RelaySettings)
    log = setup_logging("relay", settings.common.log_level)
    metrics.serve("relay", settings.metrics)
    relay = Relay(
        settings.common.database_url,
        settings.common.kafka_bootstrap,
        batch=settings.batch,
        lease_ttl_ms=settings.firing.lease_ttl_ms,
        # Read held rows well before their time: a run fired ahead must be in
        # memory by its instant, whatever the notifications did.
        hold_ms=settings.firing.fire_ahead_ms + 1_000,
    )
    log.info("relay %s starting", relay.leases.owner)
    relay.run(stop_on_signals())


if __name__ == "__main__":
    main()
