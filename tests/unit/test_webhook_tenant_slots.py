"""Per-tenant delivery slots (limits.TenantSlots and limits.admit) on an asyncio
loop: a tenant holds at most its slots, a waiter holds nothing another tenant
or endpoint needs, and slots go back with the permit."""

from __future__ import annotations

import asyncio

from services.webhook.limits import Endpoints, TenantSlots, admit
from tests.unit.test_webhook_breaker import until

A, B = "ten_a", "ten_b"
SHARED = "http://shared:80"


def test_admit__tenant_at_its_cap_waits__another_tenant_on_the_same_endpoint_goes_at_once():
    async def scenario():
        eps, tenants = Endpoints(per_endpoint=4), TenantSlots(limit=2)
        full: list[str] = []
        tenants.on_full = full.append
        held = [await admit(eps, tenants, SHARED, A) for _ in range(2)]
        waiting = [asyncio.create_task(admit(eps, tenants, SHARED, A)) for _ in range(3)]
        await until(lambda: tenants.waiting() == 3)
        # A's waiters gave their endpoint slots back: B takes the two left at once.
        b = [await asyncio.wait_for(admit(eps, tenants, SHARED, B), 1) for _ in range(2)]
        assert tenants.in_use(A) == 2 and tenants.full() == 2 and eps.waiting() == 0
        assert full == [A], "one call when A's first delivery began to wait"
        for p in b:
            p.release("success")
        held[0].release("success")  # one of A's waiters takes the freed slot
        await until(lambda: sum(w.done() for w in waiting) == 1)
        assert tenants.in_use(A) == 2 and tenants.waiting() == 2
        for p in held[1:]:
            p.release("success")
        released: set[int] = set()  # each waiter's permit released once it has one

        def release_admitted() -> bool:
            for i, w in enumerate(waiting):
                if w.done() and i not in released:
                    w.result().release("success")
                    released.add(i)
            return len(released) == len(waiting)

        await until(release_admitted)
        assert tenants.waiting() == 0 and tenants._slots == {} and eps._eps == {}

    asyncio.run(scenario())


def test_admit__tenant_slot_not_held_while_its_endpoint_breaker_is_open():
    """A's broken endpoint (breaker open) must not take A's slots from its
    deliveries to a healthy endpoint."""

    async def scenario():
        loop = asyncio.get_running_loop()
        eps = Endpoints(per_endpoint=4, failure_threshold=1, cooldown_s=60, clock=loop.time)
        tenants = TenantSlots(limit=1)
        (await admit(eps, tenants, "http://down:80", A)).release("failure")  # opens its breaker
        stuck = [asyncio.create_task(admit(eps, tenants, "http://down:80", A)) for _ in range(3)]
        await until(lambda: eps.waiting() == 3)
        assert tenants.in_use(A) == 0
        healthy = await asyncio.wait_for(admit(eps, tenants, "http://up:80", A), 1)
        assert tenants.in_use(A) == 1
        healthy.release("success")
        for t in stuck:
            t.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        assert tenants._slots == {}

    asyncio.run(scenario())


def test_admit__endpoint_full_when_the_tenant_slot_comes__slot_handed_on_not_held():
    async def scenario():
        eps, tenants = Endpoints(per_endpoint=1), TenantSlots(limit=1)
        a_busy = await admit(eps, tenants, "http://a1:80", A)
        b_on_a2 = await admit(eps, tenants, "http://a2:80", B)  # another tenant fills a2
        to_a2 = asyncio.create_task(admit(eps, tenants, "http://a2:80", A))
        to_a1 = asyncio.create_task(admit(eps, tenants, "http://a1:80", A))
        await until(lambda: tenants.waiting() + eps.waiting() == 2)
        a_busy.release("success")
        # The freed tenant slot may reach the a2 waiter first: a2 is full, so it
        # hands the slot on and waits for a2 holding nothing; a1's waiter proceeds.
        got = await asyncio.wait_for(to_a1, 1)
        assert not to_a2.done() and tenants.in_use(A) == 1
        got.release("success")
        b_on_a2.release("success")
        (await asyncio.wait_for(to_a2, 1)).release("success")
        assert tenants._slots == {} and eps._eps == {}

    asyncio.run(scenario())


def test_admit__cancelled_while_waiting_for_the_tenant__holds_nothing_after():
    async def scenario():
        eps, tenants = Endpoints(per_endpoint=8), TenantSlots(limit=1)
        held = await admit(eps, tenants, SHARED, A)
        waiter = asyncio.create_task(admit(eps, tenants, SHARED, A))
        await until(lambda: tenants.waiting() == 1)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert tenants.waiting() == 0 and tenants.in_use(A) == 1
        held.release("success")
        held.release("success")  # a second release changes nothing
        assert tenants._slots == {} and eps._eps == {}

    asyncio.run(scenario())


def test_tenant_slots__freed_slot_goes_by_class_then_arrival():
    async def scenario():
        tenants = TenantSlots(limit=1)
        assert tenants.try_acquire(A)
        order: list[str] = []

        async def wait(name: str, rank: int):
            await tenants.acquire(A, rank)
            order.append(name)
            tenants.release(A)

        tasks = []
        for name, rank in (("normal", 2), ("low", 3), ("critical", 0)):
            tasks.append(asyncio.create_task(wait(name, rank)))
            want = len(tasks)
            await until(lambda want=want: tenants.waiting() == want)
        tenants.release(A)
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert order == ["critical", "normal", "low"]
        assert tenants._slots == {}

    asyncio.run(scenario())
