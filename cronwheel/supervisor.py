"""The process supervisor behind `cronwheel dev` and `cronwheel serve A B ...`:
one child process per service, restarted when it dies, and never a reason to
stop the others.

What holds:
- A child that exits while the supervisor is not stopping is started again,
  after a backoff that doubles from `min_backoff_s` to `max_backoff_s` for
  each death that comes soon after its start. A child that ran for `stable_s`
  has its backoff reset. The others keep running throughout.
- Each death is one log line on stderr: the service, how it ended (exit status
  or signal name), its last line on stderr (an abort's assertion, a
  traceback's last line), the restart count and the delay.
- The supervisor's view (pid, state, restarts, last exit of each service) is
  written to `dev.json` in the project home on every change. `cronwheel
  status` shows it while the supervisor that wrote it is alive.
- SIGTERM or SIGINT stops every child: SIGTERM, then SIGKILL after
  `stop_grace_s`.

The gateway's worker processes (`CRONWHEEL_GATEWAY_WORKERS`) are supervised
the same way: the same backoff and the same line on a death, with the
listening socket passed down (`popen`), no state file, and `on_death` to
retire a dead worker's metrics.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STATE_FILE = "dev.json"


@dataclass(frozen=True)
class SupervisorSettings:
    min_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    stable_s: float = 60.0
    stop_grace_s: float = 15.0
    poll_s: float = 0.2


def exit_reason(returncode: int) -> str:
    """'exit status 1', 'killed by SIGABRT', ...: how a child process ended."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass
class Child:
    """One supervised service: its command, its current process, its record."""

    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    state: str = "starting"  # starting | running | restarting | stopped
    restarts: int = 0
    last_exit: str | None = None
    last_exit_at: float | None = None
    started_at: float = 0.0
    start_after: float = 0.0
    backoff_s: float = 0.0
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    pump: threading.Thread | None = None

    def view(self) -> dict:
        return {
            "pid": self.proc.pid if self.proc and self.proc.poll() is None else None,
            "state": self.state,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
            "last_exit_at": self.last_exit_at,
            "started_at": self.started_at or None,
        }


class Supervisor:
    def __init__(
        self,
        commands: dict[str, list[str]],
        state_dir: Path | None,
        settings: SupervisorSettings | None = None,
        *,
        err=None,
        label: str = "cronwheel dev",
        popen: dict | None = None,
        on_death: Callable[[int], None] | None = None,
        log: logging.Logger | None = None,
    ):
        """`state_dir` None: no state file. `popen`: more of subprocess.Popen's
        arguments for every child (env, pass_fds, preexec_fn). `on_death(pid)`:
        called for each child that died, before it is started again. `log`:
        the supervisor's own lines go there (in the service's log format)
        rather than to `err` as they are; the children's lines pass through."""
        self.settings = settings or SupervisorSettings()
        self.children = {name: Child(name, argv) for name, argv in commands.items()}
        self.state_path = state_dir / STATE_FILE if state_dir is not None else None
        self.label = label
        self.popen = popen or {}
        self.on_death = on_death
        self.log = log
        self._err = err or sys.stderr
        self._lock = threading.Lock()  # the children's stderr pumps write through it

    # -- the loop -------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        try:
            for child in self.children.values():
                self._start(child)
            self._say(logging.INFO, f"{self.label}: running {', '.join(self.children)}")
            self._write_state()
            while not stop.wait(self.settings.poll_s):
                changed = False
                now = time.monotonic()
                for child in self.children.values():
                    if child.state == "restarting" and now >= child.start_after:
                        self._start(child)
                        changed = True
                    elif child.proc is not None and child.proc.poll() is not None:
                        self._died(child, now)
                        changed = True
                    elif child.state == "starting" and now - child.started_at >= 1.0:
                        child.state = "running"
                        changed = True
                if changed:
                    self._write_state()
        finally:
            self._stop_all()

    def _start(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            child.argv,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            **self.popen,
        )
        child.started_at = time.monotonic()
        child.state = "starting"
        child.pump = threading.Thread(
            target=self._pump, args=(child, child.proc), daemon=True, name=f"stderr-{child.name}"
        )
        child.pump.start()

    def _pump(self, child: Child, proc: subprocess.Popen) -> None:
        """The child's stderr, passed through line by line; the last lines kept."""
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            child.tail.append(line)
            with self._lock:
                print(line, file=self._err, flush=True)

    def _died(self, child: Child, now: float) -> None:
        proc = child.proc
        assert proc is not None
        rc = proc.returncode
        if child.pump is not None:
            child.pump.join(1.0)  # its last line (EOF, unless a grandchild holds the pipe)
        ran = now - child.started_at
        if ran >= self.settings.stable_s or child.backoff_s == 0:
            child.backoff_s = self.settings.min_backoff_s
        else:
            child.backoff_s = min(child.backoff_s * 2, self.settings.max_backoff_s)
        last = next((line for line in reversed(child.tail) if line.strip()), None)
        child.restarts += 1
        child.last_exit = exit_reason(rc) + (f": {last.strip()}" if last else "")
        child.last_exit_at = time.time()
        child.state = "restarting"
        child.start_after = now + child.backoff_s
        child.proc = None
        if self.on_death is not None:
            self.on_death(proc.pid)
        self._say(
            logging.WARNING,
            f"{self.label}: service {child.name} died after {ran:.1f}s ({child.last_exit}); "
            f"restart {child.restarts} in {child.backoff_s:.1f}s",
        )

    def _stop_all(self) -> None:
        live = [c.proc for c in self.children.values() if c.proc and c.proc.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.stop_grace_s
        for p in live:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for c in self.children.values():
            c.state = "stopped"
        self._write_state()

    # -- what others see ------------------------------------------------------

    def _say(self, level: int, line: str) -> None:
        if self.log is not None:
            self.log.log(level, line)
            return
        with self._lock:
            print(line, file=self._err, flush=True)

    def _write_state(self) -> None:
        if self.state_path is None:
            return
        doc = {
            "supervisor_pid": os.getpid(),
            "updated_at": time.time(),
            "services": {name: c.view() for name, c in self.children.items()},
        }
        tmp = self.state_path.with_suffix(".tmp")
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
        tmp.replace(self.state_path)


def read_state(state_dir: Path) -> dict | None:
    """The running supervisor's view of its services, or None when no
    supervisor is running (no file, or its writer is gone)."""
    from cronwheel.stack.process import pid_alive

    try:
        doc = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not pid_alive(doc.get("supervisor_pid")):
        return None
    return doc
