"""Managed runs through the real pipeline: job -> relay -> dispatcher -> executor
-> sandboxed command -> CompleteRun, and what the sandbox keeps the command from
doing. One platform (database, topics, services in threads) serves the module;
each test has its own tenant."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.runs_read import get_run
from services.dispatcher.service import Dispatcher
from services.executor.sandbox import Policy
from services.executor.service import Executor
from services.relay.service import Relay
from services.timer.service import TimerService
from tests.support import db as dbsupport
from tests.support.kafka import drain
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap: make system-deps"),
]

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"}


@dataclass
class Platform:
    database_url: str
    topics: Topics
    conn: psycopg.Connection
    executor: Executor  # or what serving's `make` made

    def tenant(self) -> dict:
        return create_tenant(self.conn, f"team-{uuid.uuid4().hex[:8]}")

    def trigger(self, tenant: dict, command: list[str], **job) -> str:
        """A managed job run once now; returns the run's id."""
        target = {"type": "managed", "command": command}
        for key in ("env", "limits"):
            if key in job:
                target[key] = job.pop(key)
        body = {
            "name": f"job-{uuid.uuid4().hex[:6]}",
            "schedule": {"at": "2099-01-01T00:00:00.000Z"},
            "target": target,
            "retry": {"max_attempts": 1},
            **job,
        }
        jobs = Jobs(self.topics)
        created = jobs.create(self.conn, tenant, body, now_ms())
        return jobs.trigger(self.conn, tenant, created["job_id"], now_ms())["run_id"]

    def run(self, tenant: dict, run_id: str) -> dict:
        return get_run(self.conn, tenant["tenant_id"], run_id)

    def finished(self, tenant: dict, run_id: str, timeout: float = 30) -> dict:
        return wait_for(
            lambda: (r := self.run(tenant, run_id))["state"] in TERMINAL and r,
            timeout,
            what=f"run {run_id} to finish",
        )


@contextlib.contextmanager
def serving(servers, db_template, new_topic_prefix, make=None, **executor) -> Iterator[Platform]:
    """A database of its own, fresh topics, and the services a managed run
    passes through, with an Executor of `executor`'s arguments (or what
    `make(url, bootstrap, topics)` makes, to run in its place)."""
    name = dbsupport.clone(servers.database_url, db_template)
    url = dbsupport.with_dbname(servers.database_url, name)
    bootstrap = servers.kafka_bootstrap
    topics = Topics(new_topic_prefix())
    service = (make or partial(Executor, **executor))(url, bootstrap, topics)
    try:
        with contextlib.ExitStack() as stack:
            conn = stack.enter_context(psycopg.connect(url, autocommit=True))
            stack.enter_context(running(Relay(url, bootstrap, idle_ms=100)))
            stack.enter_context(running(Dispatcher(url, bootstrap, topics)))
            stack.enter_context(running(TimerService(url, topics, lease_ttl_ms=5000, ahead_ms=0)))
            stack.enter_context(running(service))
            yield Platform(url, topics, conn, service)
    finally:
        dbsupport.drop(servers.database_url, name)


@pytest.fixture(scope="module")
def platform(servers, db_template, new_topic_prefix):
    with serving(
        servers, db_template, new_topic_prefix,
        policy=Policy(), concurrency=4, per_tenant=2, shutdown_grace_ms=500,
    ) as p:  # fmt: skip
        yield p


def processes_with(args: list[str]) -> list[int]:
    """Pids on this host whose command line is exactly `args`."""
    want = "\0".join(args).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "cmdline").read_bytes() == want:
                    found.append(int(entry.name))
    return found


