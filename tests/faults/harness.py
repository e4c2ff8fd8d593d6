"""The fault harness (issue 26): the platform on a private stack, a load whose
history is known in advance, faults on a schedule, and one checker over the
whole history at the end. After Kafka's system tests (hard bounces, then
input == output, zero duplicates) and Jepsen (a fault schedule, then a checker).

What a scenario gets
  * `PrivateStack`: PostgreSQL and Kafka of its own, started with `cronwheel up`
    under a temporary CRONWHEEL_HOME on ports 26432 (PostgreSQL), 29392 and
    29393 (Kafka, controller). The faults kill and restart these servers, so
    they are never the shared dev stack (25432 / 29092) that other tests use.
    A file lock lets one harness at a time own those ports. Kafka's clients
    are made only through cronwheel.kafka and topics only by the services, so
    the stack's own choice of listener security carries over unchanged.
  * `Platform`: gateway, timer, relay and dispatcher as processes
    (tests.support.procs), one tenant, and an SDK worker process
    (tests/faults/worker.py) whose handler appends a line to an effect log for
    every execution, duplicates included; with the webhook service in the
    layout, a receiver (tests/faults/receiver.py) logging each delivery there
    too; with the executor, its log of the commands it ran read into it at
    the end (tests/faults/executions.py).
  * `Load`: every_ms jobs (their instants are anchor + k * every_ms, so the
    expected history is computed, not recorded), a webhook job, a managed job
    and a diamond workflow when the layout runs those services, and manual
    triggers, each
    posted with an Idempotency-Key and retried with it until answered, so a
    trigger the user saw answered has exactly one run.
  * `check`: every expected instant up to the end of the load has exactly one
    run (its id hash(job, instant)), every answered trigger exactly one; every
    run ended SUCCEEDED (the handler never fails); each (run, attempt) began at
    most once; each successful run's effect happened exactly once; no handler
    began before its run's instant and no StartRun was refused as not due yet
    (clock skew); the outbox is empty. With a workflow in the load (the
    replays), every instant of it has one workflow run, SUCCEEDED, whose
    nodes each ran once and whose counters (pending_deps, nodes_left) are 0.
    `Report` holds the figures `make chaos` prints.
  * A scenario's layout: which service instances run, with what environment
    (a second timer; a service under libfaketime, tests/faults/clockskew.py).
    tests/faults/netcut.py cuts one process off from one port.

A scenario (tests/faults/scenarios.py) runs the load, applies its fault a
number of times, asserts each time that the fault landed (e.g. the broker was
dead while the outbox grew: the relay's produces had nowhere to go), measures
the seconds from the server's return until the platform has caught up, and
ends with the checker. The short version runs in `make test`
(tests/faults/short.py, in two halves on two stacks), the long one in `make chaos` (python -m
tests.faults). docs/reliability.md has the table and what each fault can lose.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from cronwheel.core.clock import to_ms
from cronwheel.core.ids import run_id_for_instant, run_id_for_node
from cronwheel.core.workflows import workflow_run_id_for_instant
from cronwheel.stack.postgres import SERVICE_USER, data_root, ensure_installed
from cronwheel.stack.process import as_user, is_root, pid_alive, read_pid, stop_pid
from tests.faults import diskfull, effect_log
from tests.faults.executions import log_executions
from tests.faults.receiver import Receiver
from tests.support import db as dbsupport
from tests.support.kafka import worker_env
from tests.support.procs import PYTHON, ROOT, Launcher, ServiceProc
from tests.support.wait import wait_for

PORTS = {
    "CRONWHEEL_PG_PORT": 26432,
    "CRONWHEEL_KAFKA_PORT": 29392,
    "CRONWHEEL_KAFKA_CONTROLLER_PORT": 29393,
}
# Two private stacks may run at once, each on its slot's ports (PORTS + 10 *
# slot) under its own lock: `make test` runs the short scenarios in two halves
# on two pytest workers, as they mostly wait on outages and recoveries.
SLOTS = 2
# Variables that would point `cronwheel up` (or the owner's URL) at other servers.
_FOREIGN = ("DATABASE_URL", "KAFKA_BOOTSTRAP", "CRONWHEEL_ADMIN_DATABASE_URL", "CRONWHEEL_HOME")


def _lock_path(slot: int) -> Path:
    return Path(tempfile.gettempdir()) / f"cronwheel-faults-{slot}.lock"


OPERATOR_KEY = "cwop_faults_" + uuid.uuid4().hex
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED")
CATCHUP = {"window_ms": 120_000, "policy": "all", "max_runs": 1000}
LEASE_MS = 5000  # a run's lease: the SDK heartbeats it, the platform expires it
RETRY = {"max_attempts": 20, "initial_backoff_ms": 100, "max_backoff_ms": 1000}
SERVICES = ("gateway", "timer", "relay", "dispatcher")  # a scenario's default layout
# The services that log their consumer's state on SIGUSR2 (cronwheel.consumer).
DESCRIBING = frozenset({"dispatcher", "workflow", "executor"})


class PrivateStack:
    """PostgreSQL and Kafka of the harness's own, which its faults may crash."""

    def __init__(self, slot: int = 0) -> None:
        assert 0 <= slot < SLOTS, f"slot {slot}: the harness has {SLOTS}"
        self.ports = {name: port + 10 * slot for name, port in PORTS.items()}
        self._lock = open(_lock_path(slot), "w")  # noqa: SIM115 - held for the stack's life
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # another harness holds the ports: wait
        self.home = Path(tempfile.mkdtemp(prefix="cw-faults-"))
        self.home.chmod(0o755)  # PostgreSQL's user (we may be root) reaches home/pg
        self.env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        self.env.update({k: str(v) for k, v in self.ports.items()}, CRONWHEEL_HOME=str(self.home))
        self.pg_data = data_root(self.home) / "data"
        self.admin_url = ""
        self.kafka_bootstrap = ""
        # Each server's data directory a filesystem of its own where this
        # machine allows (tests/faults/diskfull.py fills and shrinks them).
        self.mounts = [
            d for d in (self.home / "kafka" / "data", self.pg_data) if diskfull.own_filesystem(d)
        ]

    def up(self) -> None:
        """Start whichever server is down (`cronwheel up` is idempotent)."""
        out = subprocess.run(
            [PYTHON, "-m", "services.entrypoints", "up", "--json"],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if out.returncode != 0:
            raise RuntimeError(f"private stack did not start: {out.stderr.strip()[-500:]}")
        status = json.loads(out.stdout)
        self.admin_url = status["admin_database_url"]
        self.kafka_bootstrap = status["kafka_bootstrap"]

    # -- Kafka ----------------------------------------------------------------
    def _kafka_admin_principal(self):
        """The private broker's admin principal (the password from the private
        stack's credentials file, when it has one)."""
        from cronwheel import kafka, principals

        creds = self.home / "kafka" / "principals.json"
        if not creds.exists():  # a broker without authentication
            return "admin"
        password = json.loads(creds.read_text())["passwords"]["admin"]
        return kafka.Credentials(principals.ADMIN, password)

    def kafka_admin(self):
        """An admin client of the private broker, as its admin principal."""
        from cronwheel import kafka

        return kafka.admin(self.kafka_bootstrap, principal=self._kafka_admin_principal())

    def kafka_consumer(self, group: str):
        """A consumer of the private broker as its admin principal (it reads
        any topic), committing nothing unless told."""
        from cronwheel import kafka

        return kafka.consumer(group, self.kafka_bootstrap, principal=self._kafka_admin_principal())

    def kafka_pid(self) -> int | None:
        pid = read_pid(self.home / "kafka" / "kafka.pid")
        return pid if pid_alive(pid) else None

    def kill_kafka(self) -> int:
        """kill -9 the broker: no log flush, no controlled shutdown."""
        pid = self.kafka_pid()
        assert pid, "the private broker is not running"
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, 0.05, "the broker to die")
        return pid

    def stop_kafka(self) -> int:
        """A graceful broker stop (SIGTERM: controlled shutdown, logs flushed)."""
        pid = self.kafka_pid()
        assert pid, "the private broker is not running"
        stop_pid(pid, timeout=60)
        return pid

    # -- PostgreSQL -----------------------------------------------------------
    def pg_pid(self) -> int | None:
        pid = read_pid(self.pg_data / "postmaster.pid")
        return pid if pid_alive(pid) else None

    def pg_ctl_stop(self, mode: str) -> None:
        """`pg_ctl stop -m MODE`; `immediate` is a crash: no checkpoint, and WAL
        not yet written from shared memory is gone."""
        owner = SERVICE_USER if is_root() else None
        argv = [str(ensure_installed() / "pg_ctl"), "-D", str(self.pg_data), "-m", mode, "-w"]
        subprocess.run(as_user(owner, [*argv, "stop"]), check=True, capture_output=True, timeout=60)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if pid := self.kafka_pid():
                stop_pid(pid, timeout=30)
        with contextlib.suppress(Exception):
            if self.pg_pid():
                self.pg_ctl_stop("fast")
        for mount in self.mounts:
            with contextlib.suppress(Exception):
                diskfull.unmount(mount)
        shutil.rmtree(self.pg_data.parent, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)
        self._lock.close()


