"""The database's clock, read through this host's.

Leases (partition leases, runs' leases) and due times are written as instants
that every instance compares with its own `now`. Each instance must read the
same clock for those comparisons to agree, so it is the database's: an
instance whose wall clock runs 2 s ahead would otherwise take partitions whose
leases have 2 s left, and fire lease expiries and retries 2 s early.

`DbClock` keeps the offset between this host's clock and the database's,
measured with `sync(conn)` (one round trip: an offset within its error is
none, a larger one is taken so that `now` is never ahead of the database's,
late by at most the round trip), and answers `now` as this host's clock plus
that offset without a query. The timer syncs at every lease tick.
A round trip longer than `max_rtt_ms` is not a measurement: a query that hung
in a network partition for 12 s would put the clock 6 s ahead (the fault
harness's pg_partition saw lease expiries and re-announcements fired that
early), so the offset measured before stays.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from cronwheel.core.clock import now_ms, to_ms
from cronwheel.store.db import link
from cronwheel.store.sql_loader import queries

Q = queries("clock")
log = logging.getLogger("cronwheel.dbclock")


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
            db_ms = to_ms(db)
            # Within the measurement's own error (half the round trip, and a
            # millisecond of truncation) the clocks agree: the host's is kept
            # as it reads. Beyond it, the offset that never reads ahead of the
            # database: its reading was taken before `after` (+1 ms of
            # truncation), so `now` is late by at most the round trip, never
            # early. Taken from the round trip's middle, that error put a
            # relay a millisecond early at a row's time.
            middle = db_ms - (before + after) // 2
            close = abs(middle) <= (after - before) // 2 + 1
            self.offset_ms = 0 if close else db_ms - after - 1
        return self.offset_ms


class ClockSync:
    """Keeps a DbClock synced every `every_s` on a connection of its own, for
    a process whose users of the clock hold no connection to sync on (the
    gateway, whose StartRun due check, leases and retry backoff are instants
    compared with the timer's). `start` syncs once before it returns, so the
    first request already reads the database's clock; a database that is
    away leaves the last offset in place until it answers again."""

    def __init__(self, dsn: str, clock: DbClock, every_s: float = 10.0):
        self.dsn = dsn
        self.clock = clock
        self.every_s = every_s
        self._stop = threading.Event()
        self._conn: psycopg.Connection | None = None
        self._thread = threading.Thread(target=self._run, name="clock-sync", daemon=True)

    def start(self) -> ClockSync:
        self._sync()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self._conn is not None:
            self._conn.close()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sync()

    def _sync(self) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = link(self.dsn)
            self.clock.sync(self._conn)
        except psycopg.Error as exc:
            log.warning("database clock not read (%s); the last offset stands", exc)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
