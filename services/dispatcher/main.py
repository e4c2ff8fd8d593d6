"""`cronwheel serve dispatcher`.

Settings: CRONWHEEL_DISPATCHER_BATCH (records per batch, 500),
CRONWHEEL_DISPATCHER_MAX_WAIT_MS (how long a batch waits to fill, 5) and
CRONWHEEL_DISPATCHER_IN_FLIGHT (batches produced and awaiting their
acknowledgements at once, 4; 1 waits for each batch before reading the next)."""

from __future__ import annotations

import os

from cronwheel import config, metrics
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.dispatcher.service import Dispatcher


def main() -> None:
    log = setup_logging("dispatcher")
    metrics.serve("dispatcher")
    dispatcher = Dispatcher(
        config.database_url(),
        config.kafka_bootstrap(),
        Topics.from_env(),
        batch=int(os.environ.get("CRONWHEEL_DISPATCHER_BATCH", "500")),
        max_wait_ms=int(os.environ.get("CRONWHEEL_DISPATCHER_MAX_WAIT_MS", "5")),
        in_flight=int(os.environ.get("CRONWHEEL_DISPATCHER_IN_FLIGHT", "4")),
    )
    log.info("dispatcher starting (group %s)", dispatcher.group_id)
    dispatcher.run(stop_on_signals())


if __name__ == "__main__":
    main()
