"""In-order offset commits for a consumer that handles records concurrently.

Shared by the worker SDK and the platform's webhook service, so it lives in the
core: it imports nothing but the standard library, and neither the SDK's
customers nor the services pull the other's code in with it.

A record's offset may be committed only when it and every earlier record of its
partition are done; otherwise a crash could skip a record that was never
started. Records are begun in offset order per partition, so everything below
the smallest offset still in flight is done.
"""

from __future__ import annotations

import threading


class OffsetTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], set[int]] = {}
        self._seen: dict[tuple[str, int], int] = {}  # highest offset begun
        self._committed: dict[tuple[str, int], int] = {}

    def begin(self, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            tp = (topic, partition)
            self._pending.setdefault(tp, set()).add(offset)
            self._seen[tp] = max(offset, self._seen.get(tp, -1))

    def finish(self, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.get((topic, partition), set()).discard(offset)

    def committable(self) -> dict[tuple[str, int], int]:
        """Per partition, the offset to commit (the next one to read) where it moved."""
        out = {}
        with self._lock:
            for tp, seen in self._seen.items():
                pending = self._pending.get(tp)
                nxt = min(pending) if pending else seen + 1
                if nxt > self._committed.get(tp, -1):
                    self._committed[tp] = nxt
                    out[tp] = nxt
        return out

    def forget(self, topic: str, partition: int) -> None:
        """The partition was revoked: its in-flight records will be redelivered."""
        with self._lock:
            for d in (self._pending, self._seen, self._committed):
                d.pop((topic, partition), None)

    def in_flight(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._pending.values())
