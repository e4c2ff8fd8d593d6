"""Issue 23, "Secrets": no secret sits in plain text in any table but the one
meant to hold it; replays of secret-bearing answers say the secret is not shown
again; a managed job's env is write-only in every answer; webhook signing
secrets are sealed (and rotate); expired idempotency rows are pruned; a weak
operator key stops the gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from cronwheel.core.clock import now_ms, to_dt
from cronwheel.core.jobs import ENV_MASK
from cronwheel.core.sealing import Key, Keyring, new_key, parse_keys
from cronwheel.core.ssrf import allowed_networks
from cronwheel.kafka import Topics
from cronwheel.store import sealed, webhooks
from services.gateway import idempotency
from services.gateway.app import create_app
from tests.support.gateway import served
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_KEY = "cwop_secrets_" + uuid.uuid4().hex
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
TOKEN = "tok-" + uuid.uuid4().hex  # a managed job's env value
HOOK = {
    "name": "hook",
    "schedule": {"every_ms": 3_600_000},
    "target": {"type": "webhook", "url": "http://127.0.0.1:9/hook"},
}
MANAGED = {
    "name": "managed",
    "schedule": {"every_ms": 3_600_000},
    "target": {"type": "managed", "command": ["/bin/true"], "env": {"API_TOKEN": TOKEN}},
}
HELD = {"secret_id": "whs_1", "secret": "whsec_legacy"}
# Where a plain value may be, by kind: a managed job's env is read by the
# executor from its job (and the run's copy of the target, in runs_daily and
# its day tables).
MAY_HOLD = {"env": {"jobs", "runs_daily"}}


def _table(name: str) -> str:
    """A day table or the default of a partitioned history table, as its parent."""
    return "runs_daily" if name.startswith("runs_daily_") else name


@pytest.fixture
def app(database_url, kafka_bootstrap, topic_prefix):
    return create_app(
        database_url,
        Topics(topic_prefix),
        kafka_bootstrap,
        OPERATOR_KEY,
        webhook_allow=allowed_networks("127.0.0.0/8"),
    )


def idem(headers: dict | None = None) -> dict:
    return {**(headers or {}), "Idempotency-Key": uuid.uuid4().hex}


def holders(conn, value: str) -> set[str]:
    """Every table with a text, json(b), bytea or array column holding `value`."""
    cols = conn.execute(
        """SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c
             JOIN information_schema.tables t USING (table_schema, table_name)
            WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
              AND c.data_type IN ('text', 'character varying', 'character', 'json',
                                  'jsonb', 'bytea', 'ARRAY', 'USER-DEFINED')"""
    ).fetchall()
    assert {"jobs", "webhook_secrets", "idempotency_keys"} <= {t for t, _c, _k in cols}
    found = set()
    for table, column, kind in cols:
        if kind == "bytea":
            where = f"position(convert_to(%(v)s, 'UTF8') IN \"{column}\") > 0"
        else:
            where = f'strpos("{column}"::text, %(v)s) > 0'
        if conn.execute(f'SELECT 1 FROM "{table}" WHERE {where} LIMIT 1', {"v": value}).fetchone():
            found.add(table)
    return found


def test_secrets__in_no_table_but_their_own__replays_say_not_shown_again(
    app, database_url, keyring
):
    with served(app) as c:
        first = idem(OPERATOR)
        made = c.post("/v1/tenants", json={"name": "acme"}, headers=first)
        assert made.status_code == 201, made.text
        tenant = {"Authorization": f"Bearer {made.json()['api_key']}"}
        calls = {"tenant": ("/v1/tenants", {"name": "acme"}, first, made)}

        def call(name, path, body):
            headers = idem(tenant)
            r = c.post(path, json=body, headers=headers)
            assert r.status_code in (200, 201), r.text
            calls[name] = (path, body, headers, r)
            return r.json()

        hook = call("hook", "/v1/jobs", HOOK)
        managed = call("managed", "/v1/jobs", MANAGED)
        batch = call("batch", "/v1/jobs/batch", {"jobs": [HOOK, MANAGED]})
        key = call("key", "/v1/keys", {"label": "second"})
        rotated = call("rotate", f"/v1/jobs/{hook['job_id']}/rotate-secret", {})
        headers = idem(OPERATOR)
        kafka_path = f"/v1/tenants/{made.json()['tenant_id']}/kafka-credentials"
        calls["kafka"] = (kafka_path, {}, headers, c.post(kafka_path, json={}, headers=headers))
        assert calls["kafka"][3].status_code == 200, calls["kafka"][3].text
        run = c.post(f"/v1/jobs/{managed['job_id']}/trigger", headers=tenant).json()

        secrets = {
            "tenant api key": made.json()["api_key"],
            "second api key": key["api_key"],
            "hook secret": hook["signing_secret"]["secret"],
            "batch hook secret": batch["results"][0]["job"]["signing_secret"]["secret"],
            "rotated secret": rotated["secret"],
            "operator key": OPERATOR_KEY,
            "tenant kafka password": made.json()["kafka"]["password"],
            "rotated kafka password": calls["kafka"][3].json()["kafka"]["password"],
        }
        with psycopg.connect(database_url, autocommit=True) as conn:
            for what, value in secrets.items():
                assert holders(conn, value) == set(), what
            assert {_table(t) for t in holders(conn, TOKEN)} <= MAY_HOLD["env"]
            assert "jobs" in holders(conn, TOKEN)  # the executor reads it there
            # The webhook service still signs with the real secrets.
            targets = webhooks.delivery_targets(conn, [run["run_id"]], now_ms())
            assert run["run_id"] in targets
            assert webhooks.active_secrets(conn, hook["job_id"], now_ms()) == [
                rotated["secret"],
                hook["signing_secret"]["secret"],
            ]

        # Each replay: the same status and answer, the secret null and named.
        hidden = {
            "tenant": ["api_key", "kafka.password"],
            "kafka": ["kafka.password"],
            "hook": ["signing_secret.secret"],
            "managed": [],
            "batch": ["results.0.job.signing_secret.secret"],
            "key": ["api_key"],
            "rotate": ["secret"],
        }
        for name, (path, body, headers, first) in calls.items():
            again = c.post(path, json=body, headers=headers)
            assert again.status_code == first.status_code, name
            assert again.headers["Idempotent-Replayed"] == "true"
            want = first.json()
            if hidden[name]:
                assert again.headers["Secret-Not-Shown-Again"] == ", ".join(hidden[name])
                want["not_shown_again"] = hidden[name]
                for dotted in hidden[name]:
                    *parents, leaf = dotted.split(".")
                    node = want
                    for part in parents:
                        node = node[int(part)] if isinstance(node, list) else node[part]
                    assert isinstance(node[leaf], str)
                    node[leaf] = None
            else:
                assert "Secret-Not-Shown-Again" not in again.headers
            assert again.json() == want, name
        # A replay did nothing: still one tenant, the same jobs.
        listed = c.get("/v1/jobs", headers=tenant).json()["items"]
        assert len(listed) == 4


def test_managed_env__masked_in_every_answer__real_for_the_executor(app, database_url):
    with served(app) as c:
        made = c.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR).json()
        c.headers["Authorization"] = f"Bearer {made['api_key']}"
        masked = {"API_TOKEN": ENV_MASK}

        job = c.post("/v1/jobs", json=MANAGED).json()
        jid = job["job_id"]
        answers = [
            job,
            c.post("/v1/jobs/batch", json={"jobs": [MANAGED]}).json()["results"][0]["job"],
            c.get(f"/v1/jobs/{jid}").json(),
            *c.get("/v1/jobs").json()["items"],
            c.post(f"/v1/jobs/{jid}/pause").json(),
            c.post(f"/v1/jobs/{jid}/resume").json(),
            c.patch(f"/v1/jobs/{jid}", json={"name": "renamed"}).json(),
        ]
        for answer in answers:
            assert answer["target"]["env"] == masked, answer
        for r in (c.get(f"/v1/jobs/{jid}"), c.get("/v1/jobs")):
            assert TOKEN not in r.text

        # A run carries its job's target, and a workflow node its own: masked too.
        run_id = c.post(f"/v1/jobs/{jid}/trigger").json()["run_id"]
        run = c.get(f"/v1/runs/{run_id}")
        assert run.json()["target"]["env"] == masked, run.text
        listed = c.get("/v1/runs", params={"job_id": jid})
        assert TOKEN not in run.text and TOKEN not in listed.text
        node = {"name": "n", "target": MANAGED["target"], "depends_on": []}
        flow = c.post("/v1/workflows", json={"name": "wf", "nodes": [node]})
        assert flow.status_code == 201, flow.text
        shown = c.get(f"/v1/workflows/{flow.json()['workflow_id']}")
        assert shown.json()["nodes"][0]["target"]["env"] == masked, shown.text
        assert TOKEN not in flow.text and TOKEN not in shown.text

        # PATCHing back a target as read keeps the value; a new name is written.
        target = {**job["target"], "env": {"API_TOKEN": ENV_MASK, "MORE": "x"}}
        patched = c.patch(f"/v1/jobs/{jid}", json={"target": target})
        assert patched.status_code == 200, patched.text
        assert patched.json()["target"]["env"] == {"API_TOKEN": ENV_MASK, "MORE": ENV_MASK}
        bad = c.patch(f"/v1/jobs/{jid}", json={"target": {**target, "env": {"NEW": ENV_MASK}}})
        assert bad.status_code == 422
        assert bad.json()["field"] == "target.env.NEW"

        with psycopg.connect(database_url, autocommit=True) as conn:
            (env,) = conn.execute(
                "SELECT target->'env' FROM jobs WHERE job_id = %s", [jid]
            ).fetchone()
        assert env == {"API_TOKEN": TOKEN, "MORE": "x"}


def test_webhook_secrets__sealed_at_rest__legacy_rows_read__reseal_rotates(
    app, database_url, keyring
):
    with served(app) as c:
        made = c.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR).json()
        c.headers["Authorization"] = f"Bearer {made['api_key']}"
        jobs = [c.post("/v1/jobs", json=HOOK).json() for _ in range(5)]
    plain = {j["job_id"]: j["signing_secret"]["secret"] for j in jobs}

    def stored(conn):
        return conn.execute(
            "SELECT owner_id, secret, key_id, sealed IS NOT NULL FROM webhook_secrets"
        ).fetchall()

    def signing(conn) -> dict:
        return {o: webhooks.active_secrets(conn, o, now_ms()) for o in plain}

    with psycopg.connect(database_url, autocommit=True) as conn:
        assert {(o, s, k, held) for o, s, k, held in stored(conn)} == {
            (o, None, "test-a", True) for o in plain
        }
        assert signing(conn) == {o: [s] for o, s in plain.items()}

        # Rows from before 0016 (plaintext) are read as they are...
        legacy = jobs[0]["job_id"]
        conn.execute(
            "UPDATE webhook_secrets SET secret = %s, sealed = NULL, key_id = NULL"
            " WHERE owner_id = %s",
            [plain[legacy], legacy],
        )
        assert signing(conn)[legacy] == [plain[legacy]]

        # ...and a rotation to key b (first) re-seals them all, in batches.
        old = keyring.keys[0]
        b = Key("test-b", parse_keys(f"x:{new_key()}")[0].secret)
        sealed.use_keyring(Keyring((b, old)))
        assert webhooks.reseal(conn, batch=2) == 5
        assert webhooks.reseal(conn, batch=2) == 0
        assert {(s, k) for _o, s, k, _h in stored(conn)} == {(None, "test-b")}
        sealed.use_keyring(Keyring((b,)))  # a is gone now
        assert signing(conn) == {o: [s] for o, s in plain.items()}

        # A sealed value moved to another row does not open: that row signs
        # with nothing (its delivery fails as unsigned, never goes unsigned).
        victim, thief = jobs[1]["job_id"], jobs[2]["job_id"]
        conn.execute(
            "UPDATE webhook_secrets t SET sealed = v.sealed FROM webhook_secrets v"
            " WHERE t.owner_id = %s AND v.owner_id = %s",
            [thief, victim],
        )
        assert signing(conn)[thief] == []
        # Nor does any row under a keyring without its key.
        sealed.use_keyring(Keyring((old,)))
        assert signing(conn)[victim] == []


def test_idempotency_rows__older_than_retention__pruned_in_batches(database_url):
    now = now_ms()
    old = to_dt(now - idempotency.RETENTION_MS - 60_000)
    fresh = to_dt(now - idempotency.RETENTION_MS + 60_000)

    def add(conn, n: int, when) -> None:
        for i in range(n):
            conn.execute(
                "INSERT INTO idempotency_keys (scope, key, fingerprint, status, body, created_at)"
                " VALUES (%s, %s, '\\x00', 201, '{}', %s)",
                [f"t{i % 3}", uuid.uuid4().hex, when],
            )

    def left(conn) -> tuple[int, int]:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE created_at < %s), count(*) FROM idempotency_keys",
            [to_dt(now - idempotency.RETENTION_MS)],
        ).fetchone()
        return row[0], row[1]

    with psycopg.connect(database_url, autocommit=True) as conn:
        add(conn, 7, old)
        add(conn, 4, fresh)
        assert idempotency.prune(conn, now, batch=3) == 7
        assert left(conn) == (0, 4)

        # The gateway's thread does it on its own, on a pooled connection whose
        # sessions are scoped to no tenant (as the gateway's are); its first pass
        # also redacts answers recorded with their secrets (before an upgrade).
        add(conn, 5, old)
        legacy = {
            "tenant": (201, {"tenant_id": "t", "api_key": "cw_legacy"}),
            "batch": (200, {"results": [{"status": 201, "job": {"signing_secret": HELD}}]}),
            "refused": (422, {"code": "INVALID_FIELD", "detail": "api_key", "secret": "x"}),
        }
        for key, (status, doc) in legacy.items():
            conn.execute(
                "INSERT INTO idempotency_keys (scope, key, fingerprint, status, body, created_at)"
                " VALUES ('operator', %s, '\\x00', %s, %s, %s)",
                [key, status, json.dumps(doc), fresh],
            )
        with ConnectionPool(
            database_url,
            min_size=1,
            max_size=1,
            kwargs={"autocommit": True},
            configure=lambda c: c.execute("SET cronwheel.tenant_id = '!none'"),
        ) as pool:
            pruner = idempotency.Pruner(pool, lambda: now, interval_s=0.05, batch=2).start()
            try:
                wait_for(lambda: left(conn) == (0, 7), what="expired keys pruned")
            finally:
                pruner.stop()
        bodies = dict(
            conn.execute(
                "SELECT key, body FROM idempotency_keys WHERE scope = 'operator'"
            ).fetchall()
        )
        assert json.loads(bodies["tenant"]) == {
            "tenant_id": "t",
            "api_key": None,
            "not_shown_again": ["api_key"],
        }
        batch = json.loads(bodies["batch"])
        assert batch["results"][0]["job"]["signing_secret"]["secret"] is None
        assert json.loads(bodies["refused"]) == legacy["refused"][1]  # no secret shown


@pytest.mark.parametrize("weak", ["CHANGE-ME", "x" * 40, "password1234567890" * 2])
def test_gateway__weak_operator_key__refused_in_one_line(weak, tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "services.entrypoints", "serve", "gateway"],
        env={**os.environ, "CRONWHEEL_OPERATOR_KEY": weak, "CRONWHEEL_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 1
    assert p.stderr.startswith("cronwheel: CRONWHEEL_OPERATOR_KEY is too weak (")
    assert p.stderr.count("\n") == 1
    assert weak not in p.stderr
