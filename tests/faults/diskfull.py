"""Disk full (issue 26): a server's data directory on a small filesystem that
fills up, then gets its space back: the broker's log directory
(kafka_disk_full) and PostgreSQL's data directory, WAL included (pg_disk_full).

How: a private stack's two data directories (CRONWHEEL_HOME/kafka/data and
the cluster's data directory) are each a tmpfs of their own for the stack's
life (`own_filesystem`, from PrivateStack.up). For the scenario the
filesystem is shrunk online to what the server holds plus SMALL_MB
(`kafka_on_small_disk`, `pg_on_small_disk`: `mount -o remount,size=`), and
grown back at the end; neither server stops for it. (Until 2026-12-03 the
directory was moved onto a tmpfs and back for each scenario, stopping and
starting the server twice: most of kafka_disk_full's 72-247 s.) A fault
fills the filesystem with a file of the harness's own
(`.filler`: Kafka reads only directories in a log directory, PostgreSQL only
the names it knows) and waits until the server's log says a write failed
("No space left on device"); it stays full for down_s. Space returns when the
file is deleted. A broker whose only log directory failed does not take it
back while it runs (Kafka stops a broker whose log directories are all
offline), so the harness then starts the broker again as a supervisor would
(`cronwheel up`); PostgreSQL is started again only if it stopped. The checker
then proves nothing was lost or doubled.

What each service logged while the disk was full goes to the report's notes
(the distinct messages, numbers and timestamps folded); docs/reliability.md
lists them. Needs root (mount); `available` says why not otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.wait import wait_for

if TYPE_CHECKING:
    from tests.faults.harness import Platform, PrivateStack, Report
    from tests.faults.scenarios import Plan

SMALL_MB = 64  # room beyond what the server holds when the scenario starts
LARGE_MB = 4096  # a private stack's data directory otherwise
FILLER = ".filler"
NO_SPACE = "No space left on device"


@functools.cache
def available() -> str | None:
    """None when a small filesystem can be mounted here; else why not."""
    if os.geteuid() != 0:
        return "a small filesystem for the broker's logs needs root (mount -t tmpfs)"
    probe = Path(tempfile.mkdtemp(prefix="cw-faults-probe-"))
    try:
        out = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode != 0:
            return f"mounting a tmpfs is not permitted here: {out.stderr.strip()}"
        subprocess.run(["umount", str(probe)], check=True, capture_output=True)
        return None
    finally:
        probe.rmdir()


def _used_mb(mount: Path) -> int:
    st = os.statvfs(mount)
    return (st.f_blocks - st.f_bfree) * st.f_frsize // 2**20


def own_filesystem(path: Path) -> bool:
    """Make the empty directory `path` a tmpfs of its own (LARGE_MB at most,
    taken from memory only as it fills); False where that cannot be done here
    (`available`), and the directory stays as it is."""
    path.mkdir(parents=True, exist_ok=True)
    if available() is not None:
        return False
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={LARGE_MB}m", "tmpfs", str(path)],
        check=True, capture_output=True,
    )  # fmt: skip
    return True


def _resize(mount: Path, size_mb: int) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,size={size_mb}m", str(mount)], check=True, capture_output=True
    )


@contextlib.contextmanager
def _small(data: Path):
    """The tmpfs at `data` shrunk to what it holds plus SMALL_MB for the block,
    then its filler gone and its size back; the server runs throughout."""
    assert os.path.ismount(data), f"{data} is not a filesystem of its own (own_filesystem)"
    _resize(data, _used_mb(data) + SMALL_MB)
    try:
        yield data
    finally:
        with contextlib.suppress(FileNotFoundError):
            (data / FILLER).unlink()
        _resize(data, LARGE_MB)


def unmount(mount: Path) -> None:
    """umount `mount`; while it is busy (a process of the private server still
    has a file open there: seen once in CI, the broker just stopped), those
    processes are named on stderr and killed (`fuser -km`: nothing but the
    stack's own server uses this tmpfs), and it is tried again, for 30 s."""

    def unmounted() -> bool:
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        if done.returncode == 0:
            return True
        holders = subprocess.run(["fuser", "-vm", str(mount)], capture_output=True, text=True)
        print(f"umount {mount}: {done.stderr.strip()}; holders: {holders.stderr.strip()}")
        subprocess.run(["fuser", "-km", str(mount)], capture_output=True)
        return False

    wait_for(unmounted, 30, 0.5, f"{mount} to unmount")


def kafka_on_small_disk(stack: PrivateStack):
    """The private broker's log directory on a small filesystem for the block."""
    return _small(stack.home / "kafka" / "data")


def pg_on_small_disk(stack: PrivateStack):
    """The private PostgreSQL's data directory (WAL included) the same way."""
    return _small(stack.pg_data)


def fill(mount: Path) -> int:
    """Take every free byte of the filesystem at `mount`; returns how many.
    The server writes meanwhile, so a size that no longer fits is tried again
    a page smaller, from what is free then."""
    fd = os.open(mount / FILLER, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(100):
            st = os.statvfs(mount)
            free = st.f_bavail * st.f_frsize
            try:
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size + free)
                return os.fstat(fd).st_size
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        raise AssertionError(f"could not fill {mount}")
    finally:
        os.close(fd)


class LogDelta:
    """What processes' log files gained since this was made."""

    _STAMP = re.compile(r"^\S*\d{4}-\d\d-\d\d[T ][\d:.,]+\S*\s*|\b\d+\b")

    def __init__(self, paths: dict[str, Path]):
        self.paths = paths
        self.start = {name: _size(p) for name, p in paths.items()}

    def messages(
        self, pattern: str = r"WARN|ERROR|PANIC|FATAL|rror|fail|No space", most: int = 3
    ) -> dict:
        """{name: its distinct new lines matching `pattern`, numbers and
        timestamps folded, at most `most`}."""
        out = {}
        for name, path in self.paths.items():
            try:
                with path.open("rb") as f:
                    f.seek(self.start[name])
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            seen: dict[str, None] = {}
            for line in text.splitlines():
                if re.search(pattern, line):
                    seen.setdefault(self._STAMP.sub("N", line).strip()[:200], None)
            if seen:
                out[name] = list(seen)[:most]
        return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _new_text(path: Path, since: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _service_logs(platform: Platform, server: str, server_log: Path) -> LogDelta:
    return LogDelta(
        {server: server_log}
        | {name: svc.log_path for name, svc in platform.services.items()}
        | {"worker": platform.launch.log_dir / "worker.log"}
    )


def _fill_until_refused(mount: Path, server_log: Path, plan: Plan, what: str) -> tuple[int, float]:
    """Fill the filesystem; wait until the server's log says a write failed
    for want of space (under the load that is within a second or two).
    Returns (bytes filled, seconds until the failure)."""
    since = _size(server_log)
    taken = fill(mount)
    t0 = time.monotonic()
    wait_for(
        lambda: NO_SPACE in _new_text(server_log, since),
        plan.down_s + 30,
        0.1,
        f"{what} to run out of space",
    )
    return taken, time.monotonic() - t0


def kafka_disk_full(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
    """The broker's filesystem full for down_s, then its space back."""
    from tests.faults.scenarios import _overdue  # scenarios imports this module

    data = stack.home / "kafka" / "data"
    broker_log = stack.home / "kafka" / "kafka.log"
    logs = _service_logs(platform, "broker", broker_log)
    broker = stack.kafka_pid()
    t0 = time.monotonic()
    with platform.connect() as conn:
        # Landed: the broker failed a write for want of space, and rows due
        # for publishing wait in the outbox (the relay has nowhere to put them).
        taken, failed_s = _fill_until_refused(data, broker_log, plan, "the broker")
        wait_for(lambda: _overdue(conn, 2.0) > 0, plan.down_s + 30, 0.1, "a row left unpublished")
        time.sleep(max(0.0, plan.down_s - (time.monotonic() - t0)))  # the disk stays full
        stuck = _overdue(conn, 2.0)
    alive = stack.kafka_pid() == broker
    report.notes.append(
        f"{taken // 2**20} MB filled; the broker out of space {failed_s:.1f} s later,"
        f" {'still running' if alive else 'exited'} at the end;"
        f" {stuck} outbox rows overdue by 2 s"
    )
    for name, lines in logs.messages().items():
        report.notes.append(f"  {name} logged: " + " | ".join(lines))
    (data / FILLER).unlink()  # the space returns
    if alive:
        # Kafka does not take a failed log directory back while it runs.
        stack.stop_kafka()
    t1 = time.monotonic()
    stack.up()
    report.notes.append(f"broker answering {time.monotonic() - t1:.1f} s after its start")


def pg_disk_full(stack: PrivateStack, platform: Platform, plan: Plan, report: Report) -> None:
    """PostgreSQL's data directory (WAL included) full for down_s, then its
    space back. PostgreSQL is started again only if it stopped."""
    pg_log = stack.pg_data.parent / "postgres.log"
    logs = _service_logs(platform, "postgres", pg_log)
    postmaster = stack.pg_pid()
    t0 = time.monotonic()
    # Landed: PostgreSQL failed a write for want of space.
    taken, failed_s = _fill_until_refused(stack.pg_data, pg_log, plan, "PostgreSQL")
    time.sleep(max(0.0, plan.down_s - (time.monotonic() - t0)))  # the disk stays full
    alive = stack.pg_pid() == postmaster
    report.notes.append(
        f"{taken // 2**20} MB filled; PostgreSQL out of space {failed_s:.1f} s later,"
        f" {'postmaster still running' if alive else 'stopped'} at the end"
    )
    for name, lines in logs.messages().items():
        report.notes.append(f"  {name} logged: " + " | ".join(lines))
    (stack.pg_data / FILLER).unlink()  # the space returns
    if not stack.pg_pid():
        stack.up()
