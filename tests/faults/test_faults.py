"""The short version of every fault scenario (one fault each), in `make test`;
`make chaos` runs the long ones. All share one private stack (harness.py)."""

from __future__ import annotations

import pytest

from tests.faults.harness import private_stack
from tests.faults.scenarios import FAULTS, SHORT, run

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack():
    with private_stack() as st:
        yield st


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault__short__nothing_lost_or_doubled(stack, name, tmp_path):
    report = run(stack, name, SHORT[name], tmp_path)
    print(report.line(), *report.notes, sep="\n  ")
    report.assert_clean()
