"""One mover per move (services/router/move_lease.py, directory migration
0003; docs/cells.md "One mover per move"): routers that resume the same open
move at once advance it one at a time, under the move's lease in the
directory. Two cells' databases and a directory on the test server, as
tests/integration/test_tenant_move.py sets them up (its Cells)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest

from cronwheel.directory import Directory
from cronwheel.kafka import Topics
from cronwheel.store import moves as cellstore
from services.router.move_lease import LeaseLost, MoveLease
from services.router.moves import LeasedMover, Moves
from tests.integration.test_tenant_move import Cells
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

STEPS = ("copy", "freeze", "catch_up", "activate", "remove")  # the cells' side of each step


@pytest.fixture
def two(servers, db_template):
    cells = Cells(servers.database_url, db_template)
    yield cells
    cells.close()


@pytest.fixture
def steps(monkeypatch):
    """How often each of the cells' step functions ran, and when it first did
    (the real functions, counted)."""
    calls: Counter[str] = Counter()
    first: dict[str, float] = {}
    lock = threading.Lock()
    for name in STEPS:
        real = getattr(cellstore, name)

        def counted(*args, _real=real, _name=name, **kw):
            with lock:
                calls[_name] += 1
                first.setdefault(_name, time.time())
            return _real(*args, **kw)

        monkeypatch.setattr(cellstore, name, counted)
    return calls, first


def _moved(two: Cells, topics: Topics) -> tuple[str, str]:
    """A tenant of us with a job (no instant during the test), its move to eu recorded."""
    tenant = two.tenant(topics, "us")
    two.job(topics, "us", tenant, 86_400_000)
    return tenant["tenant_id"], two.mover().start(tenant["tenant_id"], "eu").move_id


def _router(two: Cells, owner: str, ttl_s: float = 3.0) -> Moves:
    return Moves(two.mover(), Directory(two.directory), owner=owner, lease_ttl_s=ttl_s)


def _final(two: Cells, move_id: str):
    move = two.mover().get(move_id)
    return move if move.state in ("done", "failed", "rolled_back") else None


def test_two_routers_resume_one_move_at_once__it_completes_once__rows_copied_once(
    two, topic_prefix, steps
):
    calls, _ = steps
    tid, move_id = _moved(two, Topics(topic_prefix))
    routers = [_router(two, f"router-{i}") for i in range(2)]
    go = threading.Barrier(2)

    def resume(router: Moves) -> None:
        go.wait()
        router.resume()

    racers = [threading.Thread(target=resume, args=(r,)) for r in routers]
    for t in racers:
        t.start()
    for t in racers:
        t.join(10)
    move = wait_for(lambda: _final(two, move_id), 60, 0.1, "the move to end")
    for router in routers:
        router.close()
    assert move.state == "done", move.error
    # Each step ran once across both routers: the rows were copied once.
    assert dict(calls) == dict.fromkeys(STEPS, 1)
    rows = two.rows("eu", tid)
    assert (rows["tenants"], rows["jobs"], rows["timers"]) == (1, 1, 1)
    assert set(two.rows("us", tid).values()) == {0}
    holder = MoveLease(two.directory, move_id, "anyone").holder()
    assert holder is not None and holder.owner is None  # released at the end


def test_a_dead_router_s_lease__the_waiting_router_takes_the_move_once_it_expires(
    two, topic_prefix, steps
):
    calls, first = steps
    _, move_id = _moved(two, Topics(topic_prefix))
    dead = MoveLease(two.directory, move_id, "dead-router", ttl_s=2.0)
    assert dead.acquire()  # ... and never renews: it died
    router = _router(two, "alive")
    router.resume()
    try:
        move = wait_for(lambda: _final(two, move_id), 60, 0.1, "the move to end")
    finally:
        router.close()
    assert move.state == "done", move.error
    assert dict(calls) == dict.fromkeys(STEPS, 1)
    # Nothing of the move ran before the dead router's lease ran out.
    assert first["copy"] >= dead.held.expires_at.timestamp()
    holder = MoveLease(two.directory, move_id, "anyone").holder()
    assert holder.epoch == dead.held.epoch + 1  # one change of owner: dead -> alive


def test_lease_lost_mid_move__the_old_holder_stops_before_its_next_step(two, topic_prefix):
    _, move_id = _moved(two, Topics(topic_prefix))
    mine = MoveLease(two.directory, move_id, "paused-router", ttl_s=60)
    assert mine.acquire()
    mover = LeasedMover(two.mover(), mine)
    assert mover.advance(move_id).state == "freezing"  # the copy, under the lease
    # The router is paused past its lease (made to have run out here) and
    # another takes the move over.
    with psycopg.connect(two.directory_admin, autocommit=True) as conn:
        conn.execute(
            "UPDATE directory_move_leases SET expires_at = now() - interval '1 second'"
            " WHERE move_id = %s",
            [move_id],
        )
    other = MoveLease(two.directory, move_id, "other-router")
    assert other.acquire() and other.held.epoch == mine.held.epoch + 1
    assert not mine.renew()  # the old holder's renewal changes nothing
    with pytest.raises(LeaseLost):
        mover.advance(move_id)
    assert two.mover().get(move_id).state == "freezing"  # no step taken by the old holder
    assert MoveLease(two.directory, move_id, "x").holder().owner == "other-router"
    done = LeasedMover(two.mover(), other).run(move_id)
    assert done.state == "done", done.error