@contextlib.contextmanager
def private_stack(slot: int = 0):
    st = PrivateStack(slot)
    try:
        st.up()
        yield st
    finally:
        st.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Platform:
    """One scenario's database (cloned on the private server), services, tenant,
    and SDK worker writing the effect log."""

    def __init__(
        self, stack: PrivateStack, log_dir: Path, layout: dict[str, tuple[str, dict]] | None = None
    ):
        self.stack = stack
        # {instance: (service, its extra environment)}: which processes run,
        # e.g. a second timer, or a gateway whose clock is skewed.
        self.layout = layout or {name: (name, {}) for name in SERVICES}
        template = dbsupport.template(stack.admin_url)
        self.db_name = dbsupport.clone(stack.admin_url, template)
        self.database_url = dbsupport.platform_url(
            dbsupport.with_dbname(stack.admin_url, self.db_name)
        )
        self.topic_prefix = f"f{uuid.uuid4().hex[:10]}"
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.env = {
            "CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}",
            "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY,
            # The private stack's home: its Kafka principals' passwords are there.
            "CRONWHEEL_HOME": str(stack.home),
            # The webhook receiver (tests/faults/receiver.py) is on loopback.
            "CRONWHEEL_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
        }
        self.kafka: dict | None = None  # the tenant's Kafka credentials
        self.launch = Launcher(
            self.database_url, stack.kafka_bootstrap, self.topic_prefix, log_dir=log_dir
        )
        self.effect_log = log_dir / "effects.jsonl"
        # The load's webhook job's endpoint, when the layout runs the webhook service.
        self.receiver: Receiver | None = None
        self.worker: subprocess.Popen | None = None
        self.worker_topic = ""
        self.services: dict[str, ServiceProc] = {}
        self.api: httpx.Client | None = None
        self.api_key = ""

    def start(self) -> None:
        # The platform's ACLs for this scenario's topic prefix, as an operator
        # grants them (`cronwheel kafka grant`, as the private broker's admin).
        subprocess.run(
            [PYTHON, "-m", "services.entrypoints", "kafka", "grant", "--no-users",
             "--prefix", self.topic_prefix],
            env=self.stack.env, cwd=ROOT, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        if self.runs("webhook"):
            self.receiver = Receiver(self.effect_log)
        for name in self.layout:
            self.start_service(name)
        wait_for(self._ready, 60, 0.2, "the gateway to be ready")
        # Setup, not the fault: on a machine loaded by both halves' start the
        # gateway's first Kafka calls (its SCRAM user, its topic) took over
        # 10 s once in CI, just after its readiness had failed for 13 s.
        tenant = httpx.post(
            f"{self.base}/v1/tenants",
            json={"name": "faults"},
            headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
            timeout=30,
        ).json()
        self.api_key = tenant["api_key"]
        self.kafka = tenant.get("kafka")
        self.api = httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=5
        )

    def runs(self, service: str) -> bool:
        """The layout has an instance of `service`."""
        return any(name == service for name, _ in self.layout.values())

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.base}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_service(self, name: str) -> ServiceProc:
        """Start instance `name` of the layout (again). PGAPPNAME names each
        instance's sessions in pg_stat_activity."""
        service, extra = self.layout.get(name, (name, {}))
        self.services[name] = self.launch.start(
            service, PGAPPNAME=f"fault-{name}", **self.env, **extra
        )
        return self.services[name]

    def diagnose(self) -> None:
        """Where each process waits and what its consumers hold, into its own
        log, when the platform did not catch up: every thread's stack
        (SIGUSR1) of the SDK worker and of each service, and the consumers'
        state (SIGUSR2: tests/faults/worker.py; for the consuming services,
        cronwheel.runtime, logged at their loop's next pass)."""
        procs = [
            (svc.proc, svc.log_path, "state, as asked" if svc.name in DESCRIBING else None)
            for svc in self.services.values()
            if svc.alive() and not svc.paused
        ]
        if self.worker and self.worker.poll() is None:
            procs.append((self.worker, self.launch.log_dir / "worker.log", "consumer "))
        for proc, log, mark in procs:
            _ask(proc, log, mark)

    def stop_worker(self) -> None:
        """SIGTERM: the worker finishes what it holds and commits its offsets."""
        if self.worker and self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait(10)

    def start_worker(self, topic: str) -> None:
        self.worker_topic = topic
        self.worker = self.spawn_worker(topic, "worker")

    def spawn_worker(self, topic: str, name: str) -> subprocess.Popen:
        """One more SDK worker process on `topic` (the same consumer group),
        writing the effect log; its output goes to NAME.log."""
        env = {**os.environ, "CRONWHEEL_URL": self.base, "CRONWHEEL_API_KEY": self.api_key,
               "KAFKA_BOOTSTRAP": self.stack.kafka_bootstrap, "EFFECT_LOG": str(self.effect_log),
               **worker_env(self.kafka)}  # fmt: skip
        with (self.launch.log_dir / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                [PYTHON, "-m", "tests.faults.worker", topic], env=env, cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.database_url, autocommit=True)

    def close(self) -> None:
        self.stop_worker()
        if self.api:
            self.api.close()
        self.launch.close()
        if self.receiver:
            self.receiver.close()
        with contextlib.suppress(Exception):
            dbsupport.drop(self.stack.admin_url, self.db_name)


