"""`cronwheel serve executor`. Settings: ExecutorSettings (settings.py, docs/settings.md)."""

from __future__ import annotations

import dataclasses

from cronwheel import config, metrics
from cronwheel.consumer import run_restarting
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.executor.sandbox import Policy
from services.executor.service import Executor
from services.executor.settings import ExecutorSettings, SandboxSettings

__all__ = ["ExecutorSettings", "SandboxSettings", "main"]


def main() -> None:
    settings = config.load(ExecutorSettings)
    log = setup_logging("executor", settings.common.log_level)
    metrics.serve("executor", settings.metrics)

    def make() -> Executor:
        # Refuses to start (one line, exit code 1, via the CLI) where it cannot sandbox.
        executor = Executor(
            settings.common.database_url,
            settings.common.kafka_bootstrap,
            Topics(settings.common.topic_prefix),
            policy=Policy(**dataclasses.asdict(settings.sandbox)),
            concurrency=settings.concurrency,
            per_tenant=settings.per_tenant,
            session_timeout_ms=settings.session_timeout_ms,
            shutdown_grace_ms=settings.shutdown_grace_ms,
            fetch_watch_s=settings.fetch_watch_s,
        )
        log.info("executor %s starting; limits by %s", executor.instance, executor.sandbox.mode)
        log.info("runs asking for network: %s", executor.sandbox.network)
        return executor

    # New Kafka clients when librdkafka leaves the consumer stuck (cronwheel.fetch_watch).
    run_restarting(make, stop_on_signals())


if __name__ == "__main__":
    main()
