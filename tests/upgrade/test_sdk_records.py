"""make test-upgrade, records and workers (issue 25, Avro): each release's SDK
handles the RunReady records the other release writes, through the real broker
and a real gateway, timer, relay and dispatcher as processes.

This release writes RunReady v2 (traceparent, cell); v0.1.0 shipped the same
file staged, and wrote v1. "The previous release" is RELEASES' last line.

- v0.1.0's SDK worker, from its tree and unchanged (its
  tests/support/sdk_worker.py), handles the v2 records this release's
  services write: a run that succeeds, and a run retried once, whose second
  announcement is v2 too.
- This release's SDK worker handles the records the previous release's
  gateway, timer, relay and dispatcher write (on this release's expand
  schema, as in test_upgrade.py): the same two runs (v0.1.0's were v1, their
  `traceparent` and `cell` None).
- From v0.2.0 on the previous release writes v2 itself, so the v1 records
  are written by v0.1.0's own code (its events.run_ready, from its tree) for
  runs this release's gateway made, and this release's SDK handles them.
- Every schema file the previous release holds is here, unchanged (a staged
  file under its published name): a record it wrote or reads names its
  schema by fingerprint.

The codec alone, both ways: tests/unit/test_run_ready_v2.py."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from cronwheel import kafka as cwkafka
from cronwheel.core import events
from cronwheel.core.avro import SCHEMA_DIR, SchemaRegistry, SchemaVersion, default_registry
from cronwheel.sdk import Run, Worker
from tests.support import db as dbsupport
from tests.support.kafka import read_all, worker_env
from tests.support.procs import launcher, wait_ready
from tests.support.wait import wait_for
from tests.upgrade import previous
from tests.upgrade import test_upgrade as upgrade

pytestmark = pytest.mark.e2e

release = upgrade.release  # the module-scoped fixture: (the release, its exported tree)


@pytest.fixture(scope="module")
def v1_release(tmp_path_factory) -> tuple[previous.Release, Path]:
    """v0.1.0, the last release that writes RunReady v1 (and the first that
    held v2, staged), exported as RELEASES names it: what this SDK must still
    read from a platform not yet upgraded, or a topic's older records."""
    entries = [line.split() for line in previous.RELEASES.read_text().splitlines()]
    (commit,) = [e[1] for e in entries if e[:1] == [V1_TAG] and len(e) == 2]
    rel = previous.Release(V1_TAG, commit)
    tree = tmp_path_factory.mktemp(f"release-{V1_TAG}")
    try:
        previous.export(rel, tree)
    except previous.Unavailable as e:
        pytest.fail(str(e), pytrace=False)
    return rel, tree


OPERATOR_KEY = "cwop_test_" + uuid.uuid4().hex
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED")
CELL = "cell-up"
V1_TAG = "v0.1.0"
V1 = SchemaVersion.load(SCHEMA_DIR / "RunReady.v1.avsc").fingerprint
V2 = SchemaVersion.load(SCHEMA_DIR / "RunReady.v2.avsc").fingerprint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def platform(start: Callable[..., object], **env: str) -> Iterator[tuple[str, dict, httpx.Client]]:
    """A gateway, timer, relay and dispatcher, each started by `start(name,
    **env)` (this release's or the previous one's), and a tenant made through
    that gateway: (its address, the tenant, a client with the tenant's key)."""
    port = _free_port()
    env = {"CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}", "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY,
           **env}  # fmt: skip
    for name in ("gateway", "timer", "relay", "dispatcher"):
        start(name, **env)
    base = f"http://127.0.0.1:{port}"
    wait_ready(base)
    r = httpx.post(
        f"{base}/v1/tenants", json={"name": "records"},
        headers={"Authorization": f"Bearer {OPERATOR_KEY}"}, timeout=30,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    tenant = r.json()
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {tenant['api_key']}"}, timeout=30
    ) as api:
        yield base, tenant, api


def two_runs(api: httpx.Client) -> tuple[str, list[str]]:
    """A run that succeeds and one the handler fails once (so it is announced
    again, as attempt 2), triggered on one queue: (the queue's topic, run ids)."""
    ids, topic = [], None
    for payload in ({"n": 1}, {"fail": "retry"}):
        body = {
            "name": f"j-{uuid.uuid4().hex[:6]}", "schedule": {"every_ms": 86_400_000},
            "target": {"type": "queue", "queue": "records"}, "payload": payload,
            "lease_ms": 3000,
            "retry": {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 200},
        }  # fmt: skip
        r = api.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        topic = r.json()["topic"]
        t = api.post(f"/v1/jobs/{r.json()['job_id']}/trigger")
        assert t.status_code == 201, t.text
        ids.append(t.json()["run_id"])
    return topic, ids