class Load:
    """Jobs with computable instants and a stream of manual triggers."""

    def __init__(self, platform: Platform, rng: random.Random, jobs: int = 6):
        self.platform = platform
        self.rng = rng
        self.jobs: dict[str, int] = {}  # job_id: every_ms
        self.triggered: set[str] = set()  # run ids of answered triggers
        self.trigger_retries = 0  # trigger posts that had to be sent again
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.topic = ""
        for i in range(jobs):
            job = self._create(i, rng.randint(400, 900))
            self.jobs[job["job_id"]] = job["schedule"]["every_ms"]
            self.topic = job["topic"]
        if platform.receiver:  # one more job, the webhook service's
            target = {"type": "webhook", "url": platform.receiver.url}
            job = self._create(jobs, rng.randint(400, 900), target)
            self.jobs[job["job_id"]] = job["schedule"]["every_ms"]
        if platform.runs("executor"):  # and one the executor runs (executions.py)
            target = {"type": "managed", "command": ["true"]}
            job = self._create(jobs + 1, rng.randint(400, 900), target)
            self.jobs[job["job_id"]] = job["schedule"]["every_ms"]
        self.workflows: dict[str, int] = {}  # workflow_id: every_ms
        if platform.runs("workflow"):
            flow = self._create_workflow(rng.randint(800, 1500))
            self.workflows[flow["workflow_id"]] = flow["schedule"]["every_ms"]

    def _create_workflow(self, every_ms: int) -> dict:
        """A diamond, a -> (b, c) -> d, on the load's queue: d waits for two
        completions, so a completion applied twice shows in its counter."""
        node = {"target": {"type": "queue", "queue": "faults"}, "payload": {"sleep_s": 0.1},
                "lease_ms": LEASE_MS, "retry": RETRY}  # fmt: skip
        body = {
            "name": "fault-diamond",
            "schedule": {"every_ms": every_ms, "catchup": CATCHUP},
            "nodes": [
                {"name": "a", **node},
                {"name": "b", **node, "depends_on": ["a"]},
                {"name": "c", **node, "depends_on": ["a"]},
                {"name": "d", **node, "depends_on": ["b", "c"]},
            ],
        }
        r = self.platform.api.post("/v1/workflows", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def _create(self, i: int, every_ms: int, target: dict | None = None) -> dict:
        body = {
            "name": f"fault-{i}",
            "schedule": {"every_ms": every_ms, "catchup": CATCHUP},
            "target": target or {"type": "queue", "queue": "faults"},
            "payload": {"sleep_s": 0.1},
            "lease_ms": LEASE_MS,
            "retry": RETRY,
        }
        r = self.platform.api.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def start_triggers(self, every_s: float = 0.3) -> None:
        self._thread = threading.Thread(target=self._triggers, args=(every_s,), daemon=True)
        self._thread.start()

    def _triggers(self, every_s: float) -> None:
        ids = list(self.jobs)
        while not self._stop.wait(every_s):
            if run_id := self._trigger(self.rng.choice(ids)):
                self.triggered.add(run_id)

    def _trigger(self, job_id: str) -> str | None:
        """POST the trigger until answered, always with the same Idempotency-Key:
        an answer lost in a fault is replayed, never a second run. None when
        the load was halted first (the checker then fails on its run, if any)."""
        key = uuid.uuid4().hex
        deadline = time.monotonic() + 120
        while not self._stop.is_set():
            try:
                r = self.platform.api.post(
                    f"/v1/jobs/{job_id}/trigger", headers={"Idempotency-Key": key}
                )
                if r.status_code in (200, 201):
                    return r.json()["run_id"]
            except httpx.HTTPError:
                pass
            self.trigger_retries += 1
            if time.monotonic() > deadline:
                raise AssertionError(f"trigger of {job_id} unanswered for 120 s")
            time.sleep(0.2)  # retry pacing while the platform recovers
        return None

    def halt(self) -> None:
        """Stop triggering (a trigger being retried gives up at once)."""
        self._stop.set()
        if self._thread:
            self._thread.join(150)

    def stop(self) -> int:
        """Stop triggering; wait until every job caught up to now; pause them
        all. Returns the database's time the load ended (ms)."""
        self.halt()
        with self.platform.connect() as conn:
            end_ms = to_ms(conn.execute("SELECT now()").fetchone()[0])
            wait_for(lambda: behind(conn, end_ms) == 0, 60, 0.1, "every job to catch up")
        for job_id in self.jobs:
            r = self.platform.api.post(f"/v1/jobs/{job_id}/pause")
            assert r.status_code == 200, r.text
        for workflow_id in self.workflows:
            r = self.platform.api.post(f"/v1/workflows/{workflow_id}/pause")
            assert r.status_code == 200, r.text
        return end_ms


def behind(conn: psycopg.Connection, at_ms: int) -> int:
    """How many jobs and workflows have an instant at or before `at_ms` not yet fired."""
    return conn.execute(
        """SELECT count(*) FROM (SELECT last_instant, schedule FROM jobs
                                 UNION ALL SELECT last_instant, schedule FROM workflows) s
            WHERE last_instant + make_interval(secs => (schedule->>'every_ms')::float / 1000)
                  <= to_timestamp(%(at)s / 1000.0)""",
        {"at": at_ms},
    ).fetchone()[0]


def recovered(conn: psycopg.Connection, since_ms: int) -> bool:
    """The platform has caught up with `since_ms`: every job fired its instants
    up to it, every run due by then ended, and nothing older waits in the outbox."""
    return settled(conn, since_ms) and behind(conn, since_ms) == 0


def settled(conn: psycopg.Connection, since_ms: int) -> bool:
    """Every run (and workflow run) due by `since_ms` ended and nothing older
    waits in the outbox."""
    at = [since_ms]
    pending = conn.execute(
        "SELECT count(*) FROM runs_daily WHERE scheduled_at <= to_timestamp(%s / 1000.0)"
        " AND state NOT IN ('SUCCEEDED','FAILED','TIMED_OUT','CANCELLED','SKIPPED')",
        at,
    ).fetchone()[0]
    flows = conn.execute(
        "SELECT count(*) FROM workflow_runs WHERE scheduled_at <= to_timestamp(%s / 1000.0)"
        " AND state = 'RUNNING'",
        at,
    ).fetchone()[0]
    queued = conn.execute(
        "SELECT count(*) FROM outbox WHERE created_at <= to_timestamp(%s / 1000.0)", at
    ).fetchone()[0]
    return pending == 0 and flows == 0 and queued == 0


def _ask(proc: subprocess.Popen, log: Path, mark: str | None) -> None:
    """SIGUSR1 (the stacks), then SIGUSR2 where `mark` says which line
    answers it; waits for each in `log`, briefly: a diagnosis, not a check."""
    before = log.stat().st_size
    proc.send_signal(signal.SIGUSR1)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: log.stat().st_size > before, 5, 0.05, "the stacks")
    if mark is not None:
        proc.send_signal(signal.SIGUSR2)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: mark in log.read_text(errors="replace")[before:], 15, 0.1, "state")


