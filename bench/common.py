"""What the firing-path benchmarks share: a fresh database, jobs in bulk, the
services as processes, and a Kafka reader that notes when each record arrives.

Jobs are written by SQL (INSERT ... SELECT generate_series) because 1M calls of
Jobs.create would take longer than the benchmark; the rows are the ones
Jobs.create writes (its own column values, partition_of, timer `job:<id>`), and
`check_like_create` compares one bulk row with a real Jobs.create in a
transaction that is rolled back. Benchmarks print figures; they never assert
timings.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import gc
import hashlib
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import AclBindingFilter

from cronwheel import config, kafka, principals
from cronwheel.core.avro import default_registry
from cronwheel.core.clock import iso, now_ms, to_dt, to_ms
from cronwheel.core.ids import partition_of
from cronwheel.core.jobs import parse_job
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.kafka import Topics
from cronwheel.store import runs_daily
from cronwheel.store.firing import job_timer_id
from cronwheel.store.jobs import Jobs, _spec_columns, create_tenant
from cronwheel.store.migrate import MIGRATIONS_DIR, migrate

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 100_000  # jobs per INSERT statement (and transaction) in bulk loads


def say(line: str) -> None:
    print(line, flush=True)


# -- the machine ------------------------------------------------------------


def _cpu_ticks() -> dict[int, tuple[int, str]]:
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        out[int(entry.name)] = (int(fields[11]) + int(fields[12]), cmd or stat.split()[1])
    return out


def machine_load(sample_s: float = 1.0, top: int = 4) -> str:
    """Load average and the busiest processes over a short sample: the machine is
    shared, so every figure is printed beside what else was running."""
    before = _cpu_ticks()
    time.sleep(sample_s)  # a sampling interval, not a wait for a condition
    after = _cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    busy = sorted(
        ((t - before[p][0], p, cmd) for p, (t, cmd) in after.items() if p in before),
        reverse=True,
    )
    parts = [f"{100 * d / hz / sample_s:.0f}% {cmd[:60]}" for d, _p, cmd in busy[:top] if d > 0]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"load average {load} on {os.cpu_count()} cores; busiest: " + (
        "; ".join(parts) or "idle"
    )


def _stat_cpu(stat: Path) -> float | None:
    """User + system CPU seconds of a /proc stat file; None once it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    return _stat_cpu(Path(f"/proc/{pid}/stat")) or 0.0


def thread_times(pid: int) -> list[tuple[int, str, float]]:
    """(thread id, thread name, CPU seconds so far) of each live thread of the
    process (librdkafka names its threads rdk:main, rdk:broker<N>, ...)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        used = _stat_cpu(task / "stat")
        if used is not None:
            out.append((int(task.name), name, used))
    return out


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of the processes' live threads, summed per name."""
    out: dict[str, float] = {}
    for pid in pids:
        for _tid, name, used in thread_times(pid):
            out[name] = out.get(name, 0.0) + used
    return out