def test_command_output__reaches_the_run__with_its_env_and_payload(platform):
    tenant = platform.tenant()
    script = (
        "echo hello from $GREETING; echo to stderr >&2; cat $CRONWHEEL_PAYLOAD_FILE; echo;"
        " echo token=$API_TOKEN; echo home=$HOME pwd=$(pwd) attempt=$CRONWHEEL_ATTEMPT;"
        " echo db=${DATABASE_URL:-unset}; echo trace=$TRACEPARENT"
    )
    run_id = platform.trigger(
        tenant,
        ["sh", "-c", script],
        env={"GREETING": "the sandbox", "API_TOKEN": "tok-5f1e2d3c"},
        payload={"n": 1},
    )
    run = platform.finished(tenant, run_id)
    assert run["state"] == "SUCCEEDED"
    assert run["worker_id"] == platform.executor.worker_id
    assert run["result"]["exit_code"] == 0
    assert run["result"]["output_truncated"] is False
    out = run["result"]["output"]
    assert "hello from the sandbox\n" in out
    assert "to stderr\n" in out
    assert '{"n":1}' in out
    assert "home=/scratch pwd=/scratch attempt=1" in out
    assert "db=unset" in out  # nothing of the executor's own environment
    assert f"trace=00-{run_id}-{1:016x}-00\n" in out  # the run's W3C trace
    assert "token=***" in out and "tok-5f1e2d3c" not in out


def test_exit_3__run_failed_with_exit_code_3(platform):
    tenant = platform.tenant()
    run_id = platform.trigger(tenant, ["sh", "-c", "echo about to fail; exit 3"])
    run = platform.finished(tenant, run_id)
    assert run["state"] == "FAILED"
    assert run["error"] == "exit code 3"
    assert run["result"] == {"exit_code": 3, "output": "about to fail\n", "output_truncated": False}


def test_sleep_past_its_timeout__timed_out__and_its_process_killed(platform):
    tenant = platform.tenant()
    command = ["sleep", "37.25"]  # an argument no other process on the host uses
    run_id = platform.trigger(tenant, command, timeout_ms=1500)
    wait_for(lambda: processes_with(command), 30, what="the sandboxed sleep to start")
    run = platform.finished(tenant, run_id)
    assert run["state"] == "TIMED_OUT"
    assert run["error"] == "timed out"
    assert [a["outcome"] for a in run["attempts"]] == ["TIMED_OUT"]
    wait_for(lambda: not processes_with(command), 5, what="the sleep to be gone")


def test_sandbox__connection_to_loopback__fails(platform):
    tenant = platform.tenant()
    port = urlsplit(platform.database_url).port  # PostgreSQL listens there, on the host
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "except OSError as e:\n"
        "    print('blocked:', e); sys.exit(7)\n"
        "print('connected')\n"
    )
    run_id = platform.trigger(tenant, ["python3", "-c", script])
    run = platform.finished(tenant, run_id)
    assert run["result"]["exit_code"] == 7, run["result"]
    assert "blocked:" in run["result"]["output"]


def test_target_asking_for_network__refused_when_the_operator_does_not_allow_it(platform):
    tenant = platform.tenant()
    run_id = platform.trigger(tenant, ["true"], limits={"network": True}, retry={"max_attempts": 3})
    run = platform.finished(tenant, run_id)
    assert run["state"] == "FAILED"  # not retried: another attempt would be refused too
    assert run["attempt"] == 1
    assert "does not allow network access" in run["error"]


def test_sandbox__host_files__unreadable(platform):
    tenant = platform.tenant()
    marker = f"host-secret-{uuid.uuid4().hex}"
    probes = [
        ROOT / f".executor-probe-{uuid.uuid4().hex[:8]}",
        Path.home() / f".executor-probe-{uuid.uuid4().hex[:8]}",
    ]
    for p in probes:
        p.write_text(marker)
    try:
        script = " ; ".join(f"cat {p}" for p in probes) + " ; ls /work /root /home; exit 0"
        run_id = platform.trigger(tenant, ["sh", "-c", script])
        run = platform.finished(tenant, run_id)
    finally:
        for p in probes:
            p.unlink()
    out = run["result"]["output"]
    assert marker not in out
    assert out.count("No such file or directory") == 5, out


def test_sandbox__3gib_allocation_under_256mib_limit__fails(platform):
    tenant = platform.tenant()
    script = (
        "small = bytearray(64 << 20); print('64 MiB ok', flush=True)\n"
        "big = bytearray(3 << 30); print('3 GiB ok')\n"
    )
    run_id = platform.trigger(tenant, ["python3", "-c", script], limits={"memory_mb": 256})
    run = platform.finished(tenant, run_id)
    assert run["state"] == "FAILED"
    out = run["result"]["output"]
    assert "64 MiB ok" in out and "MemoryError" in out and "3 GiB ok" not in out


