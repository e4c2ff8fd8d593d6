"""Clock skew for the fault harness: a service process whose wall clock runs
ahead of or behind the host's (and so the database's, which runs on the same
host) by a fixed offset, through libfaketime (Debian: faketime; Makefile:
system-deps). Only CLOCK_REALTIME is shifted (FAKETIME_DONT_FAKE_MONOTONIC):
time.time() and everything built on it lie, the monotonic clock that timeouts
and sleeps use does not, as on a host whose NTP is off by that much.
"""

from __future__ import annotations

import glob
import json
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


def env(offset_s: float) -> dict[str, str]:
    """The environment that runs a process `offset_s` seconds off (+ ahead)."""
    return {
        "LD_PRELOAD": str(library()),
        "FAKETIME": f"{offset_s:+g}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_DONT_RESET": "1",
    }


def measured_offset(offset_s: float) -> float:
    """Seconds by which a process started with env(offset_s) reads the wall
    clock off from this one's (the proof that the preload takes effect)."""
    code = "import json, time\nprint(json.dumps(time.time()))\n"
    before = time.time()
    out = subprocess.run(
        [PYTHON, "-c", code],
        env={**os.environ, **env(offset_s)},
        capture_output=True,
        text=True,
        check=True,
    )
    after = time.time()
    return json.loads(out.stdout) - (before + after) / 2


def preloaded(pid: int) -> bool:
    """libfaketime is mapped into process `pid` (it was started skewed)."""
    return "libfaketime" in Path(f"/proc/{pid}/maps").read_text()
