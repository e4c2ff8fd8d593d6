"""The effect log: one JSON line per thing a run's executor did, written by
whatever executed it (the SDK worker's handler, tests/faults/worker.py; the
webhook receiver, receiver.py; the managed executor's log, read in by
executions.py), never deduplicated, so the checker (harness.py) counts every
re-execution and every doubled effect.

A line: {"run", "attempt", "phase", "at", "pid"}. `phase` is "start" (the
execution began), "effect" (its effect is done) or "not_due" (a StartRun
refused as not due yet); `at` the host's wall clock in ms (the database's
too: same host, never skewed), so the checker can tell a start before the
run's instant; `pid` who executed it (a worker process, "webhook",
"executor"). The log is a local file, not a table: the database is one of
the servers the harness crashes, and an effect log that lost rows with it
would hide the very faults it counts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PHASES = ("start", "effect", "not_due")


def opened(path: str | os.PathLike) -> int:
    """A descriptor appending to the log (O_APPEND: each `append` lands whole)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def line(run: str, attempt: int, phase: str, pid: int | str, at: int | None = None) -> dict:
    """One line; `at` defaults to now."""
    assert phase in PHASES, phase
    at = time.time_ns() // 1_000_000 if at is None else at
    return {"run": run, "attempt": attempt, "phase": phase, "at": at, "pid": pid}


def append(fd: int, lines: Iterable[dict], sync: bool = False) -> None:
    """`lines` in one write, so no other writer's line lands between them."""
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    if data:
        os.write(fd, data)
        if sync:
            os.fsync(fd)


def read(path: Path) -> Iterator[dict]:
    """Every line of the log so far (none if nothing wrote it yet)."""
    if path.exists():
        for text in path.read_text().splitlines():
            yield json.loads(text)
