"""Workflows: how fast a completion releases the next node, and how long a wide
fan-out / fan-in takes from trigger to SUCCEEDED.

1. Release latency: workflows `p1, p2 -> child`. p1 is completed and applied
   first; then p2's CompleteRun commits (Lifecycle.complete, the same
   transaction the gateway runs) and the clock runs until the child's RunReady
   is readable on the tenant's runs topic: relay -> Kafka -> the workflow
   service's transaction -> relay -> Kafka. Target: p99 <= 50 ms.
2. Fan-out / fan-in: root -> N middle nodes -> sink, from the trigger to the
   workflow run's SUCCEEDED. With the gateway available, executed by the SDK
   worker (cronwheel.sdk.Worker over the dispatcher's queue topic and the HTTP
   worker protocol); otherwise completed through Lifecycle directly. The API
   caps a workflow at 500 nodes, so the 500-node run is what a user can
   create; the 1,000-node run raises the cap in this process only.

Every service runs as a `cronwheel serve` process on a fresh database. Figures
are printed, never asserted; the machine's load is printed beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from common import (
    ROOT,
    Reader,
    completions_topic,
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    machine_load,
    observer_group,
    percentile,
    prefix_topics,
    say,
    tenant_kafka,
)

from cronwheel import config, kafka
from cronwheel.core import workflows as core_workflows
from cronwheel.core.clock import now_ms, to_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import create_tenant
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.workflows import Workflows

PYTHON = sys.executable  # the interpreter running the bench (.venv/bin/python under make bench)
LATENCY_SAMPLES = int(os.environ.get("BENCH_LATENCY_SAMPLES", "300"))
TARGET_P99_MS = 50
FAN_SIZES = tuple(int(x) for x in os.environ.get("BENCH_FAN_SIZES", "500,1000").split(","))
QUEUE = {"type": "queue", "queue": "bench"}


class Procs:
    """`cronwheel serve NAME` processes against one database and topic prefix."""

    def __init__(self, url: str, prefix: str, **env: str):
        self.env = {k: v for k, v in os.environ.items() if k != "CRONWHEEL_METRICS_PORT"}
        self.env.update(
            DATABASE_URL=config.role_url(url, config.PG_PLATFORM_USER),  # not the owner
            KAFKA_BOOTSTRAP=config.kafka_bootstrap(),
            CRONWHEEL_TOPIC_PREFIX=prefix,
            CRONWHEEL_LOG_LEVEL=os.environ.get("CRONWHEEL_LOG_LEVEL", "WARNING"),
            **env,
        )
        self.logdir = Path(tempfile.mkdtemp(prefix="cw-bench-wf-"))
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str) -> None:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - kept by the process
        self.procs[name] = subprocess.Popen(
            [str(PYTHON), "-m", "services.entrypoints", "serve", name],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.logdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"service {name} exited with {p.returncode}:\n{tail}")

    def close(self, keep_logs: bool = False) -> None:
        """SIGTERM each (their own clean shutdown); the logs are kept only when asked
        (a failed run), and then printed where they are."""
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if keep_logs:
            say(f"service logs kept in {self.logdir}")
        else:
            shutil.rmtree(self.logdir, ignore_errors=True)


def poll(check, timeout: float, procs: Procs, what: str, interval: float = 0.005):
    """`check()` until truthy; services are checked alive on the way. (Measured
    times come from the reader's clock and the database, not from this loop.)"""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        procs.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def finish(conn, lc: Lifecycle, tenant_id: str, run_id: str) -> None:
    got = lc.start(conn, tenant_id, run_id, "bench", now_ms())
    lc.complete(conn, tenant_id, run_id, got["attempt"], got["start_token"], "SUCCEEDED", now_ms())


def node_run(conn, wfr: str, node: str) -> str | None:
    row = conn.execute(
        "SELECT run_id FROM workflow_run_nodes WHERE workflow_run_id = %s AND node = %s",
        [wfr, node],
    ).fetchone()
    return row[0] if row else None


def processed(conn, run_id: str):
    row = conn.execute(
        "SELECT processed_at FROM processed WHERE consumer = 'workflow' AND message_key = %s",
        [run_id],
    ).fetchone()
    return row[0] if row else None


# -- 1. release latency ------------------------------------------------------------


def release_latency(url: str, topics: Topics, tenant: dict, procs: Procs, reader: Reader) -> None:
    wf_store, lc = Workflows(topics), Lifecycle(topics)
    tid = tenant["tenant_id"]
    total, first_hop, second_hop = [], [], []
    with psycopg.connect(url, autocommit=True) as conn:
        wf = wf_store.create(
            conn,
            tenant,
            {
                "name": "join",
                "nodes": [
                    {"name": "p1", "target": QUEUE},
                    {"name": "p2", "target": QUEUE},
                    {"name": "child", "target": QUEUE, "depends_on": ["p1", "p2"]},
                ],
            },
            now_ms(),
        )
        for i in range(LATENCY_SAMPLES + 20):  # the first 20 warm up
            wfr = wf_store.trigger(conn, tenant, wf["workflow_id"], now_ms())["workflow_run_id"]
            p1, p2 = node_run(conn, wfr, "p1"), node_run(conn, wfr, "p2")
            finish(conn, lc, tid, p1)
            poll(lambda p1=p1: processed(conn, p1), 30, procs, "p1 applied")
            finish(conn, lc, tid, p2)
            t0 = now_ms()  # p2's CompleteRun has committed
            child = poll(lambda w=wfr: node_run(conn, w, "child"), 30, procs, "the child's run")
            key = child.encode()
            poll(lambda k=key: k in reader.arrivals, 30, procs, "the child's record")
            if i < 20:
                continue
            arrived = reader.arrivals[key].received_ms
            applied = to_ms(processed(conn, p2))
            total.append(arrived - t0)
            first_hop.append(applied - t0)
            second_hop.append(arrived - applied)
    p99 = percentile(total, 99)
    say(
        f"release latency, {LATENCY_SAMPLES} joins, last parent's commit -> child's record readable:"
    )
    say(f"  total:      {describe(total)}")
    say(
        f"  commit -> workflow service applied it (relay, Kafka, consume, transaction): {describe(first_hop)}"
    )
    say(
        f"  applied -> child's RunReady readable on the runs topic (relay, Kafka):       {describe(second_hop)}"
    )
    say(
        f"RESULT release latency p50 {percentile(total, 50):.0f} ms, p99 {p99:.0f} ms"
        f" (target p99 <= {TARGET_P99_MS} ms: {'met' if p99 <= TARGET_P99_MS else 'MISSED'})"
    )


# -- 2. fan-out / fan-in -------------------------------------------------------------


def fan_body(n: int) -> dict:
    middle = [{"name": f"m{i}", "target": QUEUE, "depends_on": ["root"]} for i in range(n - 2)]
    return {
        "name": f"fan{n}",
        "nodes": [
            {"name": "root", "target": QUEUE},
            *middle,
            {"name": "sink", "target": QUEUE, "depends_on": [m["name"] for m in middle]},
        ],
    }


class LifecycleWorker:
    """Without the gateway: completes every PENDING run of the tenant through
    Lifecycle, as fast as the database allows (threads, own connections)."""

    def __init__(self, url: str, topics: Topics, tenant_id: str, threads: int = 4):
        self.url, self.lc, self.tenant_id, self.threads = url, Lifecycle(topics), tenant_id, threads
        self.stop_flag = threading.Event()
        self._pool = [threading.Thread(target=self._loop, args=(i,)) for i in range(threads)]

    def _loop(self, i: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop_flag.is_set():
                rows = conn.execute(
                    "SELECT run_id FROM runs_daily WHERE state = 'PENDING' AND tenant_id = %s"
                    " AND abs(hashtext(run_id)) %% %s = %s LIMIT 200",
                    [self.tenant_id, self.threads, i],
                ).fetchall()
                for (run_id,) in rows:
                    with contextlib.suppress(Exception):  # another thread's, or gone
                        finish(conn, self.lc, self.tenant_id, run_id)
                if not rows:
                    self.stop_flag.wait(0.005)

    def __enter__(self):
        for t in self._pool:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        for t in self._pool:
            t.join(10)


def sdk_worker(topics: Topics, tenant: dict, api_url: str):
    from cronwheel.sdk import Worker

    kafka.ensure_topics([topics.queue(tenant["tenant_id"], QUEUE["queue"])], principal="dispatcher")
    worker = Worker(
        topics.queue(tenant["tenant_id"], QUEUE["queue"]),
        lambda run: None,
        api_url=api_url,
        api_key=tenant["api_key"],
        bootstrap=config.kafka_bootstrap(),
        concurrency=16,
        drain_seconds=5,
        **tenant_kafka(topics, tenant["tenant_id"]),
    )
    thread = threading.Thread(target=worker.run, name="sdk-worker", daemon=True)
    return worker, thread


def fan_run(url: str, topics: Topics, tenant: dict, n: int, procs: Procs) -> tuple[float, int]:
    """Trigger -> SUCCEEDED seconds, and how many runs the workflow run made."""
    wf_store = Workflows(topics)
    saved = core_workflows.MAX_NODES
    core_workflows.MAX_NODES = max(saved, n)  # this process only: see the module docstring
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            wf = wf_store.create(conn, tenant, fan_body(n), now_ms())
            t0 = now_ms()
            wfr = wf_store.trigger(conn, tenant, wf["workflow_id"], t0)["workflow_run_id"]
            state = poll(
                lambda: conn.execute(
                    "SELECT state, finished_at FROM workflow_runs WHERE workflow_run_id = %s"
                    " AND state <> 'RUNNING'",
                    [wfr],
                ).fetchone(),
                300,
                procs,
                f"the {n}-node workflow run",
                interval=0.05,
            )
            if state[0] != "SUCCEEDED":
                raise RuntimeError(f"the {n}-node workflow run ended {state[0]}")
            runs = conn.execute(
                "SELECT count(*) FROM runs_daily WHERE workflow_run_id = %s", [wfr]
            ).fetchone()[0]
            say(
                f"  {n} nodes, where the time went (ms after the trigger): {_phases(conn, wfr, t0)}"
            )
            return (to_ms(state[1]) - t0) / 1000, runs
    finally:
        core_workflows.MAX_NODES = saved


def _phases(conn, wfr: str, t0: int) -> str:
    """For the middle nodes: when their runs were created, started, finished and
    their completions applied by the workflow service (first .. last)."""
    row = conn.execute(
        """SELECT min(r.created_at), max(r.created_at), min(r.started_at), max(r.started_at),
                  min(r.finished_at), max(r.finished_at), min(p.processed_at), max(p.processed_at)
             FROM runs_daily r JOIN processed p ON p.consumer = 'workflow' AND p.message_key = r.run_id
            WHERE r.workflow_run_id = %s AND r.node LIKE 'm%%'""",
        [wfr],
    ).fetchone()
    ms = [to_ms(x) - t0 for x in row]
    return (
        f"created {ms[0]}..{ms[1]}, started {ms[2]}..{ms[3]}, finished {ms[4]}..{ms[5]},"
        f" applied {ms[6]}..{ms[7]}"
    )


# -- 0. why not faust ----------------------------------------------------------------


def consumer_hop(topics: Topics, samples: int = 500) -> None:
    """The consumer hop alone, for the choice of client: one record produced at a
    time, timed until the handler sees it, for a faust-streaming agent and for a
    confluent-kafka loop shaped like the workflow service's (consume 1, then what
    the client already fetched); plus each one's start-up to its first record.
    On a run topic of the bench's prefix, as the platform's roles use one:
    created by the dispatcher's principal, written by the relay's, read (and
    committed, in an observer group) by the observer's."""
    bootstrap = config.kafka_bootstrap()
    for name, start in (
        ("confluent-kafka loop", _confluent_consumer),
        ("faust agent", _faust_agent),
    ):
        topic = topics.runs(f"hop-{uuid.uuid4().hex[:8]}")
        kafka.ensure_topics([topic], bootstrap=bootstrap, principal="dispatcher")
        seen: dict[bytes, float] = {}
        first = threading.Event()
        stop = threading.Event()
        t0 = time.monotonic()
        thread = threading.Thread(target=start, args=(bootstrap, topic, seen, first, stop))
        thread.start()
        producer = kafka.producer(bootstrap, principal="relay", **{"linger.ms": 0})
        i = 0
        while not first.is_set():  # probes until the consumer has its partitions
            producer.produce(topic, key=b"probe", value=b"probe%d" % i)
            producer.flush(5)
            i += 1
            first.wait(0.2)
        startup = time.monotonic() - t0
        lat = []
        for j in range(samples):
            value = b"m%d" % j
            sent = time.monotonic()
            producer.produce(topic, key=str(j).encode(), value=value)
            producer.flush(5)
            while value not in seen:
                time.sleep(0.0002)
            lat.append((seen[value] - sent) * 1000)
        stop.set()
        thread.join(30)
        delete_topics([topic])
        say(
            f"  {name}: produce -> handler {describe(lat)};"
            f" start-up to the first record {startup:.2f} s"
        )


def _confluent_consumer(bootstrap, topic, seen, first, stop) -> None:
    c = kafka.consumer(observer_group("hop"), bootstrap, principal="observer")
    c.subscribe([topic])
    try:
        while not stop.is_set():
            msgs = c.consume(1, 0.2)
            if msgs:
                msgs += c.consume(499, 0)
            for m in msgs:
                if m.error() is None:
                    seen[m.value()] = time.monotonic()
                    first.set()
            if msgs:
                c.commit(asynchronous=True)
    finally:
        c.close()


def _faust_agent(bootstrap, topic, seen, first, stop) -> None:
    import asyncio

    import faust

    datadir = tempfile.mkdtemp(prefix="cw-bench-faust-")  # not `<app id>-data` in the cwd
    # The app id is its consumer group: the observer's. The observer creates no
    # topic, so faust declares none (the topic exists) and makes no leader topic.
    conf = kafka.security("observer", bootstrap)
    credentials = (
        faust.SASLCredentials(
            username=conf["sasl.username"],
            password=conf["sasl.password"],
            mechanism=conf["sasl.mechanism"],
        )
        if "sasl.username" in conf
        else None
    )
    app = faust.App(
        observer_group("hop"),
        datadir=datadir,
        broker=f"kafka://{bootstrap}",
        broker_credentials=credentials,
        topic_allow_declare=False,
        topic_disable_leader=True,
        value_serializer="raw",
        key_serializer="raw",
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=1,
    )

    @app.agent(app.topic(topic, value_type=bytes, key_type=bytes))
    async def handler(stream):
        async for event in stream.events():
            seen[event.value] = time.monotonic()
            first.set()

    async def main():
        await app.start()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await app.stop()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        shutil.rmtree(datadir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-gateway", action="store_true", help="complete through Lifecycle")
    ap.add_argument(
        "--no-consumers", action="store_true", help="skip timing faust vs confluent-kafka"
    )
    args = ap.parse_args()
    header("bench_workflows: node release latency and a wide fan-out / fan-in")
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    grant(prefix)
    gateway = not args.no_gateway and importlib.util.find_spec("services.gateway.main") is not None
    addr = f"127.0.0.1:{_free_port()}"
    with fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            tenant = create_tenant(conn, "bench-workflows")
        runs_topic = topics.runs(tenant["tenant_id"])
        procs = Procs(
            url,
            prefix,
            CRONWHEEL_HTTP_ADDR=addr,
            CRONWHEEL_OPERATOR_KEY="cwop_bench_" + uuid.uuid4().hex,
            CRONWHEEL_RATE_LIMIT="100000",
            CRONWHEEL_RATE_BURST="100000",
        )
        ok = False
        try:
            if not args.no_consumers:
                say("the consumer hop alone (why the workflow service is not a faust agent):")
                consumer_hop(topics)
            completions_topic(topics)  # before the relay publishes a completion
            for name in ("relay", "workflow"):
                procs.start(name)
            say(
                "setup: fresh database, one tenant; `cronwheel serve relay` and"
                " `cronwheel serve workflow` as processes; CompleteRun through Lifecycle in"
                " this process; a confluent-kafka reader of the tenant's runs topic"
            )
            with Reader([runs_topic]) as reader:
                release_latency(url, topics, tenant, procs, reader)
            say(f"machine after: {machine_load()}")
            if gateway:
                for name in ("dispatcher", "gateway"):
                    procs.start(name)
                poll(lambda: _healthy(addr), 60, procs, "the gateway")
                worker, thread = sdk_worker(topics, tenant, f"http://{addr}")
                thread.start()
                how = (
                    "the SDK worker (cronwheel.sdk.Worker, 16 threads) via `cronwheel serve"
                    " dispatcher` and `cronwheel serve gateway`"
                )
                ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
            else:
                how = "Lifecycle.start/complete directly (4 threads; the gateway is not available)"
                ctx = LifecycleWorker(url, topics, tenant["tenant_id"])
            say(f"fan-out / fan-in: root -> N-2 middle nodes -> sink, executed by {how}")
            with ctx:
                fan_run(url, topics, tenant, 10, procs)  # warm-up: every path connected
                for n in FAN_SIZES:
                    secs, runs = fan_run(url, topics, tenant, n, procs)
                    note = (
                        "" if n <= 500 else " (over the API's 500-node cap: raised for the bench)"
                    )
                    say(
                        f"RESULT fan-out/fan-in {n} nodes{note}: trigger -> SUCCEEDED in"
                        f" {secs:.2f} s, {runs} runs, {runs / secs:,.0f} node runs/s"
                    )
            if gateway:
                worker.stop()
                thread.join(30)
            say(f"machine after: {machine_load()}")
            ok = True
        finally:
            procs.close(keep_logs=not ok)
            if mine := prefix_topics(prefix):  # the dead-letter topic included
                delete_topics(mine)


def _healthy(addr: str) -> bool:
    try:
        return httpx.get(f"http://{addr}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
