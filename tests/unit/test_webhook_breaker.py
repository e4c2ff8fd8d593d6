"""The circuit breaker's states, and per-endpoint admission (limits.py) on an
asyncio loop with a stepped clock."""

from __future__ import annotations

import asyncio

import pytest

from services.webhook.breaker import Admission, Breaker, State
from services.webhook.limits import Endpoints, endpoint_of


def test_breaker__opens_after_threshold_consecutive_failures():
    b = Breaker(threshold=3, cooldown_s=10)
    for _ in range(2):
        assert b.admit(0) == Admission.PASS
        b.failure(0, Admission.PASS)
    b.success(Admission.PASS)  # not consecutive any more
    for _ in range(3):
        b.failure(1, Admission.PASS)
    assert b.state == State.OPEN
    assert b.admit(5) is None and b.wait_s(5) == 6


def test_breaker__half_open_admits_one_probe__success_closes():
    b = Breaker(threshold=1, cooldown_s=10)
    b.failure(0, Admission.PASS)
    assert b.admit(10) == Admission.PROBE
    assert b.state == State.HALF_OPEN
    assert b.admit(10) is None and b.wait_s(10) is None  # wait for the probe's answer
    b.success(Admission.PROBE)
    assert b.state == State.CLOSED and b.admit(10) == Admission.PASS


def test_breaker__probe_failure_reopens_for_another_cooldown():
    b = Breaker(threshold=1, cooldown_s=10)
    b.failure(0, Admission.PASS)
    probe = b.admit(12)
    b.failure(12, probe)
    assert b.state == State.OPEN and b.admit(21) is None and b.admit(22) == Admission.PROBE


def test_breaker__retry_after_longer_than_cooldown_holds_it_open_longer():
    b = Breaker(threshold=1, cooldown_s=10)
    b.failure(0, Admission.PASS, hold_s=60)
    assert b.admit(30) is None and b.admit(60) == Admission.PROBE


def test_breaker__probe_that_made_no_request_hands_over_to_the_next_caller():
    b = Breaker(threshold=1, cooldown_s=1)
    b.failure(0, Admission.PASS)
    probe = b.admit(1)
    assert b.admit(1) is None
    b.release(probe)
    assert b.admit(1) == Admission.PROBE


async def until(check, timeout: float = 2.0) -> None:
    """Let the loop run until `check()` holds (polling with a deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_endpoints__at_most_per_endpoint_at_once__other_endpoints_unaffected():
    async def scenario():
        eps = Endpoints(per_endpoint=2)
        a1 = await eps.acquire("http://a:80")
        a2 = await eps.acquire("http://a:80")
        third = asyncio.create_task(eps.acquire("http://a:80"))
        b1 = await asyncio.wait_for(eps.acquire("http://b:80"), 1)
        await until(lambda: eps.waiting() == 1)
        assert not third.done()
        a1.release("success")
        a3 = await asyncio.wait_for(third, 1)
        for p in (a2, a3, b1):
            p.release("success")
        assert eps._eps == {}  # idle endpoints are forgotten

    asyncio.run(scenario())


def test_endpoints__open_breaker_holds_callers_until_the_probe_succeeds():
    async def scenario():
        loop = asyncio.get_running_loop()
        moves = []
        eps = Endpoints(
            per_endpoint=4, failure_threshold=2, cooldown_s=0.2, clock=loop.time,
            on_change=lambda key, a, b: moves.append((a.value, b.value)),
        )  # fmt: skip
        key = "https://x:443"
        for _ in range(2):
            (await eps.acquire(key)).release("failure")
        opened = loop.time()
        assert eps.state(key) == State.OPEN
        waiters = [asyncio.create_task(eps.acquire(key)) for _ in range(3)]
        await until(lambda: any(w.done() for w in waiters))
        assert loop.time() - opened >= 0.2, "admitted before the cool-down"
        probes = [w for w in waiters if w.done()]
        assert len(probes) == 1 and probes[0].result().probe
        assert eps.state(key) == State.HALF_OPEN and eps.waiting() == 2
        probes[0].result().release("success")
        rest = await asyncio.wait_for(asyncio.gather(*[w for w in waiters if w not in probes]), 1)
        assert [p.probe for p in rest] == [False, False]
        for p in rest:
            p.release("success")
        assert moves == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]

    asyncio.run(scenario())


def test_endpoints__slots_pile_up__freed_slot_goes_by_class_then_arrival__cancelled_skipped():
    """docs/priority.md: when deliveries wait for an endpoint, critical first."""

    async def scenario():
        eps = Endpoints(per_endpoint=1)
        key = "http://a:80"
        held = await eps.acquire(key)
        order: list[str] = []

        async def wait(name: str, rank: int):
            permit = await eps.acquire(key, rank)
            order.append(name)
            return permit

        tasks = {}
        for name, rank in (
            ("normal-1", 2),
            ("low", 3),
            ("gone", 0),
            ("critical", 0),
            ("normal-2", 2),
        ):
            tasks[name] = asyncio.create_task(wait(name, rank))
            want = len(tasks)
            await until(lambda want=want: eps.waiting() == want)
        tasks.pop("gone").cancel()  # e.g. shutdown: its place is skipped, not held
        await until(lambda: eps.waiting() == 4)
        for _ in range(4):
            want = len(order) + 1
            held.release("success")
            await until(lambda want=want: len(order) == want)
            held = tasks[order[-1]].result()
        held.release("success")
        assert order == ["critical", "normal-1", "normal-2", "low"]
        assert eps._eps == {}  # every slot came back

    asyncio.run(scenario())


def test_endpoints__permit_released_twice_counts_once():
    async def scenario():
        eps = Endpoints(per_endpoint=1, failure_threshold=1)
        p = await eps.acquire("http://a:80")
        p.release("success")
        p.release("failure")
        assert eps.state("http://a:80") == State.CLOSED

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("https://Hooks.Example.com/x?y=1", "https://hooks.example.com:443"),
        ("http://example.com/x", "http://example.com:80"),
        ("http://example.com:8080/x", "http://example.com:8080"),
        ("http://[::1]:81/", "http://[::1]:81"),
    ],
)
def test_endpoint_of__scheme_host_port(url, want):
    assert endpoint_of(url) == want
