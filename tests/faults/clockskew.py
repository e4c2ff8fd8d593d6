"""Clock skew for the fault harness: a service process whose wall clock runs
ahead of or behind the host's (and so the database's, which runs on the same
host) by a fixed offset, through libfaketime (Debian: faketime; Makefile:
system-deps). Only CLOCK_REALTIME is shifted (FAKETIME_DONT_FAKE_MONOTONIC):
time.time() and everything built on it lie, the monotonic clock that timeouts
and sleeps use does not, as on a host whose NTP is off by that much.

A process that uses Kafka is skewed in Python instead (`python_env`: the
sitecustomize module in skewed_python/ shifts time.time and time.time_ns):
under libfaketime, librdkafka's timed waits are off by the skew (a producer's
poll(0.1) took 2.1 s in a process 2 s ahead, and returned at once with any
FAKETIME_FORCE_MONOTONIC_FIX in one 2 s behind, libfaketime 0.9.10), which no
real host does. Its C libraries then read the true clock; what the service
decides by (leases, due times, a row's time to publish) is Python's.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from pathlib import Path

from tests.support.procs import PYTHON


def library() -> Path | None:
    """libfaketime's thread-safe build (the services run threads), if installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    return Path(found[0]) if found else None


def available() -> str | None:
    return None if library() else "clock skew needs libfaketime (apt-get install faketime)"


SKEWED_PYTHON = Path(__file__).resolve().parent / "skewed_python"


def env(offset_s: float) -> dict[str, str]:
    """The environment that runs a process `offset_s` seconds off (+ ahead)."""
    return {
        "LD_PRELOAD": str(library()),
        "FAKETIME": f"{offset_s:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


def python_env(offset_s: float) -> dict[str, str]:
    """The environment that runs a Python process `offset_s` seconds off, as
    its Python code reads the clock (see above)."""
    path = os.pathsep.join(p for p in (str(SKEWED_PYTHON), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "CRONWHEEL_FAULT_SKEW_S": f"{offset_s:+g}"}


def offset_of(environment: dict[str, str]) -> float | None:
    """The skew an environment made by env or python_env asks for."""
    for name in ("FAKETIME", "CRONWHEEL_FAULT_SKEW_S"):
        if name in environment:
            return float(environment[name])
    return None


def measured_offset(environment: dict[str, str]) -> float:
    """Seconds by which a process started with `environment` (env or
    python_env) reads the wall clock off from this one's (the proof that the
    skew takes effect). The child reads its clock when asked, once started:
    timed around its start instead, a loaded machine's 2 s interpreter start
    put the read anywhere in a window wider than the skew."""
    code = (
        "import sys, time\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "print(repr(time.time()), flush=True)\n"
    )
    with subprocess.Popen(
        [PYTHON, "-c", code],
        env={**os.environ, **environment},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:  # closes both pipes and waits for the child
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        before = time.time()
        child.stdin.write("now\n")
        child.stdin.flush()
        theirs = float(child.stdout.readline())
        after = time.time()
    return theirs - (before + after) / 2


def skewed(pid: int) -> bool:
    """Process `pid` was started skewed: libfaketime is mapped into it, or the
    skewing sitecustomize module is loaded."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return "libfaketime" in maps or any(e.startswith(b"CRONWHEEL_FAULT_SKEW_S=") for e in environ)