def announced(records) -> set[tuple[str, int, bytes]]:
    """(run id, attempt, writer schema's fingerprint) of each record read."""
    out = set()
    for m in records:
        _, datum = default_registry().decode(m.value())
        assert m.key().decode() == datum["run_id"]
        out.add((datum["run_id"], datum["attempt"], m.value()[2:10]))
    return out


def finished(api: httpx.Client, ids: list[str]) -> list[dict]:
    def states():
        got = [api.get(f"/v1/runs/{i}").json() for i in ids]
        return got if all(r["state"] in TERMINAL for r in got) else None

    return wait_for(states, timeout=60, interval=0.2, what="both runs terminal")


def this_sdk_handles(topic, handle, base, tenant, bootstrap, api, ids) -> list[dict]:
    """This release's SDK Worker (in a thread, with the tenant's key and Kafka
    credentials) on `topic` until the runs `ids` are terminal; their runs."""
    creds = tenant["kafka"]
    worker = Worker(
        topic, handle, api_url=base, api_key=tenant["api_key"], bootstrap=bootstrap,
        kafka_username=creds["username"], kafka_password=creds["password"],
        concurrency=2, drain_seconds=5,
    )  # fmt: skip
    thread = threading.Thread(target=worker.run, name="sdk-worker-this", daemon=True)
    thread.start()
    try:
        return finished(api, ids)
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"


def test_v0_1_0_sdk__handles_the_v2_records_this_release_writes(
    v1_release, database_url, kafka_bootstrap, topic_prefix
):
    _rel, tree = v1_release  # the first SDK with the v2 file, staged: the oldest to read v2
    with psycopg.connect(database_url, autocommit=True) as conn:  # its handler's effects
        conn.execute("CREATE TABLE sdk_effects (run_id text PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE sdk_executions (run_id text, attempt int, at timestamptz DEFAULT now())"
        )
    with (
        launcher(database_url, kafka_bootstrap, topic_prefix, lease_ttl_ms=3000) as launch,
        platform(launch.start, CRONWHEEL_CELL=CELL) as (base, tenant, api),
    ):
        topic, ids = two_runs(api)
        env = {**os.environ, "CRONWHEEL_URL": base, "CRONWHEEL_API_KEY": tenant["api_key"],
               "KAFKA_BOOTSTRAP": kafka_bootstrap, "EFFECTS_DSN": database_url,
               **worker_env(tenant["kafka"])}  # fmt: skip
        log = launch.log_dir / "sdk-worker-previous.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [previous.PYTHON, "-m", "tests.support.sdk_worker", topic],
                cwd=tree, env=previous.env(tree, env), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            done = finished(api, ids)
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
        report = log.read_text(errors="replace")[-3000:]
        assert code == 0, report
        assert [(r["state"], r["attempt"]) for r in done] == [("SUCCEEDED", 1), ("SUCCEEDED", 2)]
        assert done[1]["result"] == {"attempt": 2}, report

        records = read_all(kafka_bootstrap, [topic])
    with psycopg.connect(database_url) as conn:
        executions = conn.execute("SELECT run_id, attempt FROM sdk_executions").fetchall()
        effects = {r for (r,) in conn.execute("SELECT run_id FROM sdk_effects")}
    # Its handler ran each attempt and made both runs' effects ...
    assert sorted(executions) == sorted([(ids[0], 1), (ids[1], 1), (ids[1], 2)])
    assert effects == set(ids)
    # ... from v2 records, the retry's announcement included, naming the cell.
    assert announced(records) == {(ids[0], 1, V2), (ids[1], 1, V2), (ids[1], 2, V2)}
    for m in records:
        _, datum = default_registry().decode(m.value())
        assert datum["cell"] == CELL
        assert datum["traceparent"] == events.traceparent(datum["run_id"], datum["attempt"])


