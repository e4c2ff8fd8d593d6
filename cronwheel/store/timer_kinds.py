"""Every timer kind beyond `job`, gathered in one place for the firing loop.

A feature that needs time-driven events adds its handler here; the loop in
services/timer does not change for it.
"""

from __future__ import annotations

from cronwheel.kafka import Topics
from cronwheel.store.firing import Handler
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.workflows import Workflows


def timer_handlers(topics: Topics) -> dict[str, Handler]:
    lifecycle = Lifecycle(topics)
    return {
        "lease": lifecycle.on_expiry,
        "timeout": lifecycle.on_expiry,
        "retry": lifecycle.on_retry,
        "workflow": Workflows(topics).on_timers,
    }
