"""Per-API-key rate limit: a token bucket per key, in process memory.

Keyed by the hash of the presented bearer token, so it applies before any
database work and costs nothing per request beyond a dict lookup. The default
(1000/s, burst 2000) is generous on purpose: worker traffic (start, heartbeat,
complete) must not be throttled; the limit is there to stop a runaway client.
With several gateway instances each keeps its own buckets, so the effective
limit is per instance (documented in docs/api.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    def __init__(
        self,
        rate_per_s: float = 1000.0,
        burst: float = 2000.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ):
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate_per_s
        self.burst = burst
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: bytes) -> float:
        """Take one token for `key`: 0.0 when allowed, else seconds until one is due."""
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1 - tokens) / self.rate
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)  # the least recently used key
        return wait


def retry_after(wait_s: float) -> str:
    """Retry-After is whole seconds: round up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