def waited_seconds(pid: int) -> float:
    """Seconds the process's live threads spent runnable but waiting for a CPU
    (schedstat run_delay; threads that already exited are not counted)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(task.path, "schedstat").read_text().split()[1])
    return total / 1e9


def local_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets a process holds: how its PostgreSQL backends
    are found (pg_stat_activity.client_port)."""
    inodes = set()
    for fd in os.scandir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(fd.path)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[9] in inodes:
                    ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def broker_live_heap_mb(pid: int) -> float | None:
    """The broker's heap in use right after a full collection (`jcmd GC.run`,
    then `GC.heap_info`): what its data and state hold. Its resident memory
    is the JVM's high mark, grown towards -Xmx and never given back, so it
    says more about the runs before than about what the broker holds now.
    None where jcmd cannot attach (another user's JVM, no JDK)."""
    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60, check=True)
        out = subprocess.run(
            ["jcmd", str(pid), "GC.heap_info"], capture_output=True, timeout=60, check=True
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return None
    # G1: " garbage-first heap   total 495616K, used 183105K [...]";
    # ZGC: " ZHeap           used 242M, capacity 2048M, max capacity 2048M".
    used = re.search(r"(?:heap\s+total \d+K,|ZHeap\s+) used (\d+)([KMG])", out)
    if not used:
        return None
    return int(used.group(1)) * {"K": 1 / 1024, "M": 1, "G": 1024}[used.group(2)]


def broker_pauses(since_ms: float, until_ms: float) -> list[tuple[float, float]] | None:
    """The local stack's broker's stop-the-world collections that overlap
    [since_ms, until_ms), each (start ms, length ms); None where the benchmark
    talks to another broker (KAFKA_BOOTSTRAP), or the stack's left no log."""
    from cronwheel.stack.kafka import LocalKafka

    broker = LocalKafka(config.project_home())
    if config.kafka_bootstrap() != broker.bootstrap or not broker.running():
        return None
    return broker.gc_pauses(since_ms, until_ms)


def in_a_pause(pauses: list[tuple[float, float]], sent_ms: float, read_ms: float) -> bool:
    """Whether the broker paused while a record was between its produce() and
    its read (`pauses` sorted by start; they do not overlap, so the last to
    start before the read is the last to end)."""
    i = bisect.bisect_right(pauses, (read_ms, math.inf))
    return i > 0 and sum(pauses[i - 1]) >= sent_ms


def broker_pause_share(in_flight: list[tuple[float, float, float]], lo: float, hi: float) -> str:
    """Of the records `in_flight` (each its lateness, its produce() and its
    read, in ms; produced in the window [lo, hi)), how many of the slowest 1%
    and of all were between the two while the broker's collector had the
    broker stopped: the share of a p99 that is the broker's pauses. The
    pauses are read up to the last read, which may be after the window."""
    if not in_flight:
        return "n/a (nothing read)"
    pauses = broker_pauses(lo, max(read for _l, _sent, read in in_flight))
    if pauses is None:
        return "n/a (no collector log: not the local stack's broker)"
    slowest = sorted(in_flight)[-max(1, len(in_flight) // 100) :]

    def share(group: list) -> float:
        return 100 * sum(in_a_pause(pauses, sent, read) for _l, sent, read in group) / len(group)

    inside = [min(s + n, hi) - max(s, lo) for s, n in pauses if s < hi and s + n > lo]
    return (
        f"{len(inside)} stop-the-world pauses in the window, {sum(inside):.0f} ms"
        f" ({100 * sum(inside) / (hi - lo):.1f}% of it, longest"
        f" {max(inside, default=0):.0f} ms);"
        f" in flight during one: {share(slowest):.0f}% of the slowest 1% of records,"
        f" {share(in_flight):.1f}% of all"
    )


def kafka_broker_pid() -> int | None:
    """The broker the benchmark talks to: the Kafka process listening on the
    configured bootstrap's port. Other brokers may run beside it (another
    cell's, a fault test's private one, a second broker compared against)."""
    port = int(config.kafka_bootstrap().split(",")[0].rsplit(":", 1)[1])
    brokers = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if b"kafka.Kafka" in Path(entry.path, "cmdline").read_bytes():
                    brokers.append(int(entry.name))
    for pid in brokers:
        with contextlib.suppress(OSError):
            if port in local_ports(pid):
                return pid
    return brokers[0] if len(brokers) == 1 else None


def postgres_pids() -> list[int]:
    """Every process of the PostgreSQL cluster on the configured port: the
    postmaster and its children (backends forked later inherit its CPU
    affinity, so pinning the postmaster pins the sessions still to come)."""
    port = urlsplit(config.database_url()).port or 5432
    procs = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(entry.path, "stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                procs[int(entry.name)] = (comm, ppid)
    # The postmaster: the postgres process on the port whose parent is not one
    # (its backends' connections have the port too).
    master = next(
        (
            pid
            for pid, (comm, ppid) in procs.items()
            if comm == "postgres"
            and procs.get(ppid, ("", 0))[0] != "postgres"
            and port in local_ports(pid)
        ),
        None,
    )
    if master is None:
        return []
    return [master] + [pid for pid, (_comm, ppid) in procs.items() if ppid == master]


def each_thread(pids: list[int], do: Callable[[int], None]) -> int:
    """`do(tid)` for every live thread of `pids`; returns how many threads. A
    process or thread that has ended is passed over."""
    n = 0
    for pid in pids:
        try:
            tids = [int(task.name) for task in os.scandir(f"/proc/{pid}/task")]
        except FileNotFoundError:
            continue
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                do(tid)
                n += 1
    return n


def set_affinity(pids: list[int], cpus: set[int]) -> int:
    """Every live thread of `pids` to run only on `cpus`; returns how many."""
    return each_thread(pids, lambda tid: os.sched_setaffinity(tid, cpus))


def hop_cpu() -> set[int]:
    """The CPU a benchmark's `--pin` gives the Kafka hop: the last one."""
    return {(os.cpu_count() or 1) - 1}


Pids = list[int] | Callable[[], list[int]]


@contextlib.contextmanager
def pinned(groups: dict[str, tuple[Pids, set[int]]]) -> Iterator[None]:
    """Each group's processes (every thread) on its CPUs until the end, then
    back on every CPU, whatever ended the block. Prints what went where. A
    group given as a callable is asked again at the end, so that processes
    started meanwhile (PostgreSQL's sessions, forked from a pinned
    postmaster) are let go too."""
    every = set(range(os.cpu_count() or 1))

    def pids_of(pids: Pids) -> list[int]:
        return pids() if callable(pids) else pids

    try:
        for name, (pids, cpus) in groups.items():
            n = set_affinity(pids_of(pids), cpus)
            say(f"pin: {n} threads of {name} on CPU {','.join(map(str, sorted(cpus)))}")
        yield
    finally:
        for pids, _cpus in groups.values():
            set_affinity(pids_of(pids), every)


# -- databases --------------------------------------------------------------


def with_dbname(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


def _template_names() -> dict[bool, str]:
    """{contract: name} of this migration set's two templates."""
    h = hashlib.sha256()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        h.update(path.name.encode() + path.read_bytes())
    digest = h.hexdigest()[:12]
    return {True: f"cw_bench_template_{digest}", False: f"cw_bench_template_expand_{digest}"}


def _template(admin_url: str, contract: bool = True) -> str:
    """A migrated template per migration set (as tests/support/db.py keeps one);
    `contract=False`: the expand steps only, as a platform mid-upgrade has it."""
    name = _template_names()[contract]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(4243)")
        try:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
                try:
                    migrate(with_dbname(admin_url, name), contract=contract)
                except Exception:
                    conn.execute(f'DROP DATABASE "{name}"')
                    raise
                _drop_stale_templates(conn, keep=list(_template_names().values()))
        finally:
            conn.execute("SELECT pg_advisory_unlock(4243)")
    return name


def _drop_stale_templates(conn: psycopg.Connection, keep: list[str]) -> None:
    """Templates of earlier migration sets; one still in use is left alone."""
    stale = conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE 'cw\\_bench\\_template\\_%%'"
        " AND datname <> ALL(%s)",
        [keep],
    ).fetchall()
    for (old,) in stale:
        with contextlib.suppress(psycopg.Error):
            conn.execute(f'DROP DATABASE IF EXISTS "{old}"')


@contextlib.contextmanager
def fresh_database(template: str | None = None, *, contract: bool = True) -> Iterator[str]:
    """A database of this benchmark's own, dropped afterwards: a clone of the
    migrated template (`contract=False`: without the contract steps), or of
    `template` (a database a benchmark built, copied file by file). The admin
    URL is config.database_url() (DATABASE_URL overrides it)."""
    admin = config.database_url()
    source = template or _template(admin, contract)
    strategy = " STRATEGY = FILE_COPY" if template else ""
    name = f"cw_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"{strategy}')
    try:
        yield with_dbname(admin, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def vacuum_analyze(url: str) -> float:
    """What autovacuum would do after a bulk load, done now so that it does not
    start in the middle of a measurement; it also gives partition_leases the
    statistics a running system has (without them the firing transaction's
    verify_and_lock gets a nested-loop generic plan once psycopg prepares it).
    Returns seconds taken."""
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return time.monotonic() - t0


# -- jobs in bulk -----------------------------------------------------------


def create_tenants(conn: psycopg.Connection, n: int) -> list[dict]:
    classes = ["critical", "high", "normal", "low"]
    return [create_tenant(conn, f"bench-{i}", priority_classes=classes) for i in range(n)]


# Columns exactly as store/sql/jobs.sql insert_job writes them; anchor_at,
# last_instant, created_at and updated_at all take the job's creation instant.
_BULK_JOBS = """
WITH src AS (
    SELECT g, 'job_' || substr(md5(%(seed)s || g::text), 1, 20) AS job_id,
           (%(tenants)s::text[])[1 + g %% cardinality(%(tenants)s::text[])] AS tenant_id,
           %(created)s::timestamptz
             + interval '1 millisecond' * (g * %(spread)s / %(count)s) AS created
      FROM generate_series(%(start)s::bigint, %(stop)s::bigint - 1) AS g
), ins AS (
    INSERT INTO jobs (partition_id, job_id, tenant_id, name, schedule, target, payload,
                      priority, retry, timeout_ms, lease_ms, overlap, catchup, jitter_ms,
                      anchor_at, last_instant, created_at, updated_at)
    SELECT ((get_byte(d, 6) << 8) | get_byte(d, 7)) & 1023, job_id, tenant_id,
           %(name)s || '-' || g, %(schedule)s, %(target)s, %(payload)s, %(priority)s,
           %(retry)s, %(timeout_ms)s, %(lease_ms)s, %(overlap)s, %(catchup)s, %(jitter_ms)s,
           created, created, created, created
      FROM src, LATERAL (SELECT sha256(convert_to(job_id, 'UTF8')) AS d) h
    RETURNING partition_id, job_id, anchor_at, tenant_id
)
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
SELECT partition_id, 'job:' || job_id, 'job', job_id,
       COALESCE(%(at)s::timestamptz, anchor_at + interval '1 millisecond' * %(every_ms)s),
       %(prio)s, NULL, tenant_id
  FROM ins
"""


@dataclass(frozen=True)
class JobBatch:
    """`count` jobs of one shape. `at_ms` set: one-off jobs due then. Otherwise
    every_ms jobs created at created_ms + g * spread_ms / count (evenly over
    spread_ms, whatever the count), each first due every_ms after its own
    creation, as Jobs.create would make it."""

    count: int
    created_ms: int
    at_ms: int | None = None
    every_ms: int | None = None
    spread_ms: int = 1
    name: str = "bench"

    def body(self) -> dict:
        schedule = (
            {"at": iso(self.at_ms)} if self.at_ms is not None else {"every_ms": self.every_ms}
        )
        return {
            "name": self.name,
            "schedule": schedule,
            "target": {"type": "queue", "queue": "bench"},
            "payload": {"bench": True},
        }

    def first_due_ms(self) -> int:
        return self.at_ms if self.at_ms is not None else self.created_ms + self.every_ms


def bulk_jobs(conn: psycopg.Connection, tenants: list[dict], batch: JobBatch) -> str:
    """Insert the batch (jobs and their timers, CHUNK per transaction) and wake the
    timer service as Jobs.create does; returns the id seed (job ids are
    'job_' || md5(seed || g))."""
    seed = uuid.uuid4().hex
    spec = parse_job(batch.body(), now_ms=batch.created_ms)
    params = {
        **_spec_columns(spec),
        "seed": seed,
        "tenants": [t["tenant_id"] for t in tenants],
        "created": to_dt(batch.created_ms),
        "spread": max(1, batch.spread_ms),
        "count": batch.count,
        "at": None if batch.at_ms is None else to_dt(batch.at_ms),
        "every_ms": batch.every_ms or 0,
        "prio": PRIORITY_RANK[spec.priority],
    }
    for start in range(0, batch.count, CHUNK):
        stop = min(batch.count, start + CHUNK)
        with conn.transaction():
            conn.execute(_BULK_JOBS, {**params, "start": start, "stop": stop})
            conn.execute("SELECT pg_notify('cw_timers', %s::text)", [batch.first_due_ms()])
    return seed


def check_like_create(
    conn: psycopg.Connection, topics: Topics, tenants: list[dict], batch: JobBatch, seed: str
) -> None:
    """Compare bulk job 0 (and its timer) with what Jobs.create writes for the same
    body at the same instant, in a transaction that is rolled back."""
    job_id = "job_" + hashlib.md5((seed + "0").encode()).hexdigest()[:20]
    got_job, got_timer = _rows(conn, job_id)
    if got_job is None or got_timer is None:
        raise RuntimeError(f"bulk job {job_id} or its timer is missing")
    if got_job["partition_id"] != partition_of(job_id):
        raise RuntimeError(f"bulk partition {got_job['partition_id']} != partition_of({job_id})")
    with conn.transaction() as tx:
        made = Jobs(topics).create(conn, tenants[0], batch.body(), batch.created_ms)
        want_job, want_timer = _rows(conn, made["job_id"])
        raise psycopg.Rollback(tx)
    skip = {"partition_id", "job_id", "name", "timer_id", "owner_id"}
    for kind, got, want in (("job", got_job, want_job), ("timer", got_timer, want_timer)):
        diff = {k for k in want if k not in skip and want[k] != got[k]}
        if diff:
            raise RuntimeError(f"bulk {kind} row differs from Jobs.create in {sorted(diff)}")
    if got_timer["timer_id"] != job_timer_id(job_id):
        raise RuntimeError("bulk timer id is not job:<job_id>")


def _rows(conn: psycopg.Connection, job_id: str) -> tuple[dict | None, dict | None]:
    p = partition_of(job_id)
    cur = conn.execute("SELECT * FROM jobs WHERE partition_id = %s AND job_id = %s", [p, job_id])
    job = cur.fetchone()
    job = dict(zip([c.name for c in cur.description], job, strict=True)) if job else None
    cur = conn.execute(
        "SELECT * FROM timers WHERE partition_id = %s AND timer_id = %s", [p, job_timer_id(job_id)]
    )
    timer = cur.fetchone()
    timer = dict(zip([c.name for c in cur.description], timer, strict=True)) if timer else None
    return job, timer


# -- services ---------------------------------------------------------------


def release_env(tree: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment of a process of the release exported in `tree`, as
    make test-upgrade runs one (tests/upgrade/previous.py)."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    from tests.upgrade import previous  # this checkout's tests, not the release's

    return previous.env(tree, base)


class Services:
    """`cronwheel serve <name>` processes, one per service, against one database
    and topic prefix; stopped with SIGTERM (their own clean shutdown) on exit."""

    def __init__(
        self,
        url: str,
        prefix: str,
        names: tuple[str, ...] = ("timer", "relay"),
        tree: Path | None = None,
    ):
        """`tree`: an earlier release's exported tree (tests/upgrade/previous.py)
        whose services run instead of this checkout's."""
        self.url = url
        self.prefix = prefix
        self.names = names
        self.tree = tree
        self.procs: dict[str, subprocess.Popen] = {}
        self.logdir = Path(tempfile.mkdtemp(prefix="cw-bench-"))

    def __enter__(self) -> Services:
        env = {k: v for k, v in os.environ.items() if k != "CRONWHEEL_METRICS_PORT"}
        env.update(
            DATABASE_URL=config.role_url(self.url, config.PG_PLATFORM_USER),  # not the owner
            KAFKA_BOOTSTRAP=config.kafka_bootstrap(),
            CRONWHEEL_TOPIC_PREFIX=self.prefix,
            CRONWHEEL_LOG_LEVEL=os.environ.get("CRONWHEEL_LOG_LEVEL", "WARNING"),
        )
        if self.tree is not None:
            env = release_env(self.tree, env)
        for i, name in enumerate(self.names):
            # A service named more than once runs as that many instances:
            # `dispatcher`, `dispatcher2`, ...
            copies = self.names[: i + 1].count(name)
            key = name if copies == 1 else f"{name}{copies}"
            log = open(self.logdir / f"{key}.log", "wb")  # noqa: SIM115 - kept by the process
            self.procs[key] = subprocess.Popen(
                [sys.executable, "-m", "services.entrypoints", "serve", name],
                cwd=self.tree or ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_ready()
            self.pids = self._pids()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _pids(self) -> dict[str, int]:
        """The processes whose CPU a figure is printed beside: each service, the
        PostgreSQL backends serving it, this process (the reader) and the broker."""
        pids = {n: p.pid for n, p in self.procs.items()}
        with psycopg.connect(self.url, autocommit=True) as conn:
            backends = conn.execute(
                "SELECT client_port, pid FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchall()
        for name, proc in self.procs.items():
            ports = local_ports(proc.pid)
            for i, (_port, pid) in enumerate(b for b in backends if b[0] in ports):
                pids[f"{name}-pg{i}"] = pid
        pids["bench-reader"] = os.getpid()
        if broker := kafka_broker_pid():
            pids["kafka-broker(shared)"] = broker
        return pids

    def _wait_ready(self, timeout: float = 60.0) -> None:
        """Ready when the timer and relay (those that lease) hold all 1024
        partitions (the database is ours); the others once they are up."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.url, autocommit=True) as conn:
            while True:
                self.check_alive()
                held = dict(
                    conn.execute(
                        "SELECT service, count(*) FROM partition_leases"
                        " WHERE owner IS NOT NULL AND expires_at > now() GROUP BY service"
                    ).fetchall()
                )
                leasing = [n for n in self.names if n in ("timer", "relay")]
                if all(held.get(n, 0) == 1024 for n in leasing):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"services not ready after {timeout}s: {held}")
                time.sleep(0.05)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"service {name} exited with {p.returncode}:\n{tail}")

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process in `pids`, PostgreSQL backends summed
        per service (`timer-pg` covers both of the timer's connections)."""
        out: dict[str, float] = {}
        for name, pid in self.pids.items():
            key = name.split("-pg")[0] + "-pg" if "-pg" in name else name
            out[key] = out.get(key, 0.0) + cpu_seconds(pid)
        return out

    def __exit__(self, *exc) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        clean = True
        for p in self.procs.values():
            try:
                clean = p.wait(20) == 0 and clean
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
                clean = False
        # CW_BENCH_KEEP_LOGS=1 keeps them after a clean run too (to read them).
        if clean and exc[0] is None and not os.environ.get("CW_BENCH_KEEP_LOGS"):
            shutil.rmtree(self.logdir, ignore_errors=True)
        else:
            say(f"service logs kept in {self.logdir}")


@contextlib.contextmanager
def firing_beside(spread_ms: int, tenants: int = 10, jobs: int = 1000) -> Iterator[None]:
    """The firing's database work, without its Kafka hop: a fresh database,
    `jobs` jobs every second of `tenants` tenants (anchors over `spread_ms`),
    and `cronwheel serve timer` firing them (runs and outbox rows made, as in
    bench_firing_steady.py; no relay, so the rows stay). What the firing path
    does beside the broker that Kafka alone does not; prints the timer's and
    its backends' CPU over the block on exit."""
    prefix = f"beside{uuid.uuid4().hex[:8]}"
    grant(prefix)
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            made = create_tenants(conn, tenants)
            bulk_jobs(
                conn, made, JobBatch(jobs, now_ms() - 1000, every_ms=1000, spread_ms=spread_ms)
            )
        vacuum_analyze(url)
        with Services(url, prefix, ("timer",)) as services:
            cpu0, t0 = services.cpu(), time.monotonic()
            yield
            cpu1, dt = services.cpu(), time.monotonic() - t0
            shares = ", ".join(
                f"{k} {100 * (cpu1[k] - cpu0[k]) / dt:.0f}%" for k in cpu1 if k.startswith("timer")
            )
            say(f"beside: the firing's database work over {dt:.0f} s, CPU of one core: {shares}")


# -- Kafka ------------------------------------------------------------------
#
# The broker authenticates every client and allows each principal only what
# cronwheel.principals grants its role, so every client here is the platform
# role whose part it plays: the relay writes run topics, the dispatcher creates
# run and queue (webhook, managed) topics and writes queue topics, the observer
# reads for measurement (its consumer groups start OBSERVER_GROUPS), each
# service describes its own consumer group. The admin principal only grants
# the platform's ACLs for a benchmark's own topic prefix and deletes its
# topics afterwards, as an operator would.

OBSERVER_GROUPS = "cronwheel-observer."  # the observer's consumer group prefix


def observer_group(name: str = "bench") -> str:
    """A fresh consumer group id the observer principal may use."""
    return f"{OBSERVER_GROUPS}{name}-{uuid.uuid4().hex[:8]}"


def authenticated() -> bool:
    """Whether the broker takes only authenticated clients (the local stack's
    does); a broker named by KAFKA_BOOTSTRAP without SASL has no ACLs."""
    return "sasl.username" in kafka.security("admin", config.kafka_bootstrap())


def grant(prefix: str) -> None:
    """The platform roles' ACLs for the benchmark's own topic prefix, as
    `cronwheel up` grants them for the stack's `cw` (the principals exist
    already); revoked when the benchmark's process exits. Nothing to do on a
    broker without SASL."""
    if not authenticated():
        return
    principals.grant_platform(kafka.admin(principal="admin"), prefix)
    atexit.register(_revoke, prefix)


def _revoke(prefix: str) -> None:
    """The bindings `grant` made on the prefix's own resources, each exactly.
    Not principals.delete_acls_on_prefixes: it also deletes the bindings every
    prefix's grant shares (the observer's consumer groups, `cronwheel-observer.`),
    which the stack's `cw` and every other user of the broker still need."""
    mine = [
        AclBindingFilter(
            b.restype,
            b.name,
            b.resource_pattern_type,
            b.principal,
            b.host,
            b.operation,
            b.permission_type,
        )
        for b in principals.platform_bindings(prefix)
        if b.name.startswith(f"{prefix}.")
    ]
    try:
        client = kafka.admin(principal="admin")
        for fut in client.delete_acls(mine, request_timeout=30).values():
            fut.result(30)
    except Exception as e:  # the figures stand; a leftover ACL names a deleted prefix
        say(f"warning: could not delete the ACLs of prefix {prefix}: {e}")


def completions_topic(topics: Topics) -> None:
    """The run-completed topic, created by the relay's principal (it may):
    the relay publishes every run's completion there, and only the workflow
    service creates it otherwise; a benchmark that completes runs without it
    running would leave the relay producing to a topic that does not exist."""
    kafka.ensure_topics([topics.run_completed], principal="relay")


def tenant_kafka(topics: Topics, tenant_id: str) -> dict[str, str]:
    """An SDK Worker's Kafka credentials for a tenant made through the store
    (create_tenant, which makes no principal): the tenant's principal and ACLs
    made by the gateway's principal as `POST /v1/tenants` makes them, removed
    when the process exits. As Worker keyword arguments; {} on a broker
    without SASL."""
    if not authenticated():
        return {}
    password = principals.provision_tenant(kafka.admin(principal="gateway"), topics, tenant_id)
    atexit.register(_remove_tenant, tenant_id)
    return {"kafka_username": principals.tenant_username(tenant_id), "kafka_password": password}


def _remove_tenant(tenant_id: str) -> None:
    try:
        principals.remove_tenant(kafka.admin(principal="gateway"), tenant_id)
    except Exception as e:  # a leftover principal can read nothing once the topics are gone
        say(f"warning: could not remove tenant {tenant_id}'s Kafka principal: {e}")


@dataclass
class Arrival:
    received_ms: float  # now_precise_ms(): a lateness is read below the millisecond
    scheduled_ms: int | None = None
    created_ms: int | None = None
    produced_ms: int | None = None  # the record's timestamp: when its producer took it


def group_spread(group: str, members: int, role: str, timeout: float = 60) -> list[int]:
    """Partitions held by each member of consumer group `group` (the service
    `role`'s own, described by that role's principal) once it has `members`
    members that each hold some: a process that joins seconds after the
    others may find them holding every partition, and a burst measured then
    is one process's rate."""
    client = kafka.admin(principal=role)
    deadline = time.monotonic() + timeout
    while True:
        desc = client.describe_consumer_groups([group])[group].result(timeout=10)
        held = sorted(len(m.assignment.topic_partitions) for m in desc.members)
        if len(held) >= members and all(held):
            return held
        if time.monotonic() > deadline:
            raise RuntimeError(f"group {group}: partitions held {held} after {timeout:.0f} s")
        time.sleep(0.2)  # polling the group's state with a deadline


def topics_ready(client, topics: list[str], timeout: float = 30) -> dict:
    """The topics' metadata (from a consumer, producer or admin client) once the
    broker lists every one with partitions that all have a leader: just after
    creation, or a broker restart, some are missing or leaderless, and records
    sent to them wait in the producer."""
    deadline = time.monotonic() + timeout
    while True:
        meta = client.list_topics(timeout=10).topics
        missing = [
            t
            for t in topics
            if t not in meta
            or not meta[t].partitions
            or any(p.leader < 0 for p in meta[t].partitions.values())
        ]
        if not missing:
            return meta
        if time.monotonic() > deadline:
            raise RuntimeError(f"no leaders for {missing[:3]} after {timeout:.0f} s")
        time.sleep(0.2)  # polling the broker's metadata with a deadline


class GcPauses:
    """The cyclic garbage collector's passes in this process of at least
    `at_least_ms`, each (the wall clock at its start in ms, generation, ms):
    a pass holds the interpreter, so a reader stamps what it reads late by
    as long (while active: gc.callbacks is the process's)."""

    def __init__(self, at_least_ms: float = 5.0):
        self.at_least_ms = at_least_ms
        self.passes: list[tuple[int, int, float]] = []
        self._began = 0.0

    def _watch(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = 1000 * (time.perf_counter() - self._began)
        if took >= self.at_least_ms:
            self.passes.append((now_ms() - round(took), info["generation"], took))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._watch)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._watch)

    def describe(self, since_ms: int = 0) -> str:
        mine = [p for p in self.passes if p[0] >= since_ms]
        if not mine:
            return f"none of {self.at_least_ms:.0f} ms or more"
        return ", ".join(f"{time_of_day(at)} gen{g} {ms:.0f} ms" for at, g, ms in mine)


def time_of_day(ms: float) -> str:
    """A wall-clock time in ms as HH:MM:SS.mmm UTC, to set a benchmark's
    moments beside other logs."""
    return f"{time.strftime('%H:%M:%S', time.gmtime(ms / 1000))}.{int(ms) % 1000:03d} UTC"


class Reader:
    """Reads every partition of `topics` from the beginning in a thread and notes,
    per record key (run_id), the wall clock at which it was first readable.
    With decode=True it also keeps the record's scheduled_at and created_at,
    decoded when asked for (`arrivals`, `snapshot`), not in the reading
    thread: decoding a burst of 1,000 records there delayed the stamps of the
    records fetched behind it."""

    def __init__(self, topics: list[str], decode: bool = False):
        # Run and queue topics: the dispatcher creates them, laid out as the
        # platform lays them out; the observer reads.
        ensure_tenant_topics(topics)
        self.consumer = kafka.consumer(observer_group(), principal="observer")
        meta = topics_ready(self.consumer, topics)
        self.consumer.assign(
            [
                TopicPartition(t, p, OFFSET_BEGINNING)
                for t in topics
                for p in sorted(meta[t].partitions)
            ]
        )
        self.decode = decode
        self._arrivals: dict[bytes, Arrival] = {}
        self._undecoded: list[tuple[bytes, bytes]] = []  # (key, value), decode=True
        self.duplicates = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="bench-reader")
        self.gc_pauses = GcPauses()

    def __enter__(self) -> Reader:
        self.gc_pauses.__enter__()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            # poll() returns on the first record; consume() with a timeout would
            # wait out the timeout for a full batch, so it only drains what is there.
            first = self.consumer.poll(0.05)
            if first is None:
                continue
            at = now_precise_ms()
            for m in [first, *self.consumer.consume(num_messages=2000, timeout=0)]:
                if m.error():
                    self.errors.append(str(m.error()))
                    continue
                key = m.key()
                if key in self._arrivals:
                    self.duplicates += 1
                    continue
                with self._lock:
                    self._arrivals[key] = Arrival(at, produced_ms=m.timestamp()[1])
                    if self.decode:
                        self._undecoded.append((key, m.value()))
            # What is read stays: left out of the collector's later passes,
            # or a full pass over tens of thousands of arrivals holds this
            # thread 40-45 ms and stamps the records behind it that late (a
            # dispatcher's heap is frozen once it is made, and holds no such
            # pile: runtime.freeze_heap).
            gc.freeze()

    @property
    def arrivals(self) -> dict[bytes, Arrival]:
        """Per record key, its arrival (decoded if asked for)."""
        with self._lock:
            self._decode_pending()
            return self._arrivals

    def _decode_pending(self) -> None:
        """With the lock held."""
        if self._undecoded:
            decode = default_registry().decode
            for key, value in self._undecoded:
                _name, datum = decode(value)
                a = self._arrivals[key]
                a.scheduled_ms, a.created_ms = datum["scheduled_at"], datum["created_at"]
            self._undecoded.clear()

    def count(self) -> int:
        return len(self._arrivals)

    def snapshot(self) -> list[Arrival]:
        """Arrivals in the order they were read."""
        with self._lock:
            self._decode_pending()
            return list(self._arrivals.values())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self.gc_pauses.__exit__(*exc)
        gc.unfreeze()
        self.consumer.close()
        if self.errors:
            say(f"reader: {len(self.errors)} consumer errors, the first: {self.errors[0]}")


def prefix_topics(prefix: str) -> list[str]:
    """The topics of a benchmark's own prefix, to delete them (by the admin
    principal, as delete_topics)."""
    names = kafka.admin(principal="admin").list_topics(timeout=30).topics
    return sorted(n for n in names if n.startswith(prefix + "."))


def broker_log_dirs(pid: int) -> list[Path]:
    """The log directories of the broker process `pid`, from the properties
    file its command line names."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    for arg in args:
        if arg.endswith(".properties") and not arg.startswith("-"):
            for line in Path(arg).read_text().splitlines():
                if line.startswith("log.dirs="):
                    return [Path(d) for d in line.split("=", 1)[1].split(",")]
    return []


def wait_deletions_done(timeout_s: float = 180.0) -> None:
    """Wait until the broker has removed the logs of the topics deleted so
    far. A deleted topic's partitions are renamed `*-delete` and removed
    `file.delete.delay.ms` (60 s) later: a step measured right after the last
    step's thousands of topics were deleted counted the broker removing
    them (163% of a core at the 3,000-tenant step's start, once). Reported,
    not raised, when the broker's directories cannot be read or the wait
    runs out."""
    pid = kafka_broker_pid()
    dirs = broker_log_dirs(pid) if pid else []
    if not dirs:
        say("warning: the broker's log directories are unknown: not waiting for its deletions")
        return
    t0 = time.monotonic()
    pending = 0
    while time.monotonic() - t0 < timeout_s:
        pending = sum(
            1 for d in dirs if d.is_dir() for e in os.scandir(d) if e.name.endswith("-delete")
        )
        if not pending:
            if time.monotonic() - t0 > 1:
                say(f"waited {time.monotonic() - t0:.0f} s for the broker to remove deleted topics")
            return
        time.sleep(1)  # polled: the broker removes them on its own schedule
    say(f"warning: {pending} deleted partitions still on the broker's disk after {timeout_s:.0f} s")


def starting_partitions(name: str) -> int:
    """The partitions the platform makes topic `name` with (Topics.partitions:
    one for a tenant's run or queue topic), for a benchmark's topic named under
    a prefix of its own (no dot in it)."""
    return Topics(name.split(".", 1)[0]).partitions(name)


def ensure_tenant_topics(names: list[str]) -> None:
    """Tenants' topics that do not exist yet, made as the platform makes them
    (`starting_partitions`) by the dispatcher's principal. A benchmark that made
    them with more partitions than the platform does would measure another
    layout: more partitions to produce to, fetch and answer for."""
    by_count: dict[int, list[str]] = {}
    for name in names:
        by_count.setdefault(starting_partitions(name), []).append(name)
    for partitions, group in by_count.items():
        create_topics(group, partitions=partitions)


def create_topics(names: list[str], partitions: int = kafka.RUN_PARTITIONS) -> None:
    """Tenants' topics as the dispatcher makes them (its principal), 500 to a
    CreateTopics request."""
    for i in range(0, len(names), 500):
        kafka.ensure_topics(names[i : i + 500], partitions=partitions, principal="dispatcher")


def make_run_topics(count: int) -> list[str]:
    """`count` topics laid out as tenants' run topics, under a fresh prefix the
    platform's roles are granted; deleted again if making them fails."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    grant(prefix)
    topics = [f"{prefix}.runs.t{i}" for i in range(count)]
    try:
        create_topics(topics)
    except BaseException:
        delete_topics(topics)
        raise
    return topics


def delete_topics(topics: list[str]) -> None:
    """The benchmark's own topics (unique prefix), so runs do not pile up on the
    shared broker. A failure is reported, not raised: the figures stand."""
    client = kafka.admin(principal="admin")  # kept referenced until every future is done
    for name, fut in client.delete_topics(topics, operation_timeout=30).items():
        try:
            fut.result()
        except Exception as e:
            say(f"warning: could not delete topic {name}: {e}")


# -- a storm ----------------------------------------------------------------


@dataclass
class StormResult:
    jobs: int
    insert_s: float
    slack_ms: int  # from the commit of the jobs to their due instant
    # first firing (the due instant, or before it when the timer fires ahead)
    # -> every record readable and the outbox empty
    total_s: float
    timer_first_ms: int  # due instant -> the firing loop's first batch started
    timer_last_ms: int  # due instant -> its last batch started
    first_record_ms: int
    last_record_ms: int
    outbox_empty_ms: int
    duplicates: int
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.total_s

    def lines(self, label: str) -> list[str]:
        per_run = ", ".join(f"{n} {s * 1e6 / self.jobs:.0f}" for n, s in self.cpu.items())
        serial = self.cpu.get("timer", 0) + self.cpu.get("timer-pg", 0)
        wall = self.total_s
        return [
            f"{label}: {self.jobs} runs in {wall:.2f} s from the first firing (or the due"
            f" instant if later) to the last record readable and the outbox empty"
            f" = {self.rate:,.0f} runs/s end to end",
            f"{label}:   timer batches started {self.timer_first_ms:+} .. {self.timer_last_ms:+} ms"
            f" from the due instant (~{self.jobs / max(self.timer_last_ms - min(self.timer_first_ms, 0), 1) * 1000:,.0f}"
            " runs/s created);"
            f" records readable +{self.first_record_ms} .. +{self.last_record_ms} ms;"
            f" outbox empty +{self.outbox_empty_ms} ms; duplicates read {self.duplicates}",
            f"{label}:   CPU us per run (above each process's idle rate): {per_run}",
            f"{label}:   the timer and its backends were on CPU {serial:.1f} s of {wall:.1f} s"
            f" ({100 * serial / wall:.0f}%); with a core each and no waiting their serial"
            f" path would allow ~{self.jobs / max(serial, 1e-9):,.0f} runs/s",
            f"{label}:   {self.jobs} jobs inserted in {self.insert_s:.1f} s, committed"
            f" {self.slack_ms} ms before the due instant (then VACUUM ANALYZE)",
        ]


def storm(
    url: str,
    services: Services,
    reader: Reader,
    tenants: list[dict],
    topics: Topics,
    count: int,
    lead_ms: int = 3000,
    timeout_s: float = 150.0,
) -> StormResult:
    """`count` one-off jobs due together `lead_ms` after their insert is expected
    to commit; measured until every record is readable and the outbox is empty.
    VACUUM (ANALYZE) runs after the insert, as autovacuum would soon after a bulk
    load, so that it does not start in the middle of the storm."""
    # Counted before the insert: the services run meanwhile, so a storm the
    # VACUUM outlasts starts firing before the wait below begins.
    before = reader.count()
    with psycopg.connect(url, autocommit=True) as conn:
        start = now_ms()
        expected_insert_ms = count // 10  # 10k jobs/s with margin; printed as slack
        due = start + expected_insert_ms + lead_ms
        batch = JobBatch(count, created_ms=start, at_ms=due, name=f"storm{count}")
        seed = bulk_jobs(conn, tenants, batch)
        committed = now_ms()
        check_like_create(conn, topics, tenants, batch, seed)
        vacuum_analyze(url)
        if now_ms() > due - 200:
            say(f"warning: insert and VACUUM ended {now_ms() - due} ms after due - 200 ms")
        want = before + count
        # The timer may fire ahead of the instant (CRONWHEEL_FIRE_AHEAD_MS): the
        # idle window ends, and CPU counting starts, that far before it.
        work_from = due - config.fire_ahead_ms()
        idle0, idle_from = services.cpu(), time.monotonic()
        while now_ms() < work_from:
            services.check_alive()
            time.sleep(0.01)
        cpu0 = services.cpu()
        idle_s = time.monotonic() - idle_from
        deadline = time.monotonic() + timeout_s
        while reader.count() < want:
            services.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {reader.count() - before}/{count} records in {timeout_s}s"
                )
            time.sleep(0.005)
        while conn.execute("SELECT EXISTS (SELECT 1 FROM outbox)").fetchone()[0]:
            if time.monotonic() > deadline:
                raise RuntimeError("the outbox did not drain")
            time.sleep(0.005)
        empty = now_ms()
        cpu1 = services.cpu()
        first, last = conn.execute(
            "SELECT min(created_at), max(created_at) FROM runs_daily WHERE scheduled_at = %s",
            [to_dt(due)],
        ).fetchone()
        n_runs = conn.execute(
            "SELECT count(*) FROM runs_daily WHERE scheduled_at = %s", [to_dt(due)]
        ).fetchone()[0]
    if n_runs != count:
        raise RuntimeError(f"{n_runs} runs for {count} due jobs")
    times = sorted(a.received_ms for a in reader.snapshot()[before:])
    end = max(times[-1], empty)
    wall = (end - min(due, to_ms(first))) / 1000
    # CPU above what each process burns idle (measured in the lead before due).
    idle_rate = {n: (cpu0[n] - idle0[n]) / idle_s if idle_s >= 0.5 else 0.0 for n in cpu0}
    counted_s = (end - work_from) / 1000
    cpu = {n: cpu1[n] - cpu0[n] - idle_rate[n] * counted_s for n in cpu1}
    return StormResult(
        jobs=count,
        insert_s=(committed - start) / 1000,
        slack_ms=due - committed,
        total_s=wall,
        timer_first_ms=to_ms(first) - due,
        timer_last_ms=to_ms(last) - due,
        first_record_ms=times[0] - due,
        last_record_ms=times[-1] - due,
        outbox_empty_ms=empty - due,
        duplicates=reader.duplicates,
        cpu=cpu,
    )


def now_precise_ms() -> float:
    """The wall clock in milliseconds with its fraction. A lateness of a few
    milliseconds read in whole ones is off by up to one (a stamp truncated to
    its millisecond): the figure issue 21 holds to 1.5x a floor of 3 ms."""
    return time.time() * 1000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, min(len(s), math.ceil(q / 100 * len(s))) - 1)]


def describe(values: list[float]) -> str:
    """p50, p99, max and mean in ms; an infinite value stands for a missing record."""
    return (
        f"p50 {percentile(values, 50):.1f} ms, p99 {percentile(values, 99):.1f} ms,"
        f" max {max(values):.1f} ms, mean {statistics.fmean(values):.1f} ms"
    )


def header(title: str) -> None:
    say(f"{title} (python {sys.version.split()[0]}, pid {os.getpid()})")
    say(f"machine: {machine_load()}")


# Finished runs of one tenant, `n` of them, spread over the days before
# `until` (`per_day` a day), into `target` (runs_daily; runs for the backfill).
_RUNS_SQL = """
INSERT INTO {target} (partition_id, run_id, tenant_id, job_id, scheduled_at, spec, state,
                      attempt, start_token, lease_expires_at, created_at, started_at,
                      finished_at, updated_at)
SELECT g %% 1024, lpad(to_hex(g %% 1024), 3, '0') || substr(md5(%(seed)s || g::text), 1, 29),
       %(tenant)s, 'job_bench', s, '{{}}'::jsonb, %(state)s::run_state, 1,
       CASE WHEN %(state)s = 'RUNNING' THEN 'tok' END,
       CASE WHEN %(state)s = 'RUNNING' THEN s + interval '1 hour' END, s, s,
       CASE WHEN %(state)s = 'RUNNING' THEN NULL ELSE s END, s
  FROM generate_series(0, %(n)s - 1) AS g,
       LATERAL (SELECT %(until)s::timestamptz
                       - interval '1 day' * (1 + g / %(per_day)s)
                       + interval '1 millisecond' * (g %% %(per_day)s)
                         * (86400000 / %(per_day)s) AS s) t
"""


def load_runs(conn, target: str, tenant: str, n: int, per_day: int, until,
                       state: str = "SUCCEEDED") -> None:  # fmt: skip
    """`n` runs of `tenant` in `target` (runs_daily, or the legacy runs), `per_day`
    a day over the days before `until`, in one INSERT ... SELECT: finished, or
    RUNNING with a lease an hour long (`state`)."""
    conn.execute(
        _RUNS_SQL.format(target=target),
        {"seed": uuid.uuid4().hex, "tenant": tenant, "n": n, "per_day": per_day,
         "until": until, "state": state},
    )  # fmt: skip


def keep_history(conn, tenant_id: str, days: int, per_day: int) -> int:
    """`days` days of `per_day` finished runs before today in runs_daily, each
    day its partition, and today's and a week ahead made: the partitions a
    lookup of a run, or a probe of every day, meets. Returns how many
    partitions runs_daily has (the default one of them)."""
    today = datetime.now(UTC).date()
    runs_daily.ensure_days(conn, [today - timedelta(days=i) for i in range(1, days + 1)])
    runs_daily.ensure_ahead(conn, today, 7)
    if days:
        midnight = datetime.combine(today, datetime.min.time(), tzinfo=UTC)
        load_runs(conn, "runs_daily", tenant_id, days * per_day, per_day, midnight)
    return conn.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'runs_daily'::regclass"
    ).fetchone()[0]
