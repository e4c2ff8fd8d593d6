"""The relay's settings, each default written here once (docs/settings.md);
`cronwheel serve relay` reads them (main.py) and Relay's defaults are these."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel.config import Common, Firing, Metrics, ProducerRenewal, group, setting


@dataclass(frozen=True)
class RelaySettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    firing: Firing = group(Firing)
    renewal: ProducerRenewal = group(ProducerRenewal)
    batch: int = setting("CRONWHEEL_RELAY_BATCH", 5000, minimum=1)
    # A run topic gets a wake (cronwheel.dozing) when a row for it comes after
    # this long without one; keep it, plus CRONWHEEL_FIRE_AHEAD_MS, below the
    # dispatcher's CRONWHEEL_DISPATCHER_WAKE_HOLDS_MS, so every row's record
    # is published while the wake that announced it still holds.
    wake_every_ms: int = setting("CRONWHEEL_RELAY_WAKE_EVERY_MS", 500, minimum=1)
    # A producer that held records and reported no delivery for this long
    # while the broker answers a new client: a new relay (cronwheel.fetch_watch).
    delivery_watch_s: float = setting("CRONWHEEL_RELAY_DELIVERY_WATCH_S", 15.0, minimum=0)
