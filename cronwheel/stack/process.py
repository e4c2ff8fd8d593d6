"""Small process helpers shared by the local PostgreSQL and Kafka managers."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


class StackError(RuntimeError):
    """A prerequisite is missing or a server would not start; the message is one line."""


def require_command(name: str, hint: str) -> str:
    path = shutil.which(name)
    if not path:
        raise StackError(f"{name} not found on PATH: {hint}")
    return path


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop_pid(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`: `down` must leave no process behind."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while pid_alive(pid):
        time.sleep(0.05)


def wait_until(check, timeout: float, what: str, on_fail=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    detail = on_fail() if on_fail else ""
    raise StackError(f"{what} did not come up within {timeout:.0f}s{detail}")


def is_root() -> bool:
    return os.geteuid() == 0


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """Prefix `argv` to run as `user` (PostgreSQL refuses to run as root)."""
    if not user:
        return argv
    runuser = shutil.which("runuser") or shutil.which("su")
    if runuser and runuser.endswith("runuser"):
        return [runuser, "-u", user, "--", *argv]
    return ["su", user, "-s", "/bin/sh", "-c", " ".join(map(_quote, argv))]


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def chown_tree(path: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        os.chown(root, pw.pw_uid, pw.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid, follow_symlinks=False)


def run(argv: list[str], what: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise StackError(f"{what} timed out after {timeout:.0f}s") from e
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise StackError(f"{what} failed: {last[0]}")
    return proc
