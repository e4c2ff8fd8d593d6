"""Admission: at most `per_endpoint` deliveries at once to one (scheme, host,
port), none while its circuit breaker is open, and at most `tenant_slots` of
one tenant's deliveries at once (`admit`).

A delivery asks here before StartRun, so a run that waits (for a slot, or for
an open breaker to recover) is still PENDING: it holds no lease and burns no
attempt. A slow or failing endpoint only ever holds its own slots, so
deliveries to every other endpoint go on; a tenant whose endpoints all hang
holds at most its own tenant slots, so other tenants' deliveries go on.
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

    def try_acquire(self) -> bool:
        """A slot now, if one is free and nobody waits for it; no waiting."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        return False

    async def acquire(self, rank: int = NORMAL) -> None:
        if self.try_acquire():
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
        self._tenant: tuple[TenantSlots, str] | None = None  # the tenant slot it also holds

    def hold_tenant(self, tenants: TenantSlots, tenant_id: str) -> None:
        """The permit also holds one of the tenant's slots, freed with it."""
        self._tenant = (tenants, tenant_id)

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
        if self._tenant is not None:
            tenants, tenant_id = self._tenant
            tenants.release(tenant_id)


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

    def try_acquire(self, key: str, rank: int = NORMAL) -> Permit | None:
        """A permit now, if the breaker admits and a slot is free with nobody
        waiting for it; else None, at once."""
        ep = self._get(key)
        permit = None
        if ep.breaker.would_admit(self.clock()) and ep.slots.try_acquire():
            before = ep.breaker.state
            admission = ep.breaker.admit(self.clock())
            if admission is None:
                ep.slots.release()
            else:
                ep.busy += 1
                self._changed(key, ep, before)
                permit = Permit(self, key, ep, admission)
        self._forget_if_idle(key, ep)
        return permit

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


class TenantSlots:
    """At most `limit` deliveries of one tenant admitted at once (Slots per
    tenant, made on first use and forgotten once idle, so memory follows the
    tenants with deliveries under way, not every tenant ever seen)."""

    def __init__(self, limit: int = 64, on_full: Callable[[str], None] | None = None):
        self.limit = limit
        self.on_full = on_full  # called when a tenant's first delivery starts waiting
        self._slots: dict[str, Slots] = {}
        self._waiting: dict[str, int] = {}

    def _get(self, tenant_id: str) -> Slots:
        slots = self._slots.get(tenant_id)
        if slots is None:
            slots = self._slots[tenant_id] = Slots(self.limit)
        return slots

    def try_acquire(self, tenant_id: str) -> bool:
        got = self._get(tenant_id).try_acquire()
        self._forget_if_idle(tenant_id)
        return got

    async def acquire(self, tenant_id: str, rank: int = NORMAL) -> None:
        """Wait for one of the tenant's slots; they go by class, then arrival."""
        slots = self._get(tenant_id)
        if slots.try_acquire():
            return
        before = self._waiting.get(tenant_id, 0)
        self._waiting[tenant_id] = before + 1
        if not before and self.on_full is not None:
            self.on_full(tenant_id)
        try:
            await slots.acquire(rank)
        finally:
            left = self._waiting[tenant_id] - 1
            if left:
                self._waiting[tenant_id] = left
            else:
                del self._waiting[tenant_id]
            self._forget_if_idle(tenant_id)

    def release(self, tenant_id: str) -> None:
        self._slots[tenant_id].release()
        self._forget_if_idle(tenant_id)

    def in_use(self, tenant_id: str) -> int:
        slots = self._slots.get(tenant_id)
        return 0 if slots is None else self.limit - slots.free

    def waiting(self) -> int:
        """Deliveries waiting for their tenant's slot, all tenants together."""
        return sum(self._waiting.values())

    def full(self) -> int:
        """Tenants with every slot in use."""
        return sum(1 for slots in self._slots.values() if slots.free == 0)

    def _forget_if_idle(self, tenant_id: str) -> None:
        slots = self._slots.get(tenant_id)
        if slots is not None and slots.free == self.limit and tenant_id not in self._waiting:
            del self._slots[tenant_id]


async def admit(
    endpoints: Endpoints, tenants: TenantSlots, key: str, tenant_id: str, rank: int = NORMAL
) -> Permit:
    """A permit for endpoint `key` that also holds one of the tenant's slots
    (both go back with `Permit.release`).

    It never holds one while waiting for the other. An endpoint slot held while
    waiting for a full tenant would hold back other tenants' deliveries to the
    same endpoint (a shared receiver); a tenant slot held while waiting for an
    endpoint (its breaker open for 30 s) would hold back the tenant's
    deliveries to its healthy endpoints. So it waits for one (the tenant's
    slot first: when both are free that costs no wait at all), takes the other
    only if it is free at once, else gives the first back and waits for the
    other. Each turn waits for a slot someone frees: no spin."""
    while True:
        await tenants.acquire(tenant_id, rank)  # holding no endpoint slot
        permit = endpoints.try_acquire(key, rank)
        if permit is not None:
            break
        tenants.release(tenant_id)
        permit = await endpoints.acquire(key, rank)  # holding no tenant slot
        if tenants.try_acquire(tenant_id):
            break
        permit.release(None)  # no request made: the breaker is not told anything
    permit.hold_tenant(tenants, tenant_id)
    return permit
