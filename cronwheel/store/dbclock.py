"""The database's clock, read through this host's.

Leases (partition leases, runs' leases) and due times are written as instants
that every instance compares with its own `now`. Each instance must read the
same clock for those comparisons to agree, so it is the database's: an
instance whose wall clock runs 2 s ahead would otherwise take partitions whose
leases have 2 s left, and fire lease expiries and retries 2 s early.

`DbClock` keeps the offset between this host's clock and the database's,
measured with `sync(conn)` (one round trip, the offset taken at its middle, so
it is off by at most half the round trip), and answers `now` as this host's
clock plus that offset without a query. The timer syncs at every lease tick.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from cronwheel.core.clock import now_ms, to_ms
from cronwheel.store.sql_loader import queries

Q = queries("clock")


class DbClock:
    """Milliseconds since the epoch by the database's clock (callable, like now_ms)."""

    def __init__(self, local: Callable[[], int] = now_ms):
        self.local = local
        self.offset_ms = 0  # database minus local, as last measured

    def __call__(self) -> int:
        return self.local() + self.offset_ms

    def sync(self, conn: psycopg.Connection) -> int:
        """Measure the offset again on `conn`; returns it."""
        before = self.local()
        (db,) = conn.execute(Q["db_now"]).fetchone()
        after = self.local()
        self.offset_ms = to_ms(db) - (before + after) // 2
        return self.offset_ms
