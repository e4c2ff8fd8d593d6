"""`cronwheel serve timer`."""

from __future__ import annotations

import os

from cronwheel import config, metrics
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.timer.service import TimerService


def main() -> None:
    log = setup_logging("timer")
    metrics.serve("timer")
    service = TimerService(
        config.database_url(),
        Topics.from_env(),
        batch=int(os.environ.get("CRONWHEEL_TIMER_BATCH", "500")),
        # > 0: a critical-first batch of that size (docs/priority.md); 0: off.
        critical_batch=int(os.environ.get("CRONWHEEL_TIMER_CRITICAL_BATCH", "0")),
        lease_ttl_ms=int(os.environ.get("CRONWHEEL_LEASE_TTL_MS", "10000")),
        ahead_ms=config.fire_ahead_ms(),
    )
    log.info("timer %s starting", service.leases.owner)
    service.run(stop_on_signals())


if __name__ == "__main__":
    main()
