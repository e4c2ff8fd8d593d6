"""Network partitions for the fault harness: one process cut off from one TCP
port (PostgreSQL's, Kafka's) while everything else keeps talking to it.

How: an nftables table of the harness's own drops every packet the process
sends to the port. Its established connections are matched by their local
ports (its sockets, found through /proc/PID/fd and /proc/net/tcp); the
connections it opens during the cut by the cgroup (v2) it is moved into,
since a socket keeps the cgroup it was created in. Packets are dropped, not
refused, so the process sees what a real partition looks like: connections
that hang, no RST, no error until its own timeouts fire. Healing deletes the
table and moves the process back to the cgroup it came from.

nft resolves a `socket cgroupv2` path against /sys/fs/cgroup. On a host whose
cgroup2 hierarchy is mounted elsewhere (the hybrid layout: /sys/fs/cgroup/unified)
a symlink of the same name under /sys/fs/cgroup points at it while the rule
is made. Needs root and the nft command (Makefile: system-deps).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

from services.executor.egress import find_tool

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def available() -> str | None:
    """None when a cut can be made here; else why not."""
    if os.geteuid() != 0:
        return "network cuts need root (cgroups and nftables)"
    if not find_tool("nft"):
        return "network cuts need nft (apt-get install nftables)"
    if _cgroup2_mount() is None:
        return "network cuts need a cgroup2 hierarchy"
    return None


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _nft_path() -> str:
    """nft where a CI job's PATH without the sbin directories still finds it
    (the executor's egress does the same)."""
    return find_tool("nft") or "nft"


def _nft(script: str) -> None:
    out = subprocess.run([_nft_path(), "-f", "-"], input=script, text=True, capture_output=True)
    if out.returncode != 0:
        raise RuntimeError(f"nft refused: {out.stderr.strip()}")


def _local_ports(pid: int, remote_port: int) -> set[int]:
    """Local ports of process `pid`'s TCP connections to `remote_port`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                f = line.split()
                local, remote, inode = f[1], f[2], f[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


class Cut:
    """`pid` cut off from TCP `port` on this host while the block runs:

    with Cut(pid, 26432):
        ...  # the process's packets to PostgreSQL are dropped
    """

    def __init__(self, pid: int, port: int):
        self.pid = pid
        self.port = port
        self.name = f"cwfaults-{uuid.uuid4().hex[:8]}"
        self.table = self.name.replace("-", "_")
        mount = _cgroup2_mount()
        assert mount is not None, available()
        self.cgroup = mount / self.name
        self.link = _CGROUP_ROOT / self.name if mount != _CGROUP_ROOT else None

    def __enter__(self) -> Cut:
        self.home = self._cgroup_of(self.pid)
        self.cgroup.mkdir()
        (self.cgroup / "cgroup.procs").write_text(str(self.pid))  # every thread moves
        # After the move: a connection opened from now on is the cgroup rule's.
        self.established = sorted(_local_ports(self.pid, self.port))
        rules = [f'socket cgroupv2 level 1 "{self.name}" tcp dport {self.port} counter drop']
        if self.established:
            ports = ", ".join(map(str, self.established))
            rules.append(f"tcp sport {{ {ports} }} tcp dport {self.port} counter drop")
        if self.link is not None:
            self.link.symlink_to(self.cgroup)
        try:
            _nft(
                f"table inet {self.table} {{\n"
                "  chain out {\n"
                "    type filter hook output priority 0;\n"
                + "".join(f"    {rule}\n" for rule in rules)
                + "  }\n"
                "}\n"
            )
        finally:
            if self.link is not None:
                self.link.unlink()
        return self

    def dropped(self) -> int:
        """Packets the rule has dropped so far (the proof the cut landed)."""
        out = subprocess.run(
            [_nft_path(), "list", "table", "inet", self.table], text=True, capture_output=True
        )
        words = out.stdout.split()
        return sum(int(n) for word, n in zip(words, words[1:], strict=False) if word == "packets")

    def _cgroup_of(self, pid: int) -> Path:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return self.cgroup.parent / line[3:].lstrip("/")
        return self.cgroup.parent

    def heal(self) -> None:
        with contextlib.suppress(RuntimeError):
            _nft(f"delete table inet {self.table}\n")

    def __exit__(self, *exc) -> None:
        self.heal()
        with contextlib.suppress(OSError):
            (self.home / "cgroup.procs").write_text(str(self.pid))
        with contextlib.suppress(OSError):
            self.cgroup.rmdir()