def test_this_sdk__handles_the_records_the_previous_release_writes(
    release, servers, kafka_bootstrap, topic_prefix
):
    _rel, tree = release
    seen: list[Run] = []

    def handle(run: Run) -> dict:
        seen.append(run)
        if run.payload.get("fail") == "retry" and run.attempt == 1:
            raise RuntimeError("transient")
        return {"attempt": run.attempt}

    with (
        upgrade.expand_only_database(servers.database_url) as admin_url,
        launcher(
            dbsupport.platform_url(admin_url), kafka_bootstrap, topic_prefix, lease_ttl_ms=3000
        ) as launch,
        platform(functools.partial(upgrade.start_previous, launch, tree)) as (base, tenant, api),
    ):
        topic, ids = two_runs(api)
        done = this_sdk_handles(topic, handle, base, tenant, kafka_bootstrap, api, ids)
        assert [(r["state"], r["attempt"]) for r in done] == [("SUCCEEDED", 1), ("SUCCEEDED", 2)]
        assert done[1]["result"] == {"attempt": 2}

        records = read_all(kafka_bootstrap, [topic])
    # The previous release wrote the version it published (v0.1.0: v1), the
    # retry's announcement included ...
    written = SchemaRegistry(tree / "schemas").latest("RunReady")
    fp = written.fingerprint
    assert announced(records) == {(ids[0], 1, fp), (ids[1], 1, fp), (ids[1], 2, fp)}
    # ... and this SDK handed each attempt to the handler: from a v1 record
    # without a traceparent or cell.
    assert sorted((r.run_id, r.attempt) for r in seen) == sorted(
        [(ids[0], 1), (ids[1], 1), (ids[1], 2)]
    )
    assert {r.priority for r in seen} == {"normal"}
    if written.version == 1:
        assert {(r.traceparent, r.cell) for r in seen} == {(None, None)}
    else:  # a later previous release, which writes v2 itself
        assert all(r.traceparent == events.traceparent(r.run_id, r.attempt) for r in seen)


# v0.1.0's events.run_ready, run from its tree: kwargs as JSON lines in, hex out.
V1_WRITER = (
    "import json, sys\n"
    "from cronwheel.core import events\n"
    "for line in sys.stdin:\n"
    "    print(events.run_ready(**json.loads(line)).hex())\n"
)


def test_this_sdk__handles_v1_records_as_v0_1_0_writes_them(
    v1_release, database_url, kafka_bootstrap, topic_prefix
):
    """Not v0.1.0's services (the upgrade guarantee holds between neighbour
    releases only), its record writer: the run this release's gateway made,
    announced again as v0.1.0 announced runs, on the queue topic; no relay or
    dispatcher runs, so this release's own v2 record stays in the outbox."""
    _rel, tree = v1_release
    seen: list[Run] = []

    def seen_and_done(run: Run) -> dict:
        seen.append(run)
        return {"attempt": run.attempt}

    with (
        launcher(database_url, kafka_bootstrap, topic_prefix, lease_ttl_ms=3000) as launch,
        platform(lambda name, **env: name == "gateway" and launch.start(name, **env))
        as (base, tenant, api),
    ):  # fmt: skip
        topic, ids = two_runs(api)
        with psycopg.connect(database_url) as conn:
            outbox = dict(conn.execute("SELECT key, value FROM outbox").fetchall())
        kwargs = []
        for run_id in ids:
            _, d = default_registry().decode(bytes(outbox[run_id.encode()]))
            kwargs.append(json.dumps({
                "run_id": d["run_id"], "tenant_id": d["tenant_id"], "job_id": d["job_id"],
                "partition_id": d["partition_id"], "attempt": d["attempt"],
                "scheduled_ms": d["scheduled_at"], "created_ms": d["created_at"],
                "priority": d["priority"], "target_type": d["target_type"],
                "queue": d["queue"], "payload": d["payload"],
            }))  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", V1_WRITER], input="\n".join(kwargs) + "\n",
            cwd=tree, env=previous.env(tree), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        values = [bytes.fromhex(h) for h in out.stdout.split()]
        assert [v[2:10] for v in values] == [V1, V1]

        cwkafka.ensure_topics(
            [topic], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher"
        )
        producer = cwkafka.producer(kafka_bootstrap, principal="dispatcher")
        for run_id, value in zip(ids, values, strict=True):
            producer.produce(topic, key=run_id.encode(), value=value)
        assert producer.flush(15) == 0

        done = this_sdk_handles(topic, seen_and_done, base, tenant, kafka_bootstrap, api, ids)
        assert [r["state"] for r in done] == ["SUCCEEDED", "SUCCEEDED"]
    assert sorted(r.run_id for r in seen) == sorted(ids)
    assert {(r.traceparent, r.cell) for r in seen} == {(None, None)}
    assert {json.dumps(r.payload, sort_keys=True) for r in seen} == {
        '{"n": 1}',
        '{"fail": "retry"}',
    }


def test_schemas__every_file_of_the_previous_release__is_here_unchanged(release):
    rel, tree = release
    files = sorted((tree / "schemas").glob("*.avsc"))
    assert files, f"{rel.tag} has no schema files"
    for old in files:
        published = SCHEMA_DIR / old.name.removeprefix("staged.")
        here = SCHEMA_DIR / old.name if (SCHEMA_DIR / old.name).exists() else published
        assert here.exists(), f"{old.name} of {rel.tag} is gone: its records no longer decode"
        assert here.read_bytes() == old.read_bytes(), f"{here.name} differs from {rel.tag}'s"
