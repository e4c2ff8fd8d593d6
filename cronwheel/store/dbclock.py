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
A round trip longer than `max_rtt_ms` is not a measurement: a query that hung
in a network partition for 12 s would put the clock 6 s ahead (the fault
harness's pg_partition saw lease expiries and re-announcements fired that
early), so the offset measured before stays.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from cronwheel.core.clock import now_ms, to_ms
from cronwheel.store.sql_loader import queries

Q = queries("clock")


class DbClock:
    """Milliseconds since the epoch by the database's clock (callable, like now_ms)."""

    def __init__(self, local: Callable[[], int] = now_ms, max_rtt_ms: int = 500):
        self.local = local
        self.max_rtt_ms = max_rtt_ms
        self.offset_ms = 0  # database minus local, as last measured

    def __call__(self) -> int:
        return self.local() + self.offset_ms

    def sync(self, conn: psycopg.Connection) -> int:
        """Measure the offset again on `conn` (kept as it was when the round
        trip took longer than max_rtt_ms); returns the offset."""
        before = self.local()
        (db,) = conn.execute(Q["db_now"]).fetchone()
        after = self.local()
        if after - before <= self.max_rtt_ms:
            self.offset_ms = to_ms(db) - (before + after) // 2
        return self.offset_ms
