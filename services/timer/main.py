"""`cronwheel serve timer`. Settings: TimerSettings (settings.py, docs/settings.md)."""

from __future__ import annotations

from cronwheel import config, metrics
from cronwheel.kafka import Topics
from cronwheel.runtime import freeze_heap, setup_logging, stop_on_signals
from services.timer.service import TimerService
from services.timer.settings import TimerSettings


def main() -> None:
    settings = config.load(TimerSettings)
    log = setup_logging("timer", settings.common.log_level)
    metrics.serve("timer", settings.metrics)
    service = TimerService(
        settings.common.database_url,
        Topics(settings.common.topic_prefix),
        batch=settings.batch,
        critical_batch=settings.critical_batch,
        lease_ttl_ms=settings.firing.lease_ttl_ms,
        ahead_ms=settings.firing.fire_ahead_ms,
        pending_deadlines_ms=settings.pending_deadlines_ms,
        pending_sweep_ms=settings.pending_sweep_ms,
    )
    log.info("timer %s starting", service.leases.owner)
    freeze_heap()
    service.run(stop_on_signals())


if __name__ == "__main__":
    main()