def wait_recovered(platform: Platform, timeout: float = 120.0) -> float:
    """Seconds until the platform has caught up with the moment this is called."""
    t0 = time.monotonic()

    def check():
        try:
            with platform.connect() as conn:
                since = getattr(check, "since", None)
                if since is None:
                    since = check.since = to_ms(conn.execute("SELECT now()").fetchone()[0])
                return recovered(conn, since)
        except psycopg.OperationalError:
            return False

    try:
        wait_for(check, timeout, 0.1, "the platform to catch up after the fault")
    except AssertionError as e:
        platform.diagnose()
        with platform.connect() as conn:
            raise AssertionError(f"{e}; {_lagging(conn, check.since)}") from None
    return time.monotonic() - t0


def _lagging(conn: psycopg.Connection, since_ms: int) -> str:
    """What keeps `recovered` false: unfinished runs due by `since_ms` by
    state (with the oldest few, each with its creation and the `processed`
    marks that name it: a consumer that recorded a run's record before the
    run was there to start), running workflow runs, old outbox rows by topic,
    and jobs behind."""
    at = {"at": since_ms}
    by_state = conn.execute(
        "SELECT state, count(*) FROM runs_daily WHERE scheduled_at <= to_timestamp(%(at)s / 1000.0)"
        " AND state NOT IN ('SUCCEEDED','FAILED','TIMED_OUT','CANCELLED','SKIPPED')"
        " GROUP BY state",
        at,
    ).fetchall()
    oldest = conn.execute(
        "SELECT r.run_id, r.state, r.attempt, r.scheduled_at, r.created_at, r.updated_at,"
        "       r.lease_expires_at, (SELECT array_agg(p.consumer || ' ' || p.message_key"
        "                                              || ' at ' || p.processed_at::text)"
        "                              FROM processed p"
        "                             WHERE split_part(p.message_key, ':', 1) = r.run_id) marks"
        "  FROM runs_daily r WHERE r.scheduled_at <= to_timestamp(%(at)s / 1000.0)"
        " AND r.state NOT IN ('SUCCEEDED','FAILED','TIMED_OUT','CANCELLED','SKIPPED')"
        " ORDER BY r.scheduled_at LIMIT 3",
        at,
    ).fetchall()
    outbox = conn.execute(
        "SELECT topic, count(*) FROM outbox WHERE created_at <= to_timestamp(%(at)s / 1000.0)"
        " GROUP BY topic",
        at,
    ).fetchall()
    flows = conn.execute(
        "SELECT count(*) FROM workflow_runs WHERE scheduled_at <= to_timestamp(%(at)s / 1000.0)"
        " AND state = 'RUNNING'",
        at,
    ).fetchone()[0]
    return (
        f"unfinished runs by state {dict(by_state)}, oldest {oldest}; outbox rows {dict(outbox)};"
        f" workflow runs running {flows}; jobs behind {behind(conn, since_ms)}"
    )


