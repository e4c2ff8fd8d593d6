"""The timer's settings, each default written here once (docs/settings.md);
`cronwheel serve timer` reads them (main.py) and TimerService's defaults are
these."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel.config import Common, Firing, Metrics, group, setting
from cronwheel.store import pending


@dataclass(frozen=True)
class TimerSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    firing: Firing = group(Firing)
    batch: int = setting("CRONWHEEL_TIMER_BATCH", 500, minimum=1)
    # > 0: a critical-first batch of that size (docs/priority.md); 0: off.
    critical_batch: int = setting("CRONWHEEL_TIMER_CRITICAL_BATCH", 0, minimum=0)
    # A PENDING run of each class not started this long after its instant (or
    # its last announcement) is announced again; the defaults and why:
    # cronwheel.store.pending, docs/pending-deadline.md.
    pending_deadline_critical_ms: int = setting(
        "CRONWHEEL_PENDING_DEADLINE_CRITICAL_MS", pending.DEADLINES_MS[0], minimum=1
    )
    pending_deadline_high_ms: int = setting(
        "CRONWHEEL_PENDING_DEADLINE_HIGH_MS", pending.DEADLINES_MS[1], minimum=1
    )
    pending_deadline_normal_ms: int = setting(
        "CRONWHEEL_PENDING_DEADLINE_NORMAL_MS", pending.DEADLINES_MS[2], minimum=1
    )
    pending_deadline_low_ms: int = setting(
        "CRONWHEEL_PENDING_DEADLINE_LOW_MS", pending.DEADLINES_MS[3], minimum=1
    )
    # How often each partition's PENDING runs are checked against it.
    pending_sweep_ms: int = setting("CRONWHEEL_PENDING_SWEEP_MS", pending.SWEEP_MS, minimum=100)

    @property
    def pending_deadlines_ms(self) -> tuple[int, int, int, int]:
        """The deadlines by class rank (critical .. low)."""
        return (
            self.pending_deadline_critical_ms,
            self.pending_deadline_high_ms,
            self.pending_deadline_normal_ms,
            self.pending_deadline_low_ms,
        )
