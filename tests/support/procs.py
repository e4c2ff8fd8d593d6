"""Services as real processes, started the way an operator starts them
(`python -m services.entrypoints serve NAME`), so tests can kill -9, pause and resume
them. Every process a `Launcher` started is stopped when its block ends, even
when the test failed: resumed if paused, SIGTERM, then SIGKILL."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable
# The services log "<name> <instance> starting" once their lease owner id is known.
_STARTING = re.compile(r" (?:timer|relay) ([0-9a-zA-Z_-]+) starting$", re.M)


@dataclass
class ServiceProc:
    """One `cronwheel serve NAME` process, its log file and its lease owner id."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    paused: bool = False
    _owner: str | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def owner(self, timeout: float = 20.0) -> str:
        """The instance id it leases partitions under (read from its start-up log)."""
        if self._owner is None:

            def found():
                if self.proc.poll() is not None:
                    raise AssertionError(f"{self.name} exited early:\n{self.log()}")
                m = _STARTING.search(self.log())
                return m.group(1) if m else None

            self._owner = wait_for(found, timeout, interval=0.05, what=f"{self.name} to start")
        return self._owner

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no finally blocks, no lease release, no producer flush."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for a clean exit; SIGKILL if it does not come."""
        if self.alive():
            if self.paused:
                self.resume()
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


class Launcher:
    """Starts services against one test's database, broker and topic prefix."""

    def __init__(
        self,
        database_url: str,
        kafka_bootstrap: str,
        topic_prefix: str,
        *,
        lease_ttl_ms: int = 2000,
        log_dir: Path,
    ):
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CRONWHEEL_METRICS_PORT", "CRONWHEEL_DEBUG")
        }
        self.env.update(
            DATABASE_URL=database_url,
            KAFKA_BOOTSTRAP=kafka_bootstrap,
            CRONWHEEL_TOPIC_PREFIX=topic_prefix,
            CRONWHEEL_LEASE_TTL_MS=str(lease_ttl_ms),
            PYTHONUNBUFFERED="1",
        )
        self.lease_ttl_ms = lease_ttl_ms
        self.log_dir = log_dir
        self.started: list[ServiceProc] = []

    def start(self, name: str, **env: str) -> ServiceProc:
        """`cronwheel serve NAME`; `env` adds to or overrides the test's settings."""
        path = self.log_dir / f"{name}-{len(self.started)}.log"
        with path.open("wb") as out:
            proc = subprocess.Popen(
                [PYTHON, "-m", "services.entrypoints", "serve", name],
                env={**self.env, **env},
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        svc = ServiceProc(name, proc, path)
        self.started.append(svc)
        return svc

    def close(self) -> None:
        for svc in self.started:
            with contextlib.suppress(Exception):
                svc.stop(timeout=10)

    def print_logs(self, tail: int = 30) -> None:
        """The last lines of every process's log, for a failed test's report."""
        for svc in self.started:
            with contextlib.suppress(OSError):
                lines = svc.log().splitlines()[-tail:]
                print(f"--- {svc.name} pid {svc.pid} rc {svc.proc.returncode}")
                print("\n".join(lines))


@contextlib.contextmanager
def launcher(database_url: str, kafka_bootstrap: str, topic_prefix: str, lease_ttl_ms: int = 2000):
    """A `Launcher` whose processes are all gone when the block ends."""
    with tempfile.TemporaryDirectory(prefix="cw-e2e-") as tmp:
        launch = Launcher(
            database_url,
            kafka_bootstrap,
            topic_prefix,
            lease_ttl_ms=lease_ttl_ms,
            log_dir=Path(tmp),
        )
        try:
            yield launch
        except BaseException:
            launch.close()
            launch.print_logs()
            raise
        finally:
            launch.close()


def wait_ready(base: str, timeout: float = 120.0) -> None:
    """Until the gateway at `base` (started as a process) answers /readyz 200;
    generous, as a loaded machine starts a gateway slowly."""

    def ready() -> bool:
        try:
            return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout=timeout, interval=0.2, what=f"gateway ready at {base}")