@dataclass
class Report:
    scenario: str
    expected: int = 0  # runs the history calls for: instants and answered triggers
    lost: int = 0
    duplicate_runs: int = 0
    duplicate_effects: int = 0
    reexecuted: int = 0  # (run, attempt) pairs whose handler began more than once
    reexecuted_after_lost_lease: int = 0  # effects of attempts before the successful one
    not_succeeded: int = 0
    early_starts: int = 0  # handlers begun before their run's instant (host clock)
    refused_not_due: int = 0  # StartRun calls of a run refused as "not due yet"
    outbox_left: int = 0
    recover_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        worst = max(self.recover_s, default=0.0)
        return (
            f"{self.scenario:<14} expected={self.expected} lost={self.lost} "
            f"dup_runs={self.duplicate_runs} dup_effects={self.duplicate_effects} "
            f"recovery_s={worst:.1f}"
        )

    def assert_clean(self) -> None:
        assert not self.problems, f"{self.scenario}: " + "; ".join(self.problems)


def check(
    platform: Platform, load: Load, end_ms: int, report: Report, allow_lost_leases: bool = False
) -> Report:
    """The checker over the whole history; fills `report` and lists each
    violation in `report.problems`. `allow_lost_leases`: a fault kept the
    platform away longer than a run's lease, so a successful run's effect may
    also have been logged by earlier attempts the platform expired (counted in
    `duplicate_effects`, not a violation); the same attempt twice still is."""

    def all_settled():
        with platform.connect() as conn:
            return settled(conn, end_ms + 60_000)  # paused jobs fire nothing after end_ms

    try:
        wait_for(all_settled, 90, 0.2, "every run to end and the outbox to drain")
    except AssertionError as e:
        report.problems.append(str(e))
    with platform.connect() as conn:
        jobs = conn.execute(
            "SELECT job_id, (schedule->>'every_ms')::bigint, anchor_at FROM jobs"
        ).fetchall()
        runs = conn.execute(
            "SELECT run_id, job_id, scheduled_at, state, attempt FROM runs_daily"
        ).fetchall()
        report.outbox_left = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
        won = Counter(
            r
            for (r,) in conn.execute(
                "SELECT run_id FROM run_attempts_daily WHERE outcome = 'SUCCEEDED'"
            )
        )
        node_ids = _check_workflows(conn, end_ms, report)
    by_id = {r[0]: r for r in runs}
    # Scheduled instants: anchor + k * every for every k whose instant the load
    # spanned (the load ended only once every job had fired up to end_ms).
    expected: set[str] = set()
    for job_id, every, anchor_at in jobs:
        anchor = to_ms(anchor_at)
        expected |= {
            run_id_for_instant(job_id, t) for t in range(anchor + every, end_ms + 1, every)
        }
    instant_ids = {
        run_id
        for run_id, job_id, at, _, _ in runs
        if job_id is not None and run_id == run_id_for_instant(job_id, to_ms(at))
    }
    per_instant = Counter(
        (job_id, at) for run_id, job_id, at, _, _ in runs if run_id in instant_ids
    )
    report.expected += len(expected) + len(load.triggered)
    lost = (expected - set(by_id)) | (load.triggered - set(by_id))
    report.lost += len(lost)
    unexplained = set(by_id) - instant_ids - load.triggered - node_ids
    report.duplicate_runs += sum(n - 1 for n in per_instant.values()) + len(unexplained)
    report.not_succeeded = sum(1 for r in runs if r[3] != "SUCCEEDED")
    if platform.runs("executor"):
        report.notes.append(
            f"{log_executions(platform.launch.log_dir, platform.effect_log)} commands"
            " run by the executor, read from its log"
        )
    replaced = [
        line.split("replacing the consumer of ", 1)[1]
        for path in sorted(platform.launch.log_dir.glob("worker*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if "replacing the consumer of " in line
    ]
    if replaced:  # cronwheel/sdk/watchdog.py: a consumer librdkafka left stuck
        report.notes.append(f"the SDK worker replaced its consumer {len(replaced)}x: {replaced[0]}")
    starts, effects, begun_at, not_due = _read_effects(platform.effect_log)
    # Early: a handler began before its run's instant, by the host's clock
    # (the worker and PostgreSQL share it; skewed services never write this).
    instant = {r[0]: to_ms(r[2]) for r in runs}
    report.early_starts = sum(1 for run, at in begun_at if run in instant and at < instant[run])
    report.refused_not_due = not_due
    report.reexecuted = sum(1 for n in starts.values() if n > 1)
    effect_runs = Counter(run for run, _attempt in effects.elements())
    succeeded = [r for r in runs if r[3] == "SUCCEEDED"]
    report.duplicate_effects = sum(max(0, effect_runs[r[0]] - 1) for r in succeeded)
    missing_effect = [r[0] for r in succeeded if effect_runs[r[0]] == 0]
    # The successful attempt is the run's last; an effect logged by an earlier
    # attempt is one whose lease the platform expired (docs/workers.md: the run
    # comes back as the next attempt, so handlers are to be idempotent by run_id).
    twice_won = [r[0] for r in succeeded if won[r[0]] != 1]
    final = {r[0]: r[4] for r in succeeded}
    report.reexecuted_after_lost_lease = sum(
        1 for (run, attempt) in effects if run in final and attempt < final[run]
    )
    if report.lost:
        report.problems.append(f"{report.lost} expected runs missing: {sorted(lost)[:3]}")
    if report.duplicate_runs:
        report.problems.append(f"{report.duplicate_runs} runs beyond one per instant or trigger")
    if report.not_succeeded:
        bad = Counter(r[3] for r in runs if r[3] != "SUCCEEDED")
        report.problems.append(f"runs not SUCCEEDED: {dict(bad)}")
    if report.reexecuted:
        report.problems.append(f"{report.reexecuted} (run, attempt) pairs executed twice or more")
    if twice_won:
        report.problems.append(f"{len(twice_won)} runs without exactly one successful attempt")
    if report.duplicate_effects and not allow_lost_leases:
        doubled = {
            r[0]: sorted(a for (run, a) in effects.elements() if run == r[0])
            for r in succeeded
            if effect_runs[r[0]] > 1
        }
        report.problems.append(
            f"{report.duplicate_effects} duplicate effects of successful runs"
            f" (run: attempts whose effect was logged): {dict(list(doubled.items())[:3])}"
        )
    if missing_effect:
        report.problems.append(f"{len(missing_effect)} SUCCEEDED runs without their effect")
    if report.outbox_left:
        report.problems.append(f"{report.outbox_left} rows left in the outbox")
    if report.early_starts:
        report.problems.append(f"{report.early_starts} handlers began before their run's instant")
    if report.refused_not_due:
        report.problems.append(f"{report.refused_not_due} StartRun calls refused as not due yet")
    return report


def _check_workflows(conn: psycopg.Connection, end_ms: int, report: Report) -> set[str]:
    """The workflows' part of the checker: every instant of each workflow up
    to `end_ms` has exactly one workflow run (id hash(workflow, instant)),
    SUCCEEDED with no node left; each of its nodes SUCCEEDED with no
    dependency pending (the DAG counters: a completion applied twice would
    have released a child early or driven a counter below zero) and exactly
    one run, id hash(workflow, workflow run, node). Counts go into `report`;
    returns the node runs' ids (the ones the history explains)."""
    flows = conn.execute(
        "SELECT workflow_id, (schedule->>'every_ms')::bigint, anchor_at, node_count FROM workflows"
    ).fetchall()
    if not flows:
        return set()
    wruns = {}
    extra = set()  # workflow runs that are no instant's (the load triggers none)
    for wfr, wf, at, state, left in conn.execute(
        "SELECT workflow_run_id, workflow_id, scheduled_at, state, nodes_left FROM workflow_runs"
    ):
        wruns[wfr] = (wf, state, left)
        if wfr != workflow_run_id_for_instant(wf, to_ms(at)):
            extra.add(wfr)
    nodes = conn.execute(
        "SELECT workflow_run_id, node, state, pending_deps, run_id FROM workflow_run_nodes"
    ).fetchall()
    node_runs = conn.execute(
        "SELECT run_id, workflow_run_id, node FROM runs_daily WHERE workflow_run_id IS NOT NULL"
    ).fetchall()
    expected: set[str] = set()
    for wf, every, anchor_at, node_count in flows:
        anchor = to_ms(anchor_at)
        mine = {
            workflow_run_id_for_instant(wf, t) for t in range(anchor + every, end_ms + 1, every)
        }
        expected |= mine
        report.expected += len(mine) * node_count
    lost = expected - set(wruns)
    unfinished = [w for w, (_, state, left) in wruns.items() if state != "SUCCEEDED" or left]
    bad_nodes = [
        (wfr, node, state, deps)
        for wfr, node, state, deps, run_id in nodes
        if state != "SUCCEEDED" or deps or run_id != run_id_for_node(wruns[wfr][0], wfr, node)
    ]
    node_ids = {
        run_id
        for run_id, wfr, node in node_runs
        if wfr in wruns and run_id == run_id_for_node(wruns[wfr][0], wfr, node)
    }
    per_node = Counter((wfr, node) for _, wfr, node in node_runs)
    report.lost += len(lost)
    report.duplicate_runs += len(extra) + sum(n - 1 for n in per_node.values())
    if lost or extra:
        report.problems.append(f"workflow runs: {len(lost)} missing, {len(extra)} unexpected")
    if unfinished:
        report.problems.append(f"{len(unfinished)} workflow runs not SUCCEEDED with 0 nodes left")
    if bad_nodes:
        report.problems.append(
            f"{len(bad_nodes)} workflow nodes not SUCCEEDED with 0 pending and their run:"
            f" {bad_nodes[:3]}"
        )
    return node_ids


def _read_effects(path: Path) -> tuple[Counter, Counter, list[tuple[str, int]], int]:
    """From the effect log: {(run, attempt): starts}, {(run, attempt): effects},
    [(run, wall ms a start began)], and how many StartRuns were refused as not due."""
    starts: Counter = Counter()
    effects: Counter = Counter()
    begun_at: list[tuple[str, int]] = []
    not_due = 0
    for e in effect_log.read(path):
        if e["phase"] == "not_due":
            not_due += 1
            continue
        (starts if e["phase"] == "start" else effects)[(e["run"], e["attempt"])] += 1
        if e["phase"] == "start":
            begun_at.append((e["run"], e["at"]))
    return starts, effects, begun_at, not_due
