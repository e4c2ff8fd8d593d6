"""The rebalance storm (issue 26): SDK workers and dispatcher instances
joining and leaving every second for down_s.

Each second one SDK worker process joins the worker's consumer group and,
once more than KEEP are up, the oldest leaves (SIGTERM: it finishes what it
holds and commits, as a worker scaled down does), so the queue topic's
partition changes hands through a group rebalance again and again; and the
same for dispatcher instances, so the 1,024 logical partitions the
dispatchers lease (cronwheel/assignment.py: a leased assignment, no consumer
group) move between instances, each handover settling and committing what it
read. The platform's own worker and dispatcher are the first to leave; the
storm ends with the newest of each running, and the checker then wants one
run per instant, every run ended, each (run, attempt) begun once and each
effect once.

Landed: runs were executed by several of the storm's worker processes (the
effect log's `pid`), and the dispatchers' partition leases were held by
several instances during the storm. The storm lasts down_s and then until it
landed (at most 300 s more): on a loaded machine processes start slowly, and a
group that rebalances on every join may start no run for a long stretch.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import time
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING

from tests.faults import effect_log

if TYPE_CHECKING:
    from tests.faults.harness import Platform, PrivateStack, Report
    from tests.faults.scenarios import Plan

# Each second one process of each kind joins and, once more than KEEP of its
# kind are up, the oldest that is up leaves: each lives about KEEP seconds
# after it came up. A process still starting is not told to leave (on a
# loaded machine starting takes seconds); at most MOST of a kind at once.
KEEP = 2
MOST = 6
EVERY_S = 1.0
DISPATCHER_UP = "partitions leased"  # its first lease renewal took some
HANDOVERS = 3  # of each kind, at the least: processes that came up, then left


def _lease_owners(platform: Platform) -> set[str]:
    """Dispatcher instances holding a live partition lease now."""
    with platform.connect() as conn:
        rows = conn.execute(
            "SELECT DISTINCT owner FROM partition_leases WHERE service = %s"
            " AND owner IS NOT NULL AND expires_at > now()",
            [f"{platform.topic_prefix}.dispatcher"],
        ).fetchall()
    return {owner for (owner,) in rows}


def _executors(platform: Platform, since_ms: int) -> set[int]:
    """Worker processes that began a handler since `since_ms` (wall clock)."""
    pids = set()
    for e in effect_log.read(platform.effect_log):
        if e["phase"] == "start" and e["at"] >= since_ms and "pid" in e:
            pids.add(e["pid"])
    return pids


def _landed(came_up: dict[str, int], ran: set[int], owners: set[str]) -> bool:
    """The storm landed: HANDOVERS processes of each kind came up and left,
    runs were executed by more than one worker process (the queue partition
    moved between them) and the dispatchers' leases were held by more than
    one instance."""
    return min(came_up.values()) >= HANDOVERS and len(ran) >= 2 and len(owners) >= 2


def _longest_pause_s(platform: Platform, since_ms: int) -> float:
    """The longest stretch since `since_ms` in which no run was started: how
    long the rebalances held the worker group still."""
    starts = sorted(
        [since_ms]
        + [
            e["at"]
            for e in effect_log.read(platform.effect_log)
            if e["phase"] == "start" and e["at"] >= since_ms
        ]
    )
    return max((b - a for a, b in itertools.pairwise(starts)), default=0) / 1000


def _reap(leaving: list[subprocess.Popen], timeout: float = 0.0) -> list[subprocess.Popen]:
    """The processes of `leaving` still running `timeout` s from now."""
    deadline = time.monotonic() + timeout
    left = []
    for proc in leaving:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            left.append(proc)
    return left


class _Instance:
    """One process of the storm and the log line that says it is up."""

    def __init__(self, proc: subprocess.Popen, log: Path, up_line: str):
        self.proc, self.log, self.up_line = proc, log, up_line
        self._up = False

    def up(self) -> bool:
        if not self._up:
            with contextlib.suppress(OSError):
                self._up = self.up_line in self.log.read_text(errors="replace")
        return self._up


def storm(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
    topic = platform.worker_topic
    assert platform.worker is not None
    log_dir = platform.launch.log_dir
    pools: dict[str, deque[_Instance]] = {
        "worker": deque([_Instance(platform.worker, log_dir / "worker.log", "consuming")]),
        "dispatcher": deque(
            _Instance(svc.proc, svc.log_path, DISPATCHER_UP)
            for name, svc in platform.services.items()
            if platform.layout[name][0] == "dispatcher"
        ),
    }
    left: list[subprocess.Popen] = []  # every process told to leave
    came_up = {kind: 0 for kind in pools}

    def leave(kind: str, instance: _Instance) -> None:
        pools[kind].remove(instance)
        came_up[kind] += instance.up()
        instance.proc.terminate()  # SIGTERM: finish what it holds, commit, hand over
        left.append(instance.proc)

    def join(kind: str, n: int) -> None:
        if len(pools[kind]) >= MOST:
            return  # the newest have not come up yet: no more processes than this
        if kind == "worker":
            name = f"storm-worker-{n}"
            proc = platform.spawn_worker(topic, name)
            pools[kind].append(_Instance(proc, log_dir / f"{name}.log", "consuming"))
        else:
            name = f"storm-dispatcher-{n}"
            platform.layout[name] = ("dispatcher", {})
            svc = platform.start_service(name)
            pools[kind].append(_Instance(svc.proc, svc.log_path, DISPATCHER_UP))

    owners: set[str] = set()
    ticks = 0
    since_ms = time.time_ns() // 1_000_000
    t0 = time.monotonic()
    try:
        # At least down_s, and until the storm landed: on a loaded machine a
        # process can take longer than down_s to start, and a worker group
        # rebalancing on every join may start nothing for many seconds.
        while time.monotonic() - t0 < plan.down_s or (
            not _landed(came_up, _executors(platform, since_ms), owners)
            and time.monotonic() - t0 < plan.down_s + 300
        ):
            tick = time.monotonic()
            ticks += 1
            for kind in pools:
                join(kind, ticks)
                # The oldest that came up leaves once KEEP others are up.
                ready = [i for i in pools[kind] if i.up()]
                if len(ready) > KEEP:
                    leave(kind, ready[0])
            owners |= _lease_owners(platform)
            time.sleep(max(0.0, tick + EVERY_S - time.monotonic()))
    finally:
        # The newest that came up stays (or the newest); the rest leave.
        for kind, pool in pools.items():
            ready = [i for i in pool if i.up()] or [pool[-1]]
            for instance in [i for i in pool if i is not ready[-1]]:
                leave(kind, instance)
        platform.worker = pools["worker"][0].proc
        for proc in _reap(left, timeout=30):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            report.problems.append(f"process {proc.pid} did not leave within 30 s of SIGTERM")
    # A process told to leave while still starting (before its handler was
    # installed) ends by the signal itself (-15); any other end is a crash.
    exits = Counter(p.returncode for p in left)
    if crashed := {rc: n for rc, n in exits.items() if rc not in (0, -signal.SIGTERM)}:
        report.problems.append(f"processes that left in the storm crashed: {crashed}")
    ran = _executors(platform, since_ms)
    assert min(came_up.values()) >= HANDOVERS, f"processes that came up and left: {came_up}"
    assert len(ran) >= 2, f"runs executed by {len(ran)} worker process(es) during the storm"
    assert len(owners) >= 2, f"dispatcher leases held by {len(owners)} instance(s)"
    report.notes.append(
        f"{ticks} s of storm: {came_up['worker']} workers and {came_up['dispatcher']}"
        f" dispatchers came up and left ({len(left)} processes told to leave);"
        f" runs executed by {len(ran)} worker processes, dispatcher leases held by"
        f" {len(owners)} instances; exit codes of those that left: {dict(exits)};"
        f" longest stretch with no run started: {_longest_pause_s(platform, since_ms):.1f} s"
    )
