"""Per-endpoint admission: at most `per_endpoint` deliveries at once to one
(scheme, host, port), and none while its circuit breaker is open.

A delivery asks here before StartRun, so a run that waits (for a slot, or for
an open breaker to recover) is still PENDING: it holds no lease and burns no
attempt. A slow or failing endpoint only ever holds its own slots, so
deliveries to every other endpoint go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from cronwheel.core.runs import PRIORITY_RANK
from services.webhook.breaker import Admission, Breaker, State

NORMAL = PRIORITY_RANK["normal"]

DEFAULT_PORTS = {"http": 80, "https": 443}


def endpoint_of(url: str) -> str:
    """`scheme://host:port`, the unit that limits and breakers apply to."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
    return f"{parts.scheme}://{host}:{port}"


class Slots:
    """A semaphore that hands a freed slot to the waiter of the highest class
    (lowest rank), then the longest waiting: when deliveries pile up at an
    endpoint (or at the service's max_in_flight), critical runs go first
    (docs/priority.md)."""

    def __init__(self, limit: int):
        self.free = limit
        self._waiters: list[tuple[int, int, asyncio.Future]] = []  # heap
        self._seq = itertools.count()

    async def acquire(self, rank: int = NORMAL) -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (rank, next(self._seq), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a slot, then cancelled
                self.release()
            raise  # a cancelled waiter stays in the heap; release() skips it

    @contextlib.asynccontextmanager
    async def held(self, rank: int = NORMAL):
        await self.acquire(rank)
        try:
            yield
        finally:
            self.release()

    def release(self) -> None:
        while self._waiters:
            _rank, _seq, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)  # the slot passes on; `free` stays
                return
        self.free += 1


class _Endpoint:
    def __init__(self, limit: int, breaker: Breaker):
        self.slots = Slots(limit)
        self.limit = limit
        self.breaker = breaker
        self.busy = 0
        self.waiting = 0
        self.changed = asyncio.Event()

    def notify(self) -> None:
        """Wake every caller waiting on the breaker (they check it again)."""
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    @property
    def idle(self) -> bool:
        b = self.breaker
        return self.busy == 0 and self.waiting == 0 and b.state == State.CLOSED and not b.failures


class Permit:
    """One admitted delivery to one endpoint; `release` exactly once."""

    def __init__(self, endpoints: Endpoints, key: str, ep: _Endpoint, admission: Admission):
        self._endpoints = endpoints
        self.key = key
        self._ep = ep
        self.admission = admission
        self._released = False

    @property
    def probe(self) -> bool:
        return self.admission == Admission.PROBE

    def release(self, result: str | None, hold_s: float = 0.0) -> None:
        """`result`: "success" or "neutral" (the endpoint answered), "failure", or
        None when no request was made."""
        if self._released:
            return
        self._released = True
        self._endpoints._release(self, self._ep, result, hold_s)


class Endpoints:
    def __init__(
        self,
        per_endpoint: int = 16,
        failure_threshold: int = 5,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, State, State], None] | None = None,
    ):
        self.per_endpoint = per_endpoint
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.on_change = on_change
        self._eps: dict[str, _Endpoint] = {}

    def _get(self, key: str) -> _Endpoint:
        ep = self._eps.get(key)
        if ep is None:
            ep = self._eps[key] = _Endpoint(
                self.per_endpoint, Breaker(self.failure_threshold, self.cooldown_s)
            )
        return ep

    def state(self, key: str) -> State:
        ep = self._eps.get(key)
        return ep.breaker.state if ep else State.CLOSED

    def waiting(self) -> int:
        return sum(ep.waiting for ep in self._eps.values())

    def open_count(self) -> int:
        return sum(1 for ep in self._eps.values() if ep.breaker.state != State.CLOSED)

    async def acquire(self, key: str, rank: int = NORMAL) -> Permit:
        """Wait until the breaker admits this delivery and a slot is free; slots
        go by class (`rank`, 0 critical), then arrival."""
        ep = self._get(key)
        ep.waiting += 1
        try:
            while True:
                if ep.breaker.would_admit(self.clock()):
                    await ep.slots.acquire(rank)
                    before = ep.breaker.state
                    admission = ep.breaker.admit(self.clock())
                    if admission is not None:
                        ep.busy += 1
                        self._changed(key, ep, before)
                        return Permit(self, key, ep, admission)
                    ep.slots.release()
                    continue
                changed = ep.changed
                wait = ep.breaker.wait_s(self.clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), wait)
        finally:
            ep.waiting -= 1
            self._forget_if_idle(key, ep)

    def _release(self, permit: Permit, ep: _Endpoint, result: str | None, hold_s: float) -> None:
        before = ep.breaker.state
        if result in ("success", "neutral"):
            ep.breaker.success(permit.admission)
        elif result == "failure":
            ep.breaker.failure(self.clock(), permit.admission, hold_s)
        else:
            ep.breaker.release(permit.admission)
        ep.busy -= 1
        ep.slots.release()
        if permit.probe or ep.breaker.state != before:
            ep.notify()
        self._changed(permit.key, ep, before)
        self._forget_if_idle(permit.key, ep)

    def _changed(self, key: str, ep: _Endpoint, before: State) -> None:
        if self.on_change is not None and ep.breaker.state != before:
            self.on_change(key, before, ep.breaker.state)

    def _forget_if_idle(self, key: str, ep: _Endpoint) -> None:
        if ep.idle and self._eps.get(key) is ep:
            del self._eps[key]
