"""Reading records back from the real broker in tests."""

from __future__ import annotations

import time
import uuid

from cronwheel import kafka
from cronwheel.core.avro import default_registry


def drain(
    bootstrap: str,
    topic_or_pattern: str,
    want: int,
    timeout: float = 30.0,
    group: str | None = None,
) -> list[tuple]:
    """Consume until `want` records arrived or the deadline passed; returns
    (topic, key, record_name, datum, message) for each. Polls, never sleeps."""
    c = kafka.consumer(group or f"test-{uuid.uuid4().hex[:8]}", bootstrap)
    c.subscribe([topic_or_pattern])
    out: list[tuple] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            name, datum = default_registry().decode(msg.value())
            out.append((msg.topic(), msg.key(), name, datum, msg))
    finally:
        c.close()
    return out