def test_sandbox__fork_bomb__stopped_by_the_process_limit(platform):
    tenant = platform.tenant()
    # Bounded: 200 sleeping children at most even if no limit held.
    bomb = (
        "import os, sys, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        print(f'fork failed after {n}: {e}'); sys.exit(9)\n"
        "    if pid == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    n += 1\n"
        "print(f'forked {n}')\n"
    )
    run_id = platform.trigger(tenant, ["python3", "-c", bomb], limits={"pids": 32})
    run = platform.finished(tenant, run_id)
    assert run["result"]["exit_code"] == 9, run["result"]
    forked = int(run["result"]["output"].split("fork failed after ")[1].split(":")[0])
    assert 20 <= forked < 32  # the 32 processes include the bomb itself


def test_tenant_cap__a_third_run_waits__another_tenant_does_not(platform):
    busy, other = platform.tenant(), platform.tenant()
    sleep = ["sleep", "1.5"]
    busy_runs = [platform.trigger(busy, sleep) for _ in range(3)]
    other_run = platform.trigger(other, sleep)
    spans = {}
    for tenant, run_id in [(busy, r) for r in busy_runs] + [(other, other_run)]:
        run = platform.finished(tenant, run_id)
        assert run["state"] == "SUCCEEDED"
        spans[run_id] = (run["started_at"], run["finished_at"])
    (s1, e1), (s2, e2), (s3, _e3) = sorted(spans[r] for r in busy_runs)
    assert s3 >= min(e1, e2)  # the cap is 2 per tenant: the third waited for a slot
    assert spans[other_run][0] < s3  # ... and the other tenant did not wait behind it


def test_tenant_cap__held_runs__critical_takes_the_freed_slot_before_an_earlier_normal(platform):
    """docs/priority.md: the dispatcher places each class in its own partitions
    of the managed topic, so a critical run waits held in its own partition and
    the first freed slot goes to it, not to the normal run held before it."""
    tenant = create_tenant(
        platform.conn, f"team-{uuid.uuid4().hex[:8]}", priority_classes=["critical", "normal"]
    )
    busy = [platform.trigger(tenant, ["sleep", s]) for s in ("1.5", "2.5")]  # the cap is 2
    wait_for(lambda: all(platform.run(tenant, r)["state"] == "RUNNING" for r in busy), 30)
    normal = platform.trigger(tenant, ["true"])
    wait_for(lambda: len(platform.executor._held) == 1, 30, what="the normal run held")
    critical = platform.trigger(tenant, ["true"], priority="critical")
    wait_for(lambda: len(platform.executor._held) == 2, 30, what="the critical run held")
    done = {r: platform.finished(tenant, r) for r in (normal, critical)}
    assert all(run["state"] == "SUCCEEDED" for run in done.values())
    assert done[critical]["started_at"] < done[normal]["started_at"]


def test_poison__on_every_partition__dead_lettered_counted__runs_behind_it_still_run(platform):
    tenant = platform.tenant()
    first = platform.trigger(tenant, ["/bin/true"])  # the tenant's managed topic, read
    assert platform.finished(tenant, first)["state"] == "SUCCEEDED"
    topic = platform.topics.managed(tenant["tenant_id"])
    bootstrap = platform.executor.bootstrap
    producer = kafka.producer(bootstrap, principal="dispatcher")  # managed topics are its to write
    partitions = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    before = platform.executor.dead_lettered_total
    for p in range(partitions):
        producer.produce(topic, value=b"not avro", key=f"junk-{p}".encode(), partition=p)
    assert producer.flush(10) == 0
    behind = platform.trigger(tenant, ["/bin/true"])
    assert platform.finished(tenant, behind)["state"] == "SUCCEEDED"
    wait_for(
        lambda: platform.executor.dead_lettered_total == before + partitions,
        what="every poison record counted",
    )
    letters = [
        d
        for *_x, d, _m in drain(bootstrap, platform.topics.dead_letter, want=partitions)
        if d["source_topic"] == topic
    ]
    assert sorted(d["source_partition"] for d in letters) == list(range(partitions))
    assert {(d["consumer"], d["value"], d["reason"]) for d in letters} == {
        ("executor", b"not avro", "not single-object encoded")
    }
