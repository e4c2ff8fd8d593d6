"""A bounded schemathesis run over /openapi.json against the live gateway: valid
and invalid requests to every /v1 operation, with real keys and real ids; no
answer may be a 5xx, and every error is application/problem+json."""

from __future__ import annotations

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.service import GatewayService
from tests.support.running import running

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_fuzz_operator"
EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 4, schemathesis.GenerationMode.NEGATIVE: 3}
JOB = {
    "name": "fuzz",
    "schedule": {"cron": "*/5 * * * *", "timezone": "UTC"},
    "target": {"type": "queue", "queue": "q"},
}


@pytest.fixture
def live(database_url, kafka_bootstrap, topic_prefix):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY)
    try:
        with running(GatewayService(app, "127.0.0.1", 0, "warning")) as svc:
            yield svc
    finally:
        app.state.gateway.close()


def _world(url: str) -> dict:
    with httpx.Client(base_url=url, timeout=10) as c:
        op = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        t = c.post("/v1/tenants", json={"name": "fuzz"}, headers=op).json()
        h = {"Authorization": f"Bearer {t['api_key']}"}
        job = c.post("/v1/jobs", json=JOB, headers=h).json()["job_id"]
        run = c.post(f"/v1/jobs/{job}/trigger", headers=h).json()["run_id"]
        key = c.get("/v1/keys", headers=h).json()["items"][0]["key_id"]
        spec = c.get("/openapi.json").json()
    return {
        "spec": spec,
        "tenant": h,
        "operator": op,
        "ids": {"job_id": job, "run_id": run, "tenant_id": t["tenant_id"], "key_id": key},
    }


def test_schemathesis__every_operation__no_server_error(live):
    world = _world(live.url)
    schema = schemathesis.openapi.from_dict(world["spec"]).include(path_regex="^/v1/")
    session = requests.Session()
    failures: list[str] = []
    operations = exercised = 0
    for result in schema.get_all_operations():
        op = result.ok()
        operations += 1
        auth = world["operator"] if op.path.startswith("/v1/tenants") else world["tenant"]
        names = {p.name for p in op.path_parameters}
        for mode, examples in EXAMPLES.items():
            # Valid requests aim at real objects; invalid ones get generated ids too.
            ids = {k: v for k, v in world["ids"].items() if k in names}
            kwargs = (
                {"path_parameters": ids} if mode == schemathesis.GenerationMode.POSITIVE else {}
            )
            strategy = op.as_strategy(generation_mode=mode, headers=auth, **kwargs)

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def check(case):
                response = case.call(base_url=live.url, session=session, timeout=15)
                status = response.status_code
                media = " ".join(response.headers.get("content-type") or [])  # values are lists
                if status >= 500 or (status >= 400 and "problem+json" not in media):
                    failures.append(f"{status} {case.as_curl_command()}\n{response.text[:300]}")

            try:
                check()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode == schemathesis.GenerationMode.NEGATIVE, op.label
                continue
            exercised += 1
    assert operations >= 20 and exercised >= 30
    assert failures == [], "\n\n".join(failures[:5])
