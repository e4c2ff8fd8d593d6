"""`cronwheel serve executor`."""

from __future__ import annotations

import os

from cronwheel import config, metrics
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.executor.service import Executor


def main() -> None:
    log = setup_logging("executor")
    # Refuses to start (one line, exit code 1, via the CLI) where it cannot sandbox.
    executor = Executor(
        config.database_url(),
        config.kafka_bootstrap(),
        Topics.from_env(),
        concurrency=int(os.environ.get("CRONWHEEL_EXECUTOR_CONCURRENCY", "4")),
        per_tenant=int(os.environ.get("CRONWHEEL_EXECUTOR_TENANT_CONCURRENCY", "2")),
        session_timeout_ms=int(os.environ.get("CRONWHEEL_EXECUTOR_SESSION_TIMEOUT_MS", "10000")),
        shutdown_grace_ms=int(os.environ.get("CRONWHEEL_EXECUTOR_SHUTDOWN_GRACE_MS", "10000")),
    )
    metrics.serve("executor")
    log.info("executor %s starting; limits by %s", executor.instance, executor.sandbox.mode)
    executor.run(stop_on_signals())


if __name__ == "__main__":
    main()
