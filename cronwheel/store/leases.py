"""Partition leases, fenced by epoch.

Each instance of a partitioned service (timer, relay) holds leases on a share of
the 1024 partitions, renews them every third of the TTL, takes expired ones up
to its fair share and releases extras when others join. Writers call
`verify_and_lock` inside their transaction: it returns only the partitions still
owned at the known epoch and holds a share lock, so a takeover (which raises
the epoch) waits for the transaction, and a paused former owner is refused after.

Expiry is judged by one clock, the database's (`clock`, a DbClock measured
again at every tick): an instance whose host clock ran 2 s ahead would read
every live lease with less than 2 s left as expired and take it, and one
behind would write leases that end early by everyone else's clock (the fault
harness's clock_skew and clock_skew_relay; docs/reliability.md). A caller
that keeps time itself (the timer's DbClock, a test's clock) passes `now`.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from cronwheel.core.clock import to_dt
from cronwheel.core.ids import PARTITIONS
from cronwheel.store.dbclock import DbClock
from cronwheel.store.pgarrays import PackedArray, int2_array
from cronwheel.store.sql_loader import queries

Q = queries("leases")
log = logging.getLogger("cronwheel.leases")


@dataclass
class Leases:
    service: str
    ttl_ms: int = 10_000
    owner: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    owned: dict[int, int] = field(default_factory=dict)  # partition -> epoch
    clock: DbClock = field(default_factory=DbClock)  # synced at each tick without `now`
    _seeded: bool = False
    _array_of: dict[int, int] | None = field(default=None, repr=False)
    _array: PackedArray | None = field(default=None, repr=False)

    def owned_array(self) -> PackedArray:
        """The owned partitions as one binary smallint[] parameter, built again
        only when `owned` changes (tick and release_all replace it): through
        psycopg's list dumper 1,024 partitions cost ~1.5 ms a query, and built
        per firing pass they were 15% of a trickle's timer CPU."""
        if self._array_of is not self.owned:
            self._array_of, self._array = self.owned, int2_array(list(self.owned))
        return self._array

    def _params(self, now: int, **extra) -> dict:
        return {
            "service": self.service,
            "owner": self.owner,
            "now": to_dt(now),
            "ttl_s": self.ttl_ms / 1000,
            **extra,
        }

    def tick(
        self,
        conn: psycopg.Connection,
        now: int | None = None,
        *,
        on_release: Callable[[list[int]], None] | None = None,
    ) -> dict[int, int]:
        """Renew, rebalance toward a fair share, and return {partition: epoch} owned.

        `on_release(partitions)` is called before extras are released, inside
        this transaction: a reader finishes with them there, so the instance
        that takes them next starts where it stopped."""
        if now is None:
            self.clock.sync(conn)
            now = self.clock()
        with conn.transaction():
            if not self._seeded:
                conn.execute(Q["seed_partitions"], {"service": self.service})
                self._seeded = True
            conn.execute(Q["announce_member"], self._params(now))
            owned = dict(conn.execute(Q["renew_owned"], self._params(now)).fetchall())
            live = 1 + conn.execute(Q["count_live_owners"], self._params(now)).fetchone()[0]
            share = math.ceil(PARTITIONS / live)
            if len(owned) < share:
                got = conn.execute(
                    Q["acquire_free"], self._params(now, want=share - len(owned))
                ).fetchall()
                owned.update(dict(got))
            elif len(owned) > share:
                extra = sorted(owned)[share:]
                if on_release is not None:
                    on_release(extra)
                conn.execute(Q["release"], self._params(now, partitions=extra))
                for p in extra:
                    owned.pop(p)
        if owned.keys() != self.owned.keys():
            gained = len(owned.keys() - self.owned.keys())
            lost = len(self.owned.keys() - owned.keys())
            log.info(
                "%s %s: %d partitions leased (+%d, -%d; the database's clock %+d ms from ours)",
                self.service, self.owner, len(owned), gained, lost, self.clock.offset_ms,
            )  # fmt: skip
        self.owned = owned
        return owned

    def release_all(self, conn: psycopg.Connection) -> None:
        with conn.transaction():
            now = self.clock()
            conn.execute(Q["release"], self._params(now, partitions=list(self.owned)))
            conn.execute(Q["leave_members"], self._params(now))
        self.owned = {}

    def verify_and_lock(self, conn: psycopg.Connection, partitions: set[int]) -> set[int]:
        """Inside a transaction: which of `partitions` are still ours at our epoch."""
        ps = sorted(p for p in partitions if p in self.owned)
        if not ps:
            return set()
        rows = conn.execute(
            Q["verify_and_lock"],
            {"service": self.service, "owner": self.owner, "partitions": ps},
        ).fetchall()
        return {p for p, epoch in rows if self.owned.get(p) == epoch}
