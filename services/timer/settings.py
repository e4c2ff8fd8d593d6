"""The timer's settings, each default written here once (docs/settings.md);
`cronwheel serve timer` reads them (main.py) and TimerService's defaults are
these."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel.config import Common, Firing, Metrics, group, setting


@dataclass(frozen=True)
class TimerSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    firing: Firing = group(Firing)
    batch: int = setting("CRONWHEEL_TIMER_BATCH", 500, minimum=1)
    # > 0: a critical-first batch of that size (docs/priority.md); 0: off.
    critical_batch: int = setting("CRONWHEEL_TIMER_CRITICAL_BATCH", 0, minimum=0)
