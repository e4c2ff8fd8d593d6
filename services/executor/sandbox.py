"""The sandbox a managed run's command runs in: bubblewrap, limits, supervision.

One process chain per run, each link exec'ing the next so the executor stays
the parent (bwrap's --die-with-parent then kills the sandbox with it):

    [sh: join the run's cgroup]   only with a usable cgroup v2 parent
    setpriv --reuid=U             only as root: a host uid of the run's own
    prlimit --cpu --as --nproc --fsize --nofile --core
    bwrap --unshare-all ...       new user, pid, net, ipc, uts, cgroup namespaces
    COMMAND

How limits are enforced (see docs/managed-execution.md):
- memory: cgroup v2 `memory.max` (swap 0, OOM kills the whole group) when the
  executor has a cgroup v2 parent with the memory and pids controllers it may
  write to; otherwise RLIMIT_AS per process.
- processes: cgroup `pids.max`; and, as root, RLIMIT_NPROC counted against a
  host uid that only this run uses (uids are claimed per executor slot with a
  lock file, so concurrent runs and executors never share one). RLIMIT_NPROC
  does not apply to uid 0, which is why the sandbox never runs as root.
- CPU time: RLIMIT_CPU per process, whole seconds (cpu_ms rounded up).
- file size, open files: RLIMIT_FSIZE, RLIMIT_NOFILE; the scratch tmpfs is sized.
- wall clock: the caller's deadline; the process group is killed with SIGKILL.

Nothing runs unsandboxed: without bwrap (or without a way to enforce the
process limit) `Sandbox()` raises SandboxUnavailable and the executor exits.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import math
import os
import pwd
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from services.executor.egress import Egress, EgressUnavailable
from services.executor.output import Tail, secret_values
from services.executor.seccomp_filter import FilterUnavailable, compile_filter

SCRATCH = "/scratch"  # the run's working directory and HOME: a sized, private tmpfs
PAYLOAD_FILE = "/run/cronwheel/payload.json"
SANDBOX_UID = 1000  # the uid the command sees inside its user namespace
BWRAP_PROCS = 2  # bwrap's own monitor and pid-1 reaper count against the process limit
DEFAULT_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
# Read-only from the host: the OS's programs and libraries, nothing else.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime")
# With network; /etc/resolv.conf and /etc/hosts are written for the run (egress.py).
NETWORK_ETC = (
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SandboxUnavailable(RuntimeError):
    """The executor cannot sandbox commands here; it must not start."""


class TargetRefused(ValueError):
    """This target cannot run under this executor's policy (not retryable)."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    cpu_ms: int
    pids: int
    network: bool
    fsize_mb: int
    nofile: int
    scratch_mb: int


@dataclass(frozen=True)
class Policy:
    """The operator's settings: defaults and ceilings for what targets may ask.
    main.py's SandboxSettings reads CRONWHEEL_EXECUTOR_<NAME> for each field."""

    allow_network: bool = False
    memory_mb: int = 512
    max_memory_mb: int = 4096
    cpu_ms: int = 600_000
    max_cpu_ms: int = 86_400_000
    pids: int = 64
    max_pids: int = 1024
    fsize_mb: int = 64
    nofile: int = 256
    scratch_mb: int = 64
    max_wall_ms: int = 3_600_000
    uid_base: int = 200_000
    uid_range: int = 10_000
    cgroup: str | None = None  # a delegated cgroup v2 directory; None: try our own
    lock_dir: str | None = None
    # Network runs (egress.py): CIDRs they may reach beyond public addresses,
    # their name servers (None: the host's), the addresses of their veths.
    egress_allow: tuple[ipaddress.IPv4Network, ...] = ()
    egress_dns: tuple[str, ...] | None = None
    egress_subnet: str = "10.254.0.0/16"

    def limits_for(self, target: Mapping) -> Limits:
        """The limits a managed target runs with; TargetRefused if it asks for
        more than this executor grants."""
        asked = target.get("limits") or {}
        if asked.get("network") and not self.allow_network:
            raise TargetRefused(
                "limits.network: this executor does not allow network access "
                "(the operator enables it with CRONWHEEL_EXECUTOR_ALLOW_NETWORK=1)"
            )
        for key, ceiling in (
            ("memory_mb", self.max_memory_mb),
            ("cpu_ms", self.max_cpu_ms),
            ("pids", self.max_pids),
        ):
            if asked.get(key, 0) > ceiling:
                raise TargetRefused(
                    f"limits.{key}: {asked[key]} is above this executor's {ceiling}"
                )
        return Limits(
            memory_mb=asked.get("memory_mb", self.memory_mb),
            cpu_ms=asked.get("cpu_ms", self.cpu_ms),
            pids=asked.get("pids", self.pids),
            network=bool(asked.get("network", False)),
            fsize_mb=self.fsize_mb,
            nofile=self.nofile,
            scratch_mb=self.scratch_mb,
        )


