"""A database connection the network lost without a word (its packets
dropped, no RST: a partition) ends in an error the services' reconnect
policy mends, instead of hanging until the kernel gives up (about 15 min of
TCP retransmissions): cronwheel.store.db.LINK_LIMITS, on every connection
the services' loops open (`connect`, `Reconnecting`). The cut is the fault
harness's (tests/faults/netcut.py): the child process's packets to
PostgreSQL's port are dropped while everything else keeps talking to it."""

from __future__ import annotations

import select
import subprocess
import time
from urllib.parse import urlsplit

import pytest

from tests.faults import netcut
from tests.support.procs import PYTHON, ROOT

pytestmark = pytest.mark.integration

ANSWER_S = 60  # far past LINK_LIMITS' 10 s, far short of the kernel's 15 min

# The child: a connection made as the services make theirs, a first query
# answered, then (once told) a second one sent into the cut.
CHILD = """
import logging, sys, time
from cronwheel.store import db
how, dsn = sys.argv[1], sys.argv[2]
conn = db.connect(dsn) if how == "connect" else db.Reconnecting(dsn, logging.getLogger()).connection()
conn.execute("SELECT 1")
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
try:
    conn.execute("SELECT 1")
    print("answered", flush=True)
except db.LOST as exc:
    print(f"lost {type(exc).__name__} after {time.monotonic() - t0:.1f} s", flush=True)
"""


def _line(child: subprocess.Popen, timeout: float) -> str:
    """The child's next line, or '' if none came within `timeout`."""
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    return child.stdout.readline().strip() if ready else ""


@pytest.mark.parametrize("how", ["connect", "reconnecting"])
def test_db_link__cut_off_while_a_query_waits__the_query_fails_as_lost(database_url, how):
    if why := netcut.available():
        pytest.skip(why)
    with subprocess.Popen(
        [PYTHON, "-c", CHILD, how, database_url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert _line(child, 30) == "ready"
            with netcut.Cut(child.pid, urlsplit(database_url).port) as cut:
                child.stdin.write("go\n")
                child.stdin.flush()
                t0 = time.monotonic()
                got = _line(child, ANSWER_S)
                waited = time.monotonic() - t0
                dropped = cut.dropped()
        finally:
            child.kill()
    assert dropped > 0, "no packet of the child to PostgreSQL was dropped"
    assert got.startswith("lost OperationalError"), (
        f"after {waited:.0f} s of the cut the query had {got or 'no answer'}"
    )
