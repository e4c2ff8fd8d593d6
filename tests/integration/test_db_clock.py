"""Leases are judged by the database's clock (cronwheel.store.dbclock): a timer
whose host clock runs ahead reads the database's time through a DbClock, and
so does not take the partitions another timer holds live (issue 26, clock
skew). tests/faults/scenarios.py (clock_skew) proves it on running services
under libfaketime."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel.core.clock import now_ms, to_ms
from cronwheel.store.dbclock import DbClock
from cronwheel.store.leases import Leases

pytestmark = pytest.mark.integration

SKEW_MS = 3_000  # more than a lease's TTL below: a skewed reading sees it expired
TTL_MS = 2_000


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def _leases(conn: psycopg.Connection) -> dict[int, tuple[str, int]]:
    rows = conn.execute(
        "SELECT partition_id, owner, epoch FROM partition_leases WHERE service = 'timer'"
    ).fetchall()
    return {p: (owner, epoch) for p, owner, epoch in rows}


def _db_ms(conn: psycopg.Connection) -> int:
    return to_ms(conn.execute("SELECT clock_timestamp()").fetchone()[0])


@pytest.mark.parametrize("skew_ms", [SKEW_MS, -SKEW_MS])
def test_db_clock__host_clock_off__reads_the_databases_time(conn, skew_ms):
    clock = DbClock(local=lambda: now_ms() + skew_ms)
    assert abs(clock() - _db_ms(conn)) >= SKEW_MS - 500  # before a sync: the host's

    offset = clock.sync(conn)

    assert abs(offset + skew_ms) < 500  # the skew, measured within the round trip
    assert abs(clock() - _db_ms(conn)) < 500


def test_db_clock__round_trip_too_long__keeps_the_offset_it_had(conn):
    """A sync whose query hung (a partition) measures nothing: its middle is
    seconds off the database's reading, so the offset stays."""
    readings = iter([0, 0, 0, 12_000])  # host clock: a sync at 0, then a 12 s round trip
    base = now_ms()
    clock = DbClock(local=lambda: base + next(readings))
    good = clock.sync(conn)

    assert clock.sync(conn) == good  # not good - 6 s


def test_leases__timer_ahead_on_the_db_clock__takes_no_live_lease(conn):
    holder = Leases("timer", ttl_ms=TTL_MS)
    holder.owner = "holder"
    held = holder.tick(conn, now_ms())
    assert len(held) == 1024  # alone: every partition

    ahead = DbClock(local=lambda: now_ms() + SKEW_MS)
    ahead.sync(conn)
    newcomer = Leases("timer", ttl_ms=TTL_MS)
    newcomer.owner = "newcomer"

    assert newcomer.tick(conn, ahead()) == {}  # the holder's leases are live: none free
    assert _leases(conn) == {p: ("holder", e) for p, e in held.items()}  # same epochs


def test_leases__timer_ahead_on_its_own_clock__takes_live_leases(conn):
    """What the DbClock prevents: the host's clock, 3 s ahead, reads every
    lease with less than 3 s left as expired and takes it at a higher epoch."""
    holder = Leases("timer", ttl_ms=TTL_MS)
    holder.owner = "holder"
    holder.tick(conn, now_ms())
    newcomer = Leases("timer", ttl_ms=TTL_MS)
    newcomer.owner = "newcomer"

    taken = newcomer.tick(conn, now_ms() + SKEW_MS)

    assert taken  # live leases taken from the holder, at a higher epoch
    assert all(_leases(conn)[p] == ("newcomer", e) for p, e in taken.items())
