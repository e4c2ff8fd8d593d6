"""`cronwheel serve dispatcher`. Settings: DispatcherSettings (docs/settings.md)."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel import config, metrics
from cronwheel.config import Common, Metrics, Processed, group, setting
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.dispatcher.service import Dispatcher


@dataclass(frozen=True)
class DispatcherSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    processed: Processed = group(Processed)
    batch: int = setting("CRONWHEEL_DISPATCHER_BATCH", 500, minimum=1)  # records per batch
    # How long a batch waits to fill.
    max_wait_ms: int = setting("CRONWHEEL_DISPATCHER_MAX_WAIT_MS", 5, minimum=0)
    # Batches produced and awaiting their acknowledgements at once; 1 waits for
    # each batch before reading the next.
    in_flight: int = setting("CRONWHEEL_DISPATCHER_IN_FLIGHT", 4, minimum=1)


def main() -> None:
    settings = config.load(DispatcherSettings)
    log = setup_logging("dispatcher", settings.common.log_level)
    metrics.serve("dispatcher", settings.metrics)
    dispatcher = Dispatcher(
        settings.common.database_url,
        settings.common.kafka_bootstrap,
        Topics(settings.common.topic_prefix),
        batch=settings.batch,
        max_wait_ms=settings.max_wait_ms,
        in_flight=settings.in_flight,
        processed_retention_ms=settings.processed.retention_ms,
    )
    log.info("dispatcher starting (group %s)", dispatcher.group_id)
    dispatcher.run(stop_on_signals())


if __name__ == "__main__":
    main()
