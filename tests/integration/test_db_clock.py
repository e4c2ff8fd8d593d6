"""Leases are judged by the database's clock (cronwheel.store.dbclock): a timer
whose host clock runs ahead reads the database's time through a DbClock, and
so does not take the partitions another timer holds live (issue 26, clock
skew); so do the leases of every other service, through their own DbClock.
tests/faults/scenarios.py (clock_skew, clock_skew_relay) proves it on running
services."""

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


@pytest.mark.parametrize("skew_ms", [SKEW_MS, -SKEW_MS])
def test_db_clock__host_clock_off__never_reads_ahead_of_the_database(conn, skew_ms):
    """Each reading is taken before the database's, so it may not exceed it:
    the offset is the one that errs late (by the round trip at most), since
    a relay holds a row until its time by this clock and must not publish it
    early. From the round trip's middle it read up to a millisecond ahead."""
    clock = DbClock(local=lambda: now_ms() + skew_ms)
    clock.sync(conn)
    for _ in range(200):
        ours = clock()
        assert ours <= _db_ms(conn)


def test_db_clock__same_host__no_offset(conn):
    """A difference within the measurement's own error is no difference: on
    the database's host (or one kept to it by NTP) the host's clock is read
    as it is."""
    clock = DbClock()
    assert clock.sync(conn) == 0


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


def test_leases__host_clock_ahead__tick_without_now__takes_no_live_lease(conn):
    """Without `now` (the relay, the dispatcher, the webhook service), a tick
    reads the leases' own DbClock, synced in that tick: a host 3 s ahead takes
    nothing the holder keeps live."""
    holder = Leases("relay", ttl_ms=TTL_MS)
    holder.owner = "holder"
    held = holder.tick(conn)
    assert len(held) == 1024
    newcomer = Leases("relay", ttl_ms=TTL_MS, clock=DbClock(local=lambda: now_ms() + SKEW_MS))
    newcomer.owner = "newcomer"

    assert newcomer.tick(conn) == {}
    assert abs(newcomer.clock.offset_ms + SKEW_MS) < 500  # measured in the tick
    rows = conn.execute(
        "SELECT partition_id, owner, epoch FROM partition_leases WHERE service = 'relay'"
    ).fetchall()
    assert {p: (o, e) for p, o, e in rows} == {p: ("holder", e) for p, e in held.items()}


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