def command_env(target_env: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The command's whole environment: the target's variables, PATH/HOME/...
    defaults where it gives none, and the platform's CRONWHEEL_* variables.
    Nothing of the executor's own environment."""
    for name, value in target_env.items():
        if not _ENV_NAME.match(name) or name.startswith("CRONWHEEL_"):
            raise TargetRefused(f"env: {name!r} is not a variable name a target may set")
        if "\0" in value:
            raise TargetRefused(f"env.{name}: contains a NUL character")
    env = {"PATH": DEFAULT_PATH, "HOME": SCRATCH, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    env.update(target_env)
    env.update(extra)
    return env


# -- the command line -----------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    bwrap: str
    prlimit: str
    setpriv: str | None
    sh: str | None
    nsenter: str | None = None

    @classmethod
    def locate(cls) -> Tools:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed, and managed runs never execute "
                "unsandboxed: install Debian's `bubblewrap` (make system-deps)"
            )
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxUnavailable("prlimit is not installed (Debian's util-linux)")
        return cls(
            bwrap, prlimit, shutil.which("setpriv"), shutil.which("sh"), shutil.which("nsenter")
        )


def build_argv(
    tools: Tools,
    command: list[str],
    limits: Limits,
    *,
    uid: int | None,
    cgroup: Path | None,
    fds: Mapping[str, int],
    netns: str | None = None,
) -> list[str]:
    """The full command line. `fds` holds the descriptors bwrap copies into
    read-only files: `passwd`, `group` and `payload`, and `seccomp`, the
    filter it applies; with network also `resolv` and `hosts`, and `netns`, the
    run's own network namespace (egress.py), which the command joins before
    the uid switch. Environment values are not in it (the command line is
    world-readable in /proc)."""
    if limits.network and netns is None:
        raise ValueError("a run with network needs its own network namespace")
    argv: list[str] = []
    if cgroup is not None:
        # Join the run's cgroup before anything else runs, then become the rest.
        argv += [
            tools.sh or "sh",
            "-c",
            'echo $$ > "$0" && exec "$@"',
            str(cgroup / "cgroup.procs"),
        ]
    if netns is not None:
        argv += [tools.nsenter or "nsenter", f"--net={netns}", "--"]
    if uid is not None:
        argv += [
            tools.setpriv or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--no-new-privs", "--",
        ]  # fmt: skip
    cpu_s = max(1, math.ceil(limits.cpu_ms / 1000))
    argv += [tools.prlimit, f"--cpu={cpu_s}:{cpu_s + 1}", "--core=0"]
    argv += [f"--fsize={limits.fsize_mb << 20}", f"--nofile={limits.nofile}"]
    if cgroup is None:
        argv.append(f"--as={limits.memory_mb << 20}")
    if uid is not None:
        argv.append(f"--nproc={limits.pids + BWRAP_PROCS}")
    argv.append("--")
    argv += [tools.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    if netns is not None:
        argv.append("--share-net")  # the namespace nsenter joined
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    # /usr/local holds the host's own tools, not the OS's: hide it.
    argv += ["--perms", "0755", "--tmpfs", "/usr/local", "--remount-ro", "/usr/local"]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for f in ETC_FILES + (NETWORK_ETC if limits.network else ()):
        argv += ["--ro-bind-try", f, f]
    if limits.network:
        argv += ["--ro-bind-data", str(fds["resolv"]), "/etc/resolv.conf"]
        argv += ["--ro-bind-data", str(fds["hosts"]), "/etc/hosts"]
    argv += ["--ro-bind-data", str(fds["passwd"]), "/etc/passwd"]
    argv += ["--ro-bind-data", str(fds["group"]), "/etc/group"]
    argv += ["--ro-bind-data", str(fds["payload"]), PAYLOAD_FILE]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "0700", "--size", str(limits.scratch_mb << 20), "--tmpfs", SCRATCH]
    argv += ["--perms", "01777", "--dir", f"{SCRATCH}/tmp", "--symlink", f"{SCRATCH}/tmp", "/tmp"]
    # The syscall allowlist (seccomp_filter.py), applied to COMMAND only: bwrap
    # needs namespaces and mounts to build the sandbox first.
    argv += ["--seccomp", str(fds["seccomp"])]
    argv += ["--chdir", SCRATCH, "--", *command]
    return argv


# -- cgroups v2 -----------------------------------------------------------------


class Cgroups:
    """Per-run child cgroups under a cgroup v2 directory whose memory and pids
    controllers this process may enable for its children."""

    CONTROLLERS = ("memory", "pids")

    def __init__(self, parent: Path):
        self.parent = parent

    @classmethod
    def find(cls, configured: str | None) -> Cgroups | None:
        """The configured directory, its controllers enabled for children if
        need be (SandboxUnavailable if unusable); else our own cgroup if it
        already enables them for children and we may create one (usually
        only the root of a VM's hierarchy: a non-root cgroup holding
        processes may not enable controllers); else None: the rlimit fallback."""
        path = Path(configured) if configured else _own_cgroup_v2()
        if path is None:
            return None
        try:
            have = (path / "cgroup.controllers").read_text().split()
            if not all(c in have for c in cls.CONTROLLERS):
                raise OSError(errno.ENOTSUP, f"controllers {have} lack memory or pids")
            enabled = (path / "cgroup.subtree_control").read_text().split()
            missing = [f"+{c}" for c in cls.CONTROLLERS if c not in enabled]
            if missing and not configured:
                return None  # not ours to change
            if missing:
                (path / "cgroup.subtree_control").write_text(" ".join(missing))
            if not os.access(path, os.W_OK):
                raise OSError(errno.EACCES, "cannot create cgroups there")
        except OSError as e:
            if configured:
                raise SandboxUnavailable(f"CRONWHEEL_EXECUTOR_CGROUP={configured}: {e}") from e
            return None
        return cls(path)

    def create(self, name: str, limits: Limits) -> Path:
        path = self.parent / name
        path.mkdir()
        (path / "memory.max").write_text(str(limits.memory_mb << 20))
        for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
            if (path / knob).exists():
                (path / knob).write_text(value)
        (path / "pids.max").write_text(str(limits.pids + BWRAP_PROCS))
        return path

    def remove(self, path: Path) -> None:
        """Kill what is left in it and remove it."""
        if (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
        for _ in range(100):
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)  # its last processes are still exiting


def _own_cgroup_v2() -> Path | None:
    try:
        mount = next(
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split(" - ", 1)[-1].startswith("cgroup2 ")
        )
        rel = next(
            line[3:]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
    except (OSError, StopIteration):
        return None
    return Path(mount) / rel.lstrip("/")


# -- host uids ------------------------------------------------------------------


class UidPool:
    """Host uids this executor runs sandboxes as, each held with a lock file so
    two executors on one host never share one (the process limit counts
    processes per uid). Uids of real accounts are skipped. Handed out oldest
    released first: bwrap's reaper exits after bwrap itself, so it lingers as
    a zombie (counted against its uid) until the host's init reaps it."""

    def __init__(self, base: int, span: int, count: int, lock_dir: Path):
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._locks: list[int] = []
        self.free: collections.deque[int] = collections.deque()
        self._mutex = threading.Lock()
        for uid in range(base, base + span):
            if len(self.free) == count:
                break
            with contextlib.suppress(KeyError):
                pwd.getpwuid(uid)
                continue
            fd = os.open(lock_dir / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._locks.append(fd)
            self.free.append(uid)
        if len(self.free) < count:
            self.close()
            raise SandboxUnavailable(
                f"only {len(self.free)} of {count} sandbox uids free in "
                f"{base}..{base + span - 1} (CRONWHEEL_EXECUTOR_UID_BASE)"
            )

    def take(self) -> int:
        with self._mutex:
            return self.free.popleft()

    def give(self, uid: int) -> None:
        with self._mutex:
            self.free.append(uid)

    def close(self) -> None:
        for fd in self._locks:
            os.close(fd)
        self._locks.clear()


def _default_lock_dir() -> Path:
    if os.access("/run", os.W_OK):
        return Path("/run/cronwheel-executor")
    return Path(tempfile.gettempdir()) / f"cronwheel-executor-{os.getuid()}"


# -- running one command ------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    """How a sandboxed command ended. `reason`: exited (by itself, `code` is its
    exit status, 128+N for signal N), timeout (the deadline passed), aborted
    (`tick` said stop) or stopped (the executor is shutting down)."""

    reason: str
    code: int
    output: str
    truncated: bool
    output_bytes: int
    duration_ms: int


class Sandbox:
    def __init__(self, policy: Policy, slots: int):
        self.policy = policy
        self.root = os.geteuid() == 0
        self.tools = Tools.locate()
        try:
            self.seccomp = compile_filter()
        except FilterUnavailable as e:
            raise SandboxUnavailable(f"no seccomp filter: {e}") from e
        self.cgroups = Cgroups.find(policy.cgroup)
        if not self.root and self.cgroups is None:
            raise SandboxUnavailable(
                "cannot enforce the process limit: run the executor as root, or give it "
                "a delegated cgroup v2 directory (CRONWHEEL_EXECUTOR_CGROUP)"
            )
        for tool, needed in (("setpriv", self.root), ("sh", self.cgroups is not None)):
            if needed and getattr(self.tools, tool) is None:
                raise SandboxUnavailable(f"{tool} is not installed (Debian's util-linux, dash)")
        self.uids: UidPool | None = None
        lock_dir = Path(policy.lock_dir) if policy.lock_dir else _default_lock_dir()
        if self.root:
            # Twice as many uids as slots, so a uid rests between two runs.
            self.uids = UidPool(policy.uid_base, policy.uid_range, 2 * slots, lock_dir)
        self.egress: Egress | None = None
        self.egress_refusal = "the operator does not allow network access"
        try:
            if policy.allow_network:
                self._start_egress(lock_dir)
            self._probe()
        except BaseException:
            self.close()
            raise

    def _start_egress(self, lock_dir: Path) -> None:
        """Network runs get their own namespace behind the egress rules, or,
        where this executor cannot set those up, are refused (the rest run)."""
        try:
            self.egress = Egress.start(
                subnet=ipaddress.IPv4Network(self.policy.egress_subnet),
                uid_base=self.policy.uid_base,
                uid_range=self.policy.uid_range,
                allow=self.policy.egress_allow,
                dns=self.policy.egress_dns,
                lock_dir=lock_dir,
                uids=list(self.uids.free) if self.uids is not None else [],
            )
        except EgressUnavailable as e:
            self.egress_refusal = str(e)

    def limits_for(self, target: Mapping) -> Limits:
        """The policy's limits for `target` (TargetRefused as Policy.limits_for),
        and refused too if it asks for network this executor cannot fence."""
        limits = self.policy.limits_for(target)
        if limits.network and self.egress is None:
            raise TargetRefused(
                f"limits.network: this executor cannot enforce its egress policy: "
                f"{self.egress_refusal}"
            )
        return limits

    @property
    def network(self) -> str:
        """What runs asking for network get, for the start-up log."""
        if self.egress is None:
            return f"refused ({self.egress_refusal})"
        allow = ",".join(str(n) for n in self.egress.allow) or "none"
        dns = ",".join(self.egress.dns) or "none"
        return f"own namespace via nftables egress rules (allowed private: {allow}; DNS: {dns})"

    @property
    def mode(self) -> str:
        """How memory and process limits are enforced, for the start-up log."""
        if self.cgroups is not None:
            return f"cgroup v2 under {self.cgroups.parent}"
        return "rlimits (RLIMIT_AS, RLIMIT_NPROC on a per-slot uid): no usable cgroup v2"

    def close(self) -> None:
        if self.egress is not None:
            self.egress.close()
            self.egress = None
        if self.uids is not None:
            self.uids.close()

    def _probe(self) -> None:
        """Run `true` once, as every run will, so a host that cannot (no user
        namespaces, say) fails at start-up rather than on each run; and once
        with network where that is on, so a host that cannot give a run its
        namespace refuses network runs rather than failing each."""
        if failed := self._true(self.policy.limits_for({})):
            raise SandboxUnavailable(f"bwrap cannot start a sandbox here: {failed}")
        if self.egress is not None:
            failed = self._true(dataclasses.replace(self.policy.limits_for({}), network=True))
            if failed:
                self.egress.close()
                self.egress = None
                self.egress_refusal = f"a run cannot start in its own network namespace: {failed}"

    def _true(self, limits: Limits) -> str | None:
        """None if `true` runs in the sandbox with `limits`, else why not."""
        try:
            got = self.run(["true"], {}, limits, payload="null", deadline=time.monotonic() + 30)
        except OSError as e:
            return str(e)
        if got.reason != "exited" or got.code != 0:
            return (got.output.strip().splitlines() or [f"exit code {got.code}"])[0]
        return None

    def run(
        self,
        command: list[str],
        env: Mapping[str, str],
        limits: Limits,
        *,
        payload: str,
        deadline: float,
        tick: Callable[[], bool] | None = None,
        tick_every: float = 10.0,
        stop: threading.Event | None = None,
        grace: float = 0.0,
    ) -> Exit:
        """Run `command` to its end or until `deadline` (time.monotonic()).
        `tick` is called every `tick_every` seconds (heartbeats); False kills the
        command. Once `stop` is set the command gets `grace` seconds more."""
        if limits.network and self.egress is None:
            raise TargetRefused(f"limits.network: {self.egress_refusal}")
        uid = self.uids.take() if self.uids is not None else None
        cgroup: Path | None = None
        netns: str | None = None
        fds: dict[str, int] = {}
        proc: subprocess.Popen | None = None
        started = time.monotonic()
        tail = Tail(secrets=secret_values(env))
        try:
            if self.cgroups is not None:
                name = f"cw-{uid if uid is not None else os.getpid()}-{secrets.token_hex(4)}"
                cgroup = self.cgroups.create(name, limits)
            files: dict[str, str | bytes] = {
                "passwd": f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::{SCRATCH}:/bin/sh\n",
                "group": f"sandbox:x:{SANDBOX_UID}:\n",
                "payload": payload,
                "seccomp": self.seccomp,
            }
            if limits.network and self.egress is not None and uid is not None:
                files["resolv"] = self.egress.resolv_conf()
                files["hosts"] = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost sandbox\n"
                netns = self.egress.open(uid)
            for key, text in files.items():
                fds[key] = _memfd(key, text)
            argv = build_argv(
                self.tools, command, limits, uid=uid, cgroup=cgroup, fds=fds, netns=netns
            )
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                pass_fds=tuple(fds.values()),
                process_group=0,
            )
            for fd in fds.values():
                os.close(fd)
            fds = {}
            reason = _supervise(
                proc, tail, deadline=deadline, tick=tick, tick_every=tick_every,
                stop=stop, grace=grace,
            )  # fmt: skip
        finally:
            for fd in fds.values():
                os.close(fd)
            if proc is not None:
                _kill(proc)
                if proc.stdout is not None:
                    proc.stdout.close()
            if cgroup is not None and self.cgroups is not None:
                self.cgroups.remove(cgroup)
            if uid is not None and self.egress is not None and limits.network:
                self.egress.release(uid)
            if uid is not None and self.uids is not None:
                self.uids.give(uid)
        code = proc.returncode
        return Exit(
            reason=reason,
            code=128 - code if code < 0 else code,
            output=tail.text(),
            truncated=tail.truncated,
            output_bytes=tail.total,
            duration_ms=int((time.monotonic() - started) * 1000),
        )


def _memfd(name: str, content: str | bytes) -> int:
    """An anonymous file holding `content`, for bwrap's --ro-bind-data and --seccomp."""
    fd = os.memfd_create(name, 0)
    data = memoryview(content.encode() if isinstance(content, str) else content)
    while data:
        data = data[os.write(fd, data) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (bwrap; its sandbox dies with it) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _supervise(
    proc: subprocess.Popen,
    tail: Tail,
    *,
    deadline: float,
    tick: Callable[[], bool] | None,
    tick_every: float,
    stop: threading.Event | None,
    grace: float,
) -> str:
    """Read output into `tail` until the command ends, ticking on schedule and
    killing it at the deadline; returns the Exit reason."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    next_tick = time.monotonic() + tick_every
    stop_at: float | None = None
    reading = True
    try:
        while True:
            now = time.monotonic()
            if stop is not None and stop.is_set() and stop_at is None:
                stop_at = now + grace
            if now >= deadline or (stop_at is not None and now >= stop_at):
                reason = "timeout" if now >= deadline else "stopped"
                break
            if tick is not None and now >= next_tick:
                if not tick():
                    reason = "aborted"
                    break
                next_tick = time.monotonic() + tick_every
            wait = min(deadline, stop_at or deadline, next_tick) - time.monotonic()
            wait = max(0.0, min(wait, 0.25))  # notice `stop` promptly
            if reading:
                if sel.select(wait):
                    reading = _read(fd, tail)
            else:
                try:
                    proc.wait(wait)
                    return "exited"
                except subprocess.TimeoutExpired:
                    pass
        _kill(proc)
        _drain(fd, tail)  # what it printed before it was killed
        return reason
    finally:
        sel.close()


def _read(fd: int, tail: Tail) -> bool:
    """One read; False at end of file."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return True
    if chunk:
        tail.feed(chunk)
        return True
    return False


def _drain(fd: int, tail: Tail) -> None:
    deadline = time.monotonic() + 1.0
    with contextlib.suppress(OSError):
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not chunk:
                return
            tail.feed(chunk)
