"""Each service cut off from each server it talks to, in turn (issue 26:
"network partitions between each service and PostgreSQL, and each service
and Kafka"): the scenario `service_cuts`. pg_partition (a timer and
PostgreSQL) and kafka_partition (the relay and the broker) are scenarios of
their own, with their own proof of what the cut did; this one covers the
other pairs, one after another, in one platform run:

- the gateway and PostgreSQL: API and worker-protocol calls cannot commit;
- the dispatcher and the broker: run records wait on their run topics;
- the dispatcher and PostgreSQL: its leases and `processed` rows;
- the relay and PostgreSQL: the outbox is not read;
- the SDK worker and the broker: its queue topic is not read;
- the SDK worker and the gateway: its start, heartbeat and complete calls
  hang, so a run it holds outlives its lease (5 s) when the cut is longer, is
  retried, and its effect may be written twice: counted as duplicate
  effects, allowed (OUTLASTS_LEASES), never as a second run.

Each cut (tests/faults/netcut.py) drops the process's packets to the
server's port for down_s; the other processes keep talking to it. Landed:
packets of the cut process were dropped, and the process was alive at the
end of the cut (a partition, not a crash); for the gateway, an API call
made during the cut got no answer but 503 (or none) in its 5 s. Between
cuts the platform catches up (harness.wait_recovered), so each cut starts
from a settled platform; the checker then proves nothing lost or doubled.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx

from tests.faults import netcut
from tests.faults.harness import wait_recovered

if TYPE_CHECKING:
    from tests.faults.harness import Platform, PrivateStack, Report
    from tests.faults.scenarios import Plan

# (process, server) pairs, in the order cut.
PAIRS = (
    ("gateway", "pg"),
    ("dispatcher", "kafka"),
    ("dispatcher", "pg"),
    ("relay", "pg"),
    ("worker", "kafka"),
    ("worker", "gateway"),
)


def _port(stack: PrivateStack, platform: Platform, server: str) -> int:
    if server == "gateway":
        return int(platform.base.rsplit(":", 1)[1])
    return stack.ports[{"pg": "CRONWHEEL_PG_PORT", "kafka": "CRONWHEEL_KAFKA_PORT"}[server]]


def _pid(platform: Platform, process: str) -> int:
    if process == "worker":
        assert platform.worker is not None and platform.worker.poll() is None
        return platform.worker.pid
    return platform.services[process].pid


def _alive(platform: Platform, process: str) -> bool:
    if process == "worker":
        return platform.worker is not None and platform.worker.poll() is None
    return platform.services[process].alive()


def _api_refused(platform: Platform) -> str:
    """A tenant call during the gateway's cut from PostgreSQL: what it got."""
    try:
        got = httpx.get(
            f"{platform.base}/v1/jobs",
            headers={"Authorization": f"Bearer {platform.api_key}"},
            timeout=5,
        )
    except httpx.TimeoutException:
        return "no answer in 5 s"
    assert got.status_code == 503, f"the gateway answered {got.status_code} while cut off"
    return "503"


def service_cuts(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
    for i, (process, server) in enumerate(PAIRS):
        if i:
            report.recover_s.append(wait_recovered(platform))
        pid = _pid(platform, process)
        with netcut.Cut(pid, _port(stack, platform, server)) as cut:
            t0 = time.monotonic()
            seen = _api_refused(platform) if (process, server) == ("gateway", "pg") else ""
            time.sleep(max(0.0, plan.down_s - (time.monotonic() - t0)))  # the partition itself
            dropped = cut.dropped()
            alive = _alive(platform, process)
        assert dropped > 0, f"no packet of the {process} to the {server} was dropped"
        assert alive, f"the {process} died while cut off from the {server}"
        report.notes.append(
            f"{process} cut from {server} for {plan.down_s} s: {dropped} packets dropped"
            + (f"; an API call got {seen}" if seen else "")
        )
