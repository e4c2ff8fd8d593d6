"""The pieces of GET /v1/system that need no server: the cache in front of
its figures (one computation per period, however many callers) and the
names of the services that lease partitions."""

from __future__ import annotations

import threading

from cronwheel.store.system import kind_of
from services.gateway.system import Cached


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_cached__computed_once_per_period__again_after_it_or_for_another_key():
    clock = Clock()
    cache = Cached(5.0, clock)
    calls: list[int] = []

    def compute() -> dict:
        calls.append(1)
        return {"n": len(calls)}

    assert cache.get(5, compute) == {"n": 1}
    clock.t += 4.9
    assert cache.get(5, compute) == {"n": 1}
    clock.t += 0.1
    assert cache.get(5, compute) == {"n": 2}
    assert cache.get(15, compute) == {"n": 3}  # another window: not the 5-minute figures


def test_cached__callers_at_once__one_computation():
    cache = Cached(60.0)
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def compute() -> int:
        calls.append(1)
        started.set()
        release.wait(10)
        return 42

    out: list[int] = []
    threads = [threading.Thread(target=lambda: out.append(cache.get(None, compute)))
               for _ in range(4)]  # fmt: skip
    threads[0].start()
    assert started.wait(10)
    for t in threads[1:]:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert out == [42] * 4 and len(calls) == 1


def test_kind_of__timer_relay_and_this_deployments_consumer_groups():
    assert kind_of("timer", "cw") == "timer"
    assert kind_of("relay", "cw") == "relay"
    assert kind_of("cw.dispatcher", "cw") == "dispatcher"
    assert kind_of("other.dispatcher", "cw") is None
    assert kind_of("cw.", "cw") is None
