"""The dispatcher's settings, each default written here once (docs/settings.md);
`cronwheel serve dispatcher` reads them (main.py) and Dispatcher's defaults are
these."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel.config import Common, Metrics, Processed, ProducerRenewal, group, setting


@dataclass(frozen=True)
class DispatcherSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    processed: Processed = group(Processed)
    renewal: ProducerRenewal = group(ProducerRenewal)
    batch: int = setting("CRONWHEEL_DISPATCHER_BATCH", 500, minimum=1)  # records per batch
    # How long a batch waits to fill.
    max_wait_ms: int = setting("CRONWHEEL_DISPATCHER_MAX_WAIT_MS", 5, minimum=0)
    # Batches produced and awaiting their acknowledgements at once; 1 waits for
    # each batch before reading the next.
    in_flight: int = setting("CRONWHEEL_DISPATCHER_IN_FLIGHT", 4, minimum=1)
    # A run-topic partition with no record read for this long is left out of
    # fetches until the relay wakes it (cronwheel.dozing); 0: never.
    doze_after_ms: int = setting("CRONWHEEL_DISPATCHER_DOZE_AFTER_MS", 1_000, minimum=0)
    # A wake keeps its partition awake this long: above the relay's
    # CRONWHEEL_RELAY_WAKE_EVERY_MS plus CRONWHEEL_FIRE_AHEAD_MS, the longest
    # a row the wake announced may take to be published.
    wake_holds_ms: int = setting("CRONWHEEL_DISPATCHER_WAKE_HOLDS_MS", 3_000, minimum=0)
    # A wake for a row that comes later (fired ahead) resumes its dozing
    # partition this long before the row, not as it is read; 0: as it is read.
    resume_ahead_ms: int = setting("CRONWHEEL_DISPATCHER_RESUME_AHEAD_MS", 250, minimum=0)
    # How often dozing partitions are checked for records no wake announced.
    doze_sweep_ms: int = setting("CRONWHEEL_DISPATCHER_DOZE_SWEEP_MS", 15_000, minimum=100)
    # How often the consumer's positions are compared with the broker's ends;
    # one held partition not read for this long, records waiting, means new
    # Kafka clients (cronwheel.fetch_watch); 0: never.
    fetch_watch_s: float = setting("CRONWHEEL_DISPATCHER_FETCH_WATCH_S", 15.0, minimum=0)
