"""The rate limit is per tenant (every key of a tenant shares one bucket); a
failed authentication costs no database transaction (an unknown key is looked
up once, in one statement outside a transaction block, and remembered) and is
limited per client address; the fast path answers exactly as FastAPI does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from cronwheel.kafka import Topics
from services.gateway.app import create_app
from services.gateway.auth import AuthLimits, KeyGuard
from tests.support import gateway

pytestmark = pytest.mark.integration

OPERATOR_KEY = "cwop_auth_limits_operator"
OP = {"Authorization": f"Bearer {OPERATOR_KEY}"}
JOB = {
    "name": "j",
    "schedule": {"cron": "0 0 1 1 *", "timezone": "UTC"},
    "target": {"type": "queue", "queue": "q"},
}
UNKNOWN = {"Authorization": "Bearer cw_" + "A" * 43}
SLOW = 0.001  # tokens per second: none come back while a test runs


@dataclass
class DbUse:
    """What the gateway's pool was asked for: connections checked out, and the
    transaction blocks and statements run on them."""

    checkouts: int = 0
    transactions: int = 0
    statements: list[str] = field(default_factory=list)


class _Counted:
    def __init__(self, conn, use: DbUse):
        self._conn, self._use = conn, use

    def transaction(self, *args, **kwargs):
        self._use.transactions += 1
        return self._conn.transaction(*args, **kwargs)

    def execute(self, query, *args, **kwargs):
        self._use.statements.append(str(query))
        return self._conn.execute(query, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._conn, name)


@dataclass
class Served:
    client: httpx.Client
    url: str
    use: DbUse


@contextmanager
def served(database_url, kafka_bootstrap, topic_prefix, limits=None, **kwargs):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OPERATOR_KEY, **kwargs)
    app.state.key_guard = KeyGuard(limits or AuthLimits())
    pool = app.state.gateway.pool
    use = DbUse()
    checkout = pool.connection

    @contextlib.contextmanager
    def counted(*args, **kw):
        use.checkouts += 1
        with checkout(*args, **kw) as conn:
            yield _Counted(conn, use)

    pool.connection = counted
    with gateway.served(app) as client:
        yield Served(client, str(client.base_url), use)


def from_address(url: str, address: str) -> httpx.Client:
    """A client whose connections come from `address` (any 127.x.y.z is local)."""
    return httpx.Client(
        base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=address)
    )


def tenant(client: httpx.Client, name: str) -> tuple[str, dict]:
    r = client.post("/v1/tenants", json={"name": name}, headers=OP)
    assert r.status_code == 201, r.text
    return r.json()["tenant_id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


@pytest.fixture(params=[True, False], ids=["fastpath", "fastapi"])
def fast(request) -> bool:
    return request.param


def test_rate_limit__shared_by_a_tenants_keys__another_tenant_unaffected(
    database_url, kafka_bootstrap, topic_prefix, fast
):
    with served(
        database_url, kafka_bootstrap, topic_prefix, rate_per_s=SLOW, burst=4, jobs_fastpath=fast
    ) as s:
        c = s.client
        _a, a1 = tenant(c, "a")
        _b, b = tenant(c, "b")
        issued = c.post("/v1/keys", json={"label": "second"}, headers=a1)  # a's 1st token
        assert issued.status_code == 201
        a2 = {"Authorization": f"Bearer {issued.json()['api_key']}"}
        assert c.post("/v1/jobs", json=JOB, headers=a1).status_code == 201  # 2nd
        assert c.post("/v1/jobs", json=JOB, headers=a2).status_code == 201  # 3rd
        assert c.get("/v1/jobs", headers=a1).status_code == 200  # 4th: the burst is spent
        for h in (a2, a1):  # a new key would not start a new bucket either
            r = c.post("/v1/jobs", json=JOB, headers=h)
            assert r.status_code == 429 and r.json()["code"] == "RATE_LIMITED", r.text
            assert "this tenant" in r.json()["detail"] and int(r.headers["retry-after"]) >= 1
        assert c.get("/v1/jobs", headers=b).status_code == 200  # the other tenant's bucket
        _c, third = tenant(c, "c")  # the operator key has its own bucket too
        assert c.post("/v1/jobs", json=JOB, headers=third).status_code == 201


def test_unknown_key__no_transaction__looked_up_once_then_remembered(
    database_url, kafka_bootstrap, topic_prefix, fast
):
    with served(database_url, kafka_bootstrap, topic_prefix, jobs_fastpath=fast) as s:
        for path, method in (("/v1/jobs", "POST"), ("/v1/jobs", "GET"), ("/v1/tenants", "GET")):
            r = s.client.request(method, path, json=JOB if method == "POST" else None,
                                 headers=UNKNOWN)  # fmt: skip
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED", r.text
            assert r.headers["www-authenticate"] == "Bearer"
        # One lookup, one statement, no transaction block; then nothing at all.
        assert s.use.checkouts == 1 and s.use.transactions == 0, s.use
        assert len(s.use.statements) == 1 and "cronwheel_authenticate" in s.use.statements[0]
        # A known key: the lookup once, then the request's own transaction only.
        _t, h = tenant(s.client, "acme")
        before = DbUse(s.use.checkouts, s.use.transactions, list(s.use.statements))
        for _ in range(3):
            assert s.client.get("/v1/jobs", headers=h).status_code == 200
        assert s.use.checkouts - before.checkouts == 1 + 3
        assert s.use.transactions - before.transactions == 3


def test_failed_auth__limited_per_address__with_retry_after(
    database_url, kafka_bootstrap, topic_prefix, fast
):
    limits = AuthLimits(failures_per_minute=3)
    with served(database_url, kafka_bootstrap, topic_prefix, limits, jobs_fastpath=fast) as s:
        _t, good = tenant(s.client, "acme")
        assert s.client.get("/v1/jobs", headers=good).status_code == 200  # known from here on
        with from_address(s.url, "127.0.0.2") as bad, from_address(s.url, "127.0.0.3") as other:
            keys = [{"Authorization": f"Bearer cw_guess{i}"} for i in range(3)]
            codes = [bad.post("/v1/jobs", json=JOB, headers=h).status_code for h in keys]
            assert codes == [401, 401, 401]
            looked_up = s.use.checkouts
            for h in (keys[0], {"Authorization": "Bearer cw_guess_new"}):
                r = bad.post("/v1/jobs", json=JOB, headers=h)
                assert r.status_code == 429 and r.json()["code"] == "RATE_LIMITED", r.text
                assert "failed authentications" in r.json()["detail"]
                assert int(r.headers["retry-after"]) >= 1
            assert s.use.checkouts == looked_up  # refused before any lookup
            # A key known to be good still works from that address; another
            # address has its own budget.
            assert bad.get("/v1/jobs", headers=good).status_code == 200
            assert other.get("/v1/jobs", headers=keys[1]).status_code == 401
            # No key at all is not a failed authentication of a key.
            assert other.get("/v1/jobs").status_code == 401


@pytest.mark.parametrize("cache_s", [0.0, 30.0])
def test_revoked_key__401_at_once(database_url, kafka_bootstrap, topic_prefix, cache_s):
    """Known to this process or not, a revoked key is refused on its next request
    (the request's transaction checks every key again)."""
    with served(database_url, kafka_bootstrap, topic_prefix, AuthLimits(cache_s=cache_s)) as s:
        _t, h = tenant(s.client, "acme")
        r = s.client.post("/v1/keys", json={"label": "old"}, headers=h)
        old = {"Authorization": f"Bearer {r.json()['api_key']}"}
        assert s.client.get("/v1/jobs", headers=old).status_code == 200
        assert s.client.delete(f"/v1/keys/{r.json()['key_id']}", headers=h).status_code == 204
        r = s.client.get("/v1/jobs", headers=old)
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"
        assert s.client.get("/v1/jobs", headers=h).status_code == 200


@contextmanager
def pair(database_url, kafka_bootstrap, topic_prefix, limits) -> Iterator[list[Served]]:
    with (
        served(database_url, kafka_bootstrap, topic_prefix, limits, jobs_fastpath=True) as f,
        served(database_url, kafka_bootstrap, topic_prefix, limits, jobs_fastpath=False) as s,
    ):
        yield [f, s]


def test_failed_auth__fastpath_and_fastapi_answer_alike(
    database_url, kafka_bootstrap, topic_prefix
):
    with pair(database_url, kafka_bootstrap, topic_prefix, AuthLimits(failures_per_minute=2)) as p:
        answers = []
        for g in p:
            got = []
            for path in ("/v1/jobs", "/v1/jobs/batch", "/v1/runs/r/start", "/v1/jobs"):
                r = g.client.post(path, json={}, headers=UNKNOWN)
                got.append((r.status_code, r.json(), r.headers.get("www-authenticate")))
            answers.append(got)
        assert answers[0] == answers[1]
        assert [a[0] for a in answers[0]] == [401, 401, 429, 429]
