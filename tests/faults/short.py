"""The short version of every fault scenario (one fault each), for `make test`,
split in two halves that run at once on two private stacks (harness.SLOTS):
the scenarios mostly wait on outages and recoveries, and one after another
they were the suite's longest file (`make chaos` runs the long versions).
`SECOND` keeps the halves near equal in time; test_faults.py and
test_faults_second.py each run one (`half`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults.harness import PrivateStack, private_stack
from tests.faults.scenarios import FAULTS, KNOWN_FAILURES, NEEDS, SHORT, run

# Scenarios make test leaves to `make chaos` (or CRONWHEEL_FAULTS_ALL=1)
# because they fail at random for a cause not yet cured. None now.
# kafka_restart was here until 2026-12-04: after some broker restarts
# librdkafka left every long-lived client of a process stuck (a dispatcher's
# consumer, a relay's and a dispatcher's producers, an SDK worker's consumer
# out of its group), and each is now replaced (cronwheel/fetch_watch.py,
# cronwheel/sdk/watchdog.py; docs/reliability.md). The long version failed
# 2 of 2 that morning before the last of those cures, then passed 6 of 6 (2
# of them beside a spinning core) and its `make chaos` run.
# pg_immediate was here until its cause was found and fixed (the dispatcher
# skipped a lost firing's second announcement: docs/reliability.md): 0 of 18
# runs failed after the fix, 6 of 31 before.
FLAKY: set[str] = set()

# The second half, chosen by the short versions' times on a quiet machine
# (pytest --durations, 2026-12-02: kafka_disk_full 72 s, kafka_restart 44,
# pg_partition 28, clock_skew 26, replay_retention 20; 190 s against the
# first half's 198). A new scenario lands in the first half.
# service_cuts joined the second half on 2026-12-03, when kafka_disk_full had
# become shorter (a filesystem of its own from the stack's start), and
# clock_skew_relay (23 s) on 2026-12-03 when pg_immediate (25 s) came back
# to the first.
SECOND = {
    "clock_skew_relay",
    "kafka_disk_full",
    "kafka_restart",
    "pg_partition",
    "clock_skew",
    "replay_retention",
    "service_cuts",
}


def _marks(name: str, run_all: bool) -> list:
    if name in FLAKY and not run_all:
        return [pytest.mark.skip(reason="not caught up within 120 s once in CI; see FLAKY")]
    if why := NEEDS.get(name, lambda: None)():
        return [pytest.mark.skip(reason=why)]
    if name in KNOWN_FAILURES:  # they fail some of the time: make chaos reports them
        return [pytest.mark.skip(reason=f"known failure: {KNOWN_FAILURES[name]}")]
    return []


def cases(half: int) -> list:
    """pytest params of half 0 or 1, each skipped where it cannot run here."""
    assert not SECOND - set(FAULTS), f"not scenarios: {SECOND - set(FAULTS)}"
    run_all = os.environ.get("CRONWHEEL_FAULTS_ALL") == "1"
    return [
        pytest.param(name, marks=_marks(name, run_all))
        for name in sorted(FAULTS)
        if (name in SECOND) == (half == 1)
    ]


def check(stack: PrivateStack, name: str, tmp_path: Path) -> None:
    """Run scenario `name`'s short version; fail on anything lost or doubled."""
    report = run(stack, name, SHORT[name], tmp_path)
    print(report.line(), *report.notes, *report.problems, sep="\n  ")
    report.assert_clean()


def half(n: int):
    """(the `stack` fixture, the test) of half `n`, for its test module to
    name: the half's scenarios on private stack slot `n`, one module-scoped
    stack for them all."""

    @pytest.fixture(scope="module")
    def stack():
        with private_stack(slot=n) as st:
            yield st

    @pytest.mark.e2e
    @pytest.mark.parametrize("name", cases(n))
    def test_fault__short__nothing_lost_or_doubled(stack, name, tmp_path):
        check(stack, name, tmp_path)

    return stack, test_fault__short__nothing_lost_or_doubled
