"""`cronwheel serve relay`. Settings: RelaySettings (settings.py, docs/settings.md)."""

from __future__ import annotations

import sys

from cronwheel import config, metrics
from cronwheel.consumer import run_restarting
from cronwheel.runtime import setup_logging, stop_on_signals
from services.relay.service import Relay
from services.relay.settings import RelaySettings

SWITCH_INTERVAL_S = 0.001  # sys.setswitchinterval's default is 0.005


def main() -> None:
    settings = config.load(RelaySettings)
    # How long the loop's Python work (a read's records made, a pass's
    # bookkeeping) keeps the interpreter before the releasing thread, waiting
    # for it, is let in: at the default 5 ms, a held row's p99 was that late.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log = setup_logging("relay", settings.common.log_level)
    metrics.serve("relay", settings.metrics)

    def make() -> Relay:
        relay = Relay(
            settings.common.database_url,
            settings.common.kafka_bootstrap,
            batch=settings.batch,
            lease_ttl_ms=settings.firing.lease_ttl_ms,
            wake_every_ms=settings.wake_every_ms,
            delivery_watch_s=settings.delivery_watch_s,
            renewal=settings.renewal,
            # Read held rows well before their time: a run fired ahead must be in
            # memory by its instant, whatever the notifications did.
            hold_ms=settings.firing.fire_ahead_ms + 1_000,
        )
        log.info("relay %s starting", relay.leases.owner)
        return relay

    # A new relay, with a new producer, when librdkafka leaves the producer
    # stuck (cronwheel.fetch_watch).
    run_restarting(make, stop_on_signals())


if __name__ == "__main__":
    main()
