"""In-order offset commits (the SDK's and the webhook service's): a crash never
skips an unstarted record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cronwheel.core.offsets import OffsetTracker


def test_committable__out_of_order_finish__waits_for_the_earliest():
    t = OffsetTracker()
    for off in (10, 11, 12):
        t.begin("q", 0, off)
    t.finish("q", 0, 12)
    t.finish("q", 0, 11)
    assert t.committable() == {("q", 0): 10}
    t.finish("q", 0, 10)
    assert t.committable() == {("q", 0): 13}
    assert t.committable() == {}


def test_committable__partitions_are_independent():
    t = OffsetTracker()
    t.begin("q", 0, 5)
    t.begin("q", 1, 7)
    t.finish("q", 1, 7)
    assert t.committable() == {("q", 0): 5, ("q", 1): 8}


def test_forget__revoked_partition__dropped():
    t = OffsetTracker()
    t.begin("q", 0, 1)
    t.forget("q", 0)
    assert t.in_flight() == 0 and t.committable() == {}


@given(
    st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=30, unique=True),
    st.randoms(),
)
def test_committable__never_passes_an_unfinished_offset(offsets, rnd):
    t = OffsetTracker()
    begun = sorted(offsets)
    for off in begun:
        t.begin("q", 0, off)
    finished: set[int] = set()
    order = begun[:]
    rnd.shuffle(order)
    for off in order:
        t.finish("q", 0, off)
        finished.add(off)
        for _tp, nxt in t.committable().items():
            assert all(o in finished for o in begun if o < nxt)
    assert t.committable() in ({}, {("q", 0): begun[-1] + 1})
