"""`cronwheel serve dispatcher`. Settings: DispatcherSettings (settings.py, docs/settings.md)."""

from __future__ import annotations

from cronwheel import config, metrics
from cronwheel.consumer import run_restarting
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.dispatcher.service import CONSUMER, Dispatcher
from services.dispatcher.settings import DispatcherSettings


def main() -> None:
    settings = config.load(DispatcherSettings)
    log = setup_logging("dispatcher", settings.common.log_level)
    metrics.serve("dispatcher", settings.metrics)

    def make() -> Dispatcher:
        return Dispatcher(
            settings.common.database_url,
            settings.common.kafka_bootstrap,
            Topics(settings.common.topic_prefix),
            batch=settings.batch,
            max_wait_ms=settings.max_wait_ms,
            in_flight=settings.in_flight,
            doze_after_ms=settings.doze_after_ms,
            doze_sweep_ms=settings.doze_sweep_ms,
            wake_holds_ms=settings.wake_holds_ms,
            resume_ahead_ms=settings.resume_ahead_ms,
            fetch_watch_s=settings.fetch_watch_s,
            processed_retention_ms=settings.processed.retention_ms,
            renewal=settings.renewal,
        )

    log.info("dispatcher starting (group %s.%s)", settings.common.topic_prefix, CONSUMER)
    # New Kafka clients when librdkafka leaves the consumer stuck (cronwheel.fetch_watch).
    run_restarting(make, stop_on_signals())


if __name__ == "__main__":
    main()
