"""/metrics across several gateway worker processes: prometheus_client's
multiprocess mode. Each worker writes its samples to files in the directory
PROMETHEUS_MULTIPROC_DIR names (set by the supervisor before the worker's
interpreter starts, since prometheus_client reads it on import), and whichever
worker answers a scrape merges every worker's files. Counters and histograms
add up across workers and restarts; gauges come per worker (a `pid` label).
Process metrics (process_cpu_seconds_total, ...) are not available in this
mode. With one process nothing changes.
"""

from __future__ import annotations

import os

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def collect_for_all_workers() -> None:
    """In a worker: make the default registry (what /metrics renders) hold one
    collector that reads every worker's files, instead of this process's own
    families, which would otherwise come out twice. Call it after every metric
    family has been created."""
    if not os.environ.get(MULTIPROC_ENV):
        return
    from prometheus_client import REGISTRY
    from prometheus_client.multiprocess import MultiProcessCollector

    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - no public list
        REGISTRY.unregister(collector)
    MultiProcessCollector(REGISTRY)


def mark_dead(directory: str, pid: int) -> None:
    """A worker exited: drop its live gauges (its counters stay counted)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, directory)
