"""A burst of new tenants, each with a queue, a webhook and a managed job, while
a steady tenant's runs flow through an SDK worker and the CPU is loaded by a
busy process. Every consumer (dispatcher, workflow, webhook, executor, SDK)
must stay up, and every run be delivered once.

The counts come from the effects: the queue topics' records, the webhook
receiver's requests and the SDK worker's executions are each counted with
duplicates, never deduplicated first."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter

import httpx
import psycopg
import pytest

from cronwheel.core.clock import iso, now_ms
from cronwheel.kafka import Topics
from cronwheel.store.jobs import Jobs, create_tenant
from tests.e2e.test_sdk_worker import OPERATOR_KEY, _free_port
from tests.e2e.test_tenant_churn import read_all, records_on
from tests.integration.test_webhook_delivery import Receiver
from tests.support.kafka import tenant_credentials, worker_env
from tests.support.procs import PYTHON, ROOT, launcher
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="the executor needs bubblewrap"),
]

NEW_TENANTS = 30
CONSUMERS = ("dispatcher", "workflow", "webhook", "executor")


@contextlib.contextmanager
def busy_cpu():
    """One process spinning on a core for the duration: the machine loaded."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spin.kill()
        spin.wait(10)


def _gateway_topics(api_base: str, outcome: str) -> float:
    """cronwheel_gateway_topics_total{outcome} as the gateway exports it."""
    text = httpx.get(f"{api_base}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("cronwheel_gateway_topics_total{") and f'outcome="{outcome}"' in line
    )


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_tenant_burst__queue_webhook_managed_jobs_while_runs_flow_under_load__every_consumer_up__each_run_once(
    database_url, kafka_bootstrap, topic_prefix, receiver
):
    topics = Topics(topic_prefix)
    jobs = Jobs(topics)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE sdk_executions (run_id text, attempt int, at timestamptz DEFAULT now())"
        )
        conn.execute("CREATE TABLE sdk_effects (run_id text PRIMARY KEY)")
        steady = create_tenant(conn, "steady")
        with conn.transaction():
            steady_job = jobs.create(
                conn,
                steady,
                {
                    "name": "steady",
                    "schedule": {"every_ms": 500},
                    "target": {"type": "queue", "queue": "work"},
                },
                now_ms(),
            )

    port = _free_port()
    settings = {
        "CRONWHEEL_WEBHOOK_ALLOW_CIDRS": "127.0.0.0/8",
        "CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}",
        "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY,
        # The CPU is loaded on purpose: the gateway waits for its topics
        # however long the broker takes, so every one is counted as made.
        "CRONWHEEL_GATEWAY_TOPICS_WAIT_MS": "60000",
    }
    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        names = ("gateway", "timer", "relay", *CONSUMERS)
        procs = {n: launch.start(n, **settings) for n in names}
        sdk_log = launch.log_dir / "sdk.log"
        base = f"http://127.0.0.1:{port}"
        with sdk_log.open("wb") as out:
            sdk = subprocess.Popen(
                [PYTHON, "-m", "tests.support.sdk_worker", steady_job["topic"]],
                env={
                    **launch.env,
                    "EFFECTS_DSN": database_url,
                    "CRONWHEEL_URL": base,
                    "CRONWHEEL_API_KEY": steady["api_key"],
                    **worker_env(tenant_credentials(kafka_bootstrap, topics, steady["tenant_id"])),
                },
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                wait_for(
                    lambda: (
                        conn.execute("SELECT count(*) FROM sdk_effects").fetchone()[0] >= 3
                        or sdk.poll() is not None
                    ),
                    timeout=60,
                    what="the steady tenant's runs flowing through the SDK worker",
                )
                assert sdk.poll() is None, sdk_log.read_text()[-3000:]
                made: list[tuple[str, dict]] = []
                with busy_cpu(), httpx.Client(base_url=base, timeout=30) as api:
                    for i in range(NEW_TENANTS):
                        # As a user makes them: the gateway makes each new
                        # tenant's topics before it answers, beside the
                        # dispatcher's making them on the notifications.
                        r = api.post(
                            "/v1/tenants",
                            json={"name": f"burst-{i}-{uuid.uuid4().hex[:4]}"},
                            headers={"Authorization": f"Bearer {OPERATOR_KEY}"},
                        )
                        assert r.status_code == 201, r.text
                        t = r.json()
                        at = iso(now_ms() + 2000)
                        bodies = [
                            {"name": "q", "schedule": {"at": at},
                             "target": {"type": "queue", "queue": "q"}},
                            {"name": "hook", "schedule": {"at": at},
                             "target": {"type": "webhook", "url": receiver.url(f"/{t['tenant_id']}")}},
                            {"name": "managed", "schedule": {"at": at},
                             "target": {"type": "managed", "command": ["true"]}},
                        ]  # fmt: skip
                        r = api.post(
                            "/v1/jobs/batch",
                            json={"jobs": bodies},
                            headers={"Authorization": f"Bearer {t['api_key']}"},
                        )
                        results = r.json()["results"]
                        assert [x["status"] for x in results] == [201] * 3, r.text
                        jobs_made = [x["job"] for x in results]
                        made.append((t["tenant_id"], {j["name"]: j["job_id"] for j in jobs_made}))
                        for name, p in procs.items():
                            assert p.alive(), f"{name} died during the burst:\n{p.log()[-3000:]}"
                        time.sleep(0.1)  # the burst's pace, not a wait

                    managed_ids = [ids["managed"] for _t, ids in made]

                    def managed_done() -> bool:
                        n = conn.execute(
                            "SELECT count(*) FROM runs_daily WHERE job_id = ANY(%s) AND state = 'SUCCEEDED'",
                            [managed_ids],
                        ).fetchone()[0]
                        return n == NEW_TENANTS

                    wait_for(
                        lambda: (
                            sum(1 for g in receiver.requests() if g.path.strip("/") in dict(made))
                            >= NEW_TENANTS
                        ),
                        timeout=90,
                        interval=0.2,
                        what="every new tenant's webhook run delivered",
                    )
                    wait_for(managed_done, timeout=90, interval=0.2, what="every managed run done")
                    queue_records = [topics.queue(t, "q") for t, _ids in made]
                    wait_for(
                        lambda: (
                            sum(max(records_on(kafka_bootstrap, q), 0) for q in queue_records)
                            >= NEW_TENANTS
                        ),
                        timeout=90,
                        interval=0.5,
                        what="every new tenant's queue run on its topic",
                    )
                for name, p in procs.items():
                    assert p.alive(), f"{name} died:\n{p.log()[-3000:]}"
                    assert "Assertion" not in p.log(), name
                # The gateway made every new tenant's topics (run, queue,
                # webhook, managed) before answering, as its own principal.
                assert "could not make topics" not in procs["gateway"].log()
                assert _gateway_topics(api_base=base, outcome="made") == 4 * NEW_TENANTS
                assert sdk.poll() is None, sdk_log.read_text()[-3000:]

                # Once each: counted with duplicates.
                hooks = Counter(g.path.strip("/") for g in receiver.requests())
                assert {t: hooks[t] for t, _ in made} == {t: 1 for t, _ in made}
                queued = Counter(read_all(kafka_bootstrap, f"{topic_prefix}.q."))
                burst_runs = {
                    r for (r,) in conn.execute(
                        "SELECT run_id FROM runs_daily WHERE job_id = ANY(%s)",
                        [[ids["q"] for _t, ids in made]],
                    ).fetchall()
                }  # fmt: skip
                assert len(burst_runs) == NEW_TENANTS
                assert {r: queued[r] for r in burst_runs} == dict.fromkeys(burst_runs, 1)
                attempts = conn.execute(
                    "SELECT max(attempt) FROM runs_daily WHERE job_id = ANY(%s)", [managed_ids]
                ).fetchone()[0]
                assert attempts == 1
                executions, effects = conn.execute(
                    "SELECT (SELECT count(*) FROM sdk_executions), (SELECT count(*) FROM sdk_effects)"
                ).fetchone()
                assert executions == effects, "the SDK worker ran a steady run twice"
        finally:
            sdk.terminate()
            sdk.wait(30)
