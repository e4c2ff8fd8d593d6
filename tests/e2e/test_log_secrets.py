"""No secret in any log line: the services started as an operator starts them
(`cronwheel serve NAME`, JSON lines at DEBUG), a tenant made through the API, a
key minted and revoked, a webhook job with a signing secret and a secret header
whose endpoint fails once, a managed job whose `env` holds a token and a plain
value that its command prints before it fails; then every line every process wrote is read.

Every line must be one JSON object with the service's fields, and none may
hold the API keys, the operator key, the signing secret, the header's value,
the env values or the database's password."""

from __future__ import annotations

import json
import shutil
import uuid
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.test_sdk_worker import OPERATOR_KEY, TERMINAL, _free_port
from tests.integration.test_webhook_delivery import Receiver, Reply
from tests.support.procs import launcher
from tests.support.wait import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="the executor needs bubblewrap"),
]

SERVICES = ("gateway", "timer", "relay", "dispatcher", "webhook", "executor")
# A managed job's env: a secret-looking name, whose value its output masks,
# and a plain one, whose value its output keeps.
ENV_TOKEN = "envtok" + uuid.uuid4().hex
ENV_PLAIN = "envval" + uuid.uuid4().hex
HEADER_TOKEN = "hdrtok" + uuid.uuid4().hex  # a webhook job's header value
RETRY = {"max_attempts": 2, "initial_backoff_ms": 100}


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def db_password_forms(database_url: str) -> list[str]:
    """How the database password would show in a line that leaked it: the URL
    itself, its `user:password@` part, a `password=` keyword."""
    parts = urlsplit(database_url)
    password = parts.password or ""
    assert password, "the test database URL has a password"
    return [database_url, f":{password}@", f"password={password}", f"password='{password}'"]


def test_full_flow__every_log_line_json__none_holds_a_secret(
    database_url, kafka_bootstrap, topic_prefix, receiver
):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    settings = {
        "CRONWHEEL_LOG_FORMAT": "json",
        "CRONWHEEL_LOG_LEVEL": "DEBUG",
        "CRONWHEEL_WEBHOOK_ALLOW_CIDRS": "127.0.0.0/8",
        "CRONWHEEL_HTTP_ADDR": f"127.0.0.1:{port}",
        "CRONWHEEL_OPERATOR_KEY": OPERATOR_KEY,
        "CRONWHEEL_GATEWAY_WORKERS": "2",  # the supervising process and its workers
    }
    receiver.routes["/hook"] = [Reply(500, body=b"try again"), Reply(200)]
    with launcher(database_url, kafka_bootstrap, topic_prefix) as launch:
        procs = [launch.start(name, **settings) for name in SERVICES]
        try:
            with httpx.Client(base_url=base, timeout=10) as c:
                wait_for(lambda: _ready(c), timeout=60, what="the gateway to be ready")
                operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
                made = c.post("/v1/tenants", json={"name": "acme"}, headers=operator)
                assert made.status_code == 201, made.text
                first_key = made.json()["api_key"]
                tenant_id = made.json()["tenant_id"]
                c.headers["Authorization"] = f"Bearer {first_key}"
                minted = c.post("/v1/keys", json={"label": "ci"})
                assert minted.status_code == 201, minted.text
                key = minted.json()["api_key"]
                c.headers["Authorization"] = f"Bearer {key}"

                targets = {
                    "hook": {
                        "type": "webhook",
                        "url": receiver.url("/hook"),
                        "headers": {"X-Token": HEADER_TOKEN},
                    },
                    "managed": {
                        "type": "managed",
                        "command": ["sh", "-c", 'echo "$API_TOKEN $REGION" >&2; exit 3'],
                        "env": {"API_TOKEN": ENV_TOKEN, "REGION": ENV_PLAIN},
                    },
                }
                jobs = {name: new_job(c, name, target) for name, target in targets.items()}
                signing_secret = jobs["hook"]["signing_secret"]["secret"]
                runs = {
                    name: c.post(f"/v1/jobs/{job['job_id']}/trigger").json()["run_id"]
                    for name, job in jobs.items()
                }

                def ended() -> dict | None:
                    states = {n: c.get(f"/v1/runs/{r}").json() for n, r in runs.items()}
                    done = all(s["state"] in TERMINAL for s in states.values())
                    return states if done else None

                states = wait_for(ended, timeout=90, what="both runs to end")
                assert states["hook"]["state"] == "SUCCEEDED", states["hook"]
                assert states["managed"]["state"] == "FAILED", states["managed"]
                assert len(states["managed"]["attempts"]) == 2, states["managed"]
                # The secrets were used: the endpoint got the header and a signature,
                # the command printed the env (its output keeps the plain value).
                got = [g for g in receiver.got if g.path == "/hook"]
                assert len(got) == 2
                assert got[0].headers["x-token"] == HEADER_TOKEN
                assert got[0].headers["webhook-signature"].startswith("v1,")
                assert states["managed"]["result"]["output"] == f"*** {ENV_PLAIN}\n"

                # Refusals: the revoked key, a key that never was, the operator key
                # where a tenant's is needed.
                revoked = c.delete(f"/v1/keys/{minted.json()['key_id']}")
                assert revoked.status_code == 204, revoked.text
                for auth in (key, "cw_" + uuid.uuid4().hex, OPERATOR_KEY):
                    r = c.get("/v1/jobs", headers={"Authorization": f"Bearer {auth}"})
                    assert r.status_code in (401, 403), r.text
        finally:
            for p in procs:
                p.stop()
        logs = {p.name: p.log() for p in procs}

    secrets = {
        "the tenant's first API key": first_key,
        "the minted API key": key,
        "the operator key": OPERATOR_KEY,
        "the webhook signing secret": signing_secret,
        "the webhook header's value": HEADER_TOKEN,
        "the managed job's secret env value": ENV_TOKEN,
        "the managed job's plain env value": ENV_PLAIN,
        **{
            f"the database password ({i})": v for i, v in enumerate(db_password_forms(database_url))
        },
    }
    lines = [(name, line) for name, text in logs.items() for line in text.splitlines() if line]
    assert {name for name, _ in lines} == set(SERVICES)  # each wrote something
    for name, line in lines:
        for what, value in secrets.items():
            # Named, not shown: the report must not repeat the secret either.
            assert value not in line, f"{name} logged {what}: {line.replace(value, '<secret>')}"

    # One JSON object a line, with the fields every line has.
    records = []
    for name, line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"{name} wrote a line that is not JSON: {line[:300]}")
        assert {"time", "level", "service", "logger", "message"} <= set(record), line
        assert record["service"] == name, line
        assert record["time"].endswith("Z") and len(record["time"]) == 24, line
        records.append(record)
    # The executor's line about the command's exit names the run in fields.
    about_managed = [
        r for r in records if r["service"] == "executor" and r.get("run_id") == runs["managed"]
    ]
    assert {r["attempt"] for r in about_managed} == {1, 2}, about_managed
    assert {r["tenant_id"] for r in about_managed} == {tenant_id}


def new_job(c: httpx.Client, name: str, target: dict) -> dict:
    """A job of `target`, due hourly (the test triggers it), retried once."""
    body = {"name": name, "schedule": {"every_ms": 3_600_000}, "target": target, "retry": RETRY}
    r = c.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _ready(c: httpx.Client) -> bool:
    try:
        return c.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False
