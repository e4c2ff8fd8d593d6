"""The short version of every fault scenario (one fault each), in `make test`;
`make chaos` runs the long ones. All share one private stack (harness.py)."""

from __future__ import annotations

import os

import pytest

from tests.faults.harness import private_stack
from tests.faults.scenarios import FAULTS, KNOWN_FAILURES, NEEDS, SHORT, run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack():
    with private_stack() as st:
        yield st


# pg_immediate's short version failed once in a clean-clone CI run (0de69b8,
# 2026-12-02): after the immediate shutdown and restart the platform had not
# caught up within 120 s, and the cause is not found yet (issue 26). Until it
# is, `make test` leaves it to `make chaos` (which runs its long version) or to
# CRONWHEEL_FAULTS_ALL=1, rather than fail at random.
FLAKY = {"pg_immediate"}


def _marks(name: str, run_all: bool) -> list:
    if name in FLAKY and not run_all:
        return [pytest.mark.skip(reason="not caught up within 120 s once in CI; see FLAKY")]
    if why := NEEDS.get(name, lambda: None)():
        return [pytest.mark.skip(reason=why)]
    if name in KNOWN_FAILURES:  # they fail some of the time: make chaos reports them
        return [pytest.mark.skip(reason=f"known failure: {KNOWN_FAILURES[name]}")]
    return []


def _cases() -> list:
    run_all = os.environ.get("CRONWHEEL_FAULTS_ALL") == "1"
    return [pytest.param(name, marks=_marks(name, run_all)) for name in sorted(FAULTS)]


@pytest.mark.parametrize("name", _cases())
def test_fault__short__nothing_lost_or_doubled(stack, name, tmp_path):
    report = run(stack, name, SHORT[name], tmp_path)
    print(report.line(), *report.notes, *report.problems, sep="\n  ")
    report.assert_clean()
