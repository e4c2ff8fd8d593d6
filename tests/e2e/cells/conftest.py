"""One two-cell stack for every test of this package (tests/support/cells.py).

Bringing up two clusters, two brokers, the directory and the services took
58-80 s per module when each module had its own; the package shares one, and
tests/conftest.py's scheduler sends the package to one xdist worker as a whole,
so the stack is made once and torn down after the package's last test.

Each cell runs the services the package's tests want between them, under the
supervisor (`cronwheel serve --cell NAME gateway timer relay dispatcher workflow`), as a
cell runs them: one restarted if it dies (a cell's database stopped under it,
test_outage.py). Every test makes its own tenants, so one test's rows are no
other's; a test that stops a part of the stack (the directory's cluster, a
cell's database, the router) starts it again before it ends.
"""

from __future__ import annotations

import pytest

from tests.support.cells import two_cells

SERVICES = ("gateway", "timer", "relay", "dispatcher", "workflow")


@pytest.fixture(scope="package")
def cells(tmp_path_factory):
    with two_cells(tmp_path_factory.mktemp("cells-logs"), SERVICES) as st:
        yield st
