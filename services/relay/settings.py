"""The relay's settings, each default written here once (docs/settings.md);
`cronwheel serve relay` reads them (main.py) and Relay's defaults are these."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel.config import Common, Firing, Metrics, group, setting


@dataclass(frozen=True)
class RelaySettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    firing: Firing = group(Firing)
    batch: int = setting("CRONWHEEL_RELAY_BATCH", 5000, minimum=1)
