"""Per-tenant rate limit: a token bucket per tenant, before any database work.

Keyed by `bucket_key(...)`: a tenant's id (every key of one tenant shares its
bucket, so minting keys does not multiply the limit; auth.py knows a key's
tenant from its cache), the operator key's hash, or a client address for its
failed authentications (auth.py, at another rate, through the same table). The
default (1000/s, burst 2000) is generous on purpose: worker traffic (start,
heartbeat, complete) must not be throttled; the limit is there to stop a
runaway client.

One gateway process keeps its buckets in memory (RateLimiter). With several
worker processes on one socket (main.py) a key's requests land on whichever
worker accepted the connection, so per-process buckets would let a key through
at up to N times its limit, and splitting the limit N ways would throttle a
client whose connections all landed on one worker. So the workers share their
buckets instead (SharedRateLimiter): a fixed table in a file the supervisor
creates and every worker maps, read and written under flock. That is two
system calls and a few struct reads per request, microseconds against the
milliseconds a request costs. Separate gateway hosts still keep separate
buckets (docs/api.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class RateLimiter:
    """The buckets of one process, in memory, least recently used keys dropped
    past `max_keys` (a dropped key starts again with a full bucket)."""

    def __init__(
        self,
        rate_per_s: float = 1000.0,
        burst: float = 2000.0,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ):
        _check(rate_per_s, burst)
        self.rate = rate_per_s
        self.burst = burst
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(
        self, key: bytes, *, rate: float | None = None, burst: float | None = None, cost: int = 1
    ) -> float:
        """Take `cost` (1, or 0 to look) tokens for `key`: 0.0 when allowed, else
        seconds until one is due. `rate` and `burst` default to the limiter's;
        a caller that keeps other buckets here passes its own for them."""
        rate, burst = rate or self.rate, burst or self.burst
        now = self.clock()
        with self._lock:
            tokens, last = self._buckets.pop(key, (burst, now))
            tokens, wait = _take(tokens, last, now, rate, burst, cost)
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)  # the least recently used key
        return wait


# The shared table: SLOTS records of (key tag, tokens, last refill), a key's
# record in one of the WAYS slots from its tag's home slot on. A tag is the
# key's first 8 bytes (keys are SHA-256 digests) with the low bit set, so an
# all-zero tag means an empty slot. Two keys with one tag would share a bucket:
# 1 in 2^63, and only stricter.
_RECORD = struct.Struct("<8sdd")
SLOTS = 1 << 16  # 1.5 MiB; at most this many keys have a bucket at once
WAYS = 8


def create_table(path: str) -> None:
    """The empty table at `path` (the supervisor makes it before its workers
    start); every bucket in it starts full."""
    with open(path, "wb") as f:
        f.truncate(SLOTS * _RECORD.size)


class SharedRateLimiter:
    """RateLimiter's buckets in the table file at `path`, shared by every process
    that maps it: the limit holds for a key across all of them. When all WAYS
    slots of a key's group are taken, the least recently used one is reused (that
    key starts again with a full bucket, as RateLimiter drops one)."""

    def __init__(
        self,
        path: str,
        rate_per_s: float = 1000.0,
        burst: float = 2000.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        _check(rate_per_s, burst)
        self.rate = rate_per_s
        self.burst = burst
        self.clock = clock  # CLOCK_MONOTONIC is one clock for every process on the host
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, SLOTS * _RECORD.size)
        self._lock = threading.Lock()  # flock does not exclude threads sharing one fd

    def take(
        self, key: bytes, *, rate: float | None = None, burst: float | None = None, cost: int = 1
    ) -> float:
        """As RateLimiter.take."""
        rate, burst = rate or self.rate, burst or self.burst
        key = key[:8].ljust(8, b"\0")
        tag = bytes([key[0] | 1]) + key[1:]
        home = int.from_bytes(tag, "little") % SLOTS
        now = self.clock()
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                slot, tokens, last = self._find(tag, home, now, burst)
                tokens, wait = _take(tokens, last, now, rate, burst, cost)
                _RECORD.pack_into(self._map, slot * _RECORD.size, tag, tokens, now)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return wait

    def _find(self, tag: bytes, home: int, now: float, burst: float) -> tuple[int, float, float]:
        """(slot, tokens, last refill) of `tag`'s record, or of a slot for it with
        a full bucket."""
        free, oldest, oldest_at = None, home, math.inf
        for i in range(WAYS):
            slot = (home + i) % SLOTS
            got, tokens, last = _RECORD.unpack_from(self._map, slot * _RECORD.size)
            if got == tag:
                return slot, tokens, last
            if got == _EMPTY:
                if free is None:
                    free = slot
            elif last < oldest_at:
                oldest, oldest_at = slot, last
        return (oldest if free is None else free), burst, now

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


_EMPTY = bytes(8)


def _check(rate_per_s: float, burst: float) -> None:
    if rate_per_s <= 0 or burst < 1:
        raise ValueError("rate must be > 0 and burst >= 1")


def _take(
    tokens: float, last: float, now: float, rate: float, burst: float, cost: int = 1
) -> tuple[float, float]:
    """(tokens left, wait): `cost` tokens (1, or 0 to look) taken if there is one
    after refilling since `last`; else the seconds until there is."""
    tokens = min(burst, tokens + max(0.0, now - last) * rate)
    if tokens >= 1:
        return tokens - cost, 0.0
    return tokens, (1 - tokens) / rate


def bucket_key(kind: str, name: str | bytes) -> bytes:
    """The key of a bucket: `kind` ("tenant", "operator", "auth-failures") and a
    name (a tenant id, a key's hash, a client address), hashed so that the
    shared table's 8-byte tags of different kinds never meet."""
    raw = name if isinstance(name, bytes) else name.encode()
    return hashlib.sha256(kind.encode() + b"\0" + raw).digest()


def retry_after(wait_s: float) -> str:
    """Retry-After is whole seconds: round up, at least 1."""
    return str(max(1, math.ceil(wait_s)))
