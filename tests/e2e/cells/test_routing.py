"""Two cells on this machine, as `cronwheel up --cells us,eu` makes them: each
its own PostgreSQL cluster and Kafka broker, the directory's database on the
default cluster, each cell's services (`cronwheel serve --cell NAME ...`) and
the router on the public address (docs/cells.md).

Everything runs in a private CRONWHEEL_HOME on private ports (base 27432 /
28092 / 28093, router 28080; the cells at +10 and +20), never the shared dev
stack: the package's stack (conftest.py).
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from cronwheel import kafka
from cronwheel.stack.process import port_open
from tests.support.cells import OPERATOR_KEY, ROUTER, tenant_rows
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def _as(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


OPERATOR = _as(OPERATOR_KEY)


def _tenant(name: str, cell: str | None = None) -> dict:
    body = {"name": f"{name}-{uuid.uuid4().hex[:6]}", **({"cell": cell} if cell else {})}
    answer = httpx.post(f"{ROUTER}/v1/tenants", json=body, headers=OPERATOR, timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()


def _queue_job(key: str) -> dict:
    body = {
        "name": "billing",
        "schedule": {"cron": "0 0 1 1 *"},
        "target": {"type": "queue", "queue": "billing"},
    }
    answer = httpx.post(f"{ROUTER}/v1/jobs", json=body, headers=_as(key), timeout=30)
    assert answer.status_code == 201, answer.text
    return answer.json()


def _rows(url: str, tenant_id: str) -> dict[str, int]:
    return tenant_rows(url, tenant_id, ("tenants", "api_keys", "jobs", "timers"))


def _topics_of(admin, tenant_id: str) -> set[str]:
    return {t for t in admin.list_topics(timeout=10).topics if tenant_id in t}


def _logs_in(bootstrap: str, creds: dict) -> bool:
    """Whether the tenant's Kafka principal authenticates at `bootstrap`."""
    who = kafka.Credentials(creds["username"], creds["password"])
    try:
        kafka.admin(bootstrap, principal=who).list_topics(timeout=5)
    except Exception:
        return False
    return True


# -- the stack -------------------------------------------------------------------


def test_status__every_cell_its_servers_and_addresses__and_the_directory(cells):
    st = cells.status
    assert set(st["cells"]) == {"us", "eu"}
    us, eu = cells.cell("us"), cells.cell("eu")
    assert us["database_url"].endswith(":27442/cronwheel")
    assert eu["database_url"].endswith(":27452/cronwheel")
    assert (us["kafka_bootstrap"], eu["kafka_bootstrap"]) == ("127.0.0.1:28102", "127.0.0.1:28112")
    assert (us["api_url"], eu["api_url"]) == ("http://127.0.0.1:28090", "http://127.0.0.1:28100")
    assert all(c["postgres"].startswith("running") for c in (us, eu))
    assert all(c["kafka"].startswith("running") for c in (us, eu))
    assert st["directory_url"].endswith(":27432/cronwheel_directory")


# -- placement and residency -------------------------------------------------------


def test_residency__each_tenant_s_rows_principal_and_topics_only_in_its_cell(cells):
    eu_tenant = _tenant("acme-eu", "eu")
    us_tenant = _tenant("acme-us")  # no cell: the default cell, the first named
    assert (eu_tenant["cell"], us_tenant["cell"]) == ("eu", "us")
    for tenant, home, away in ((eu_tenant, "eu", "us"), (us_tenant, "us", "eu")):
        tid = tenant["tenant_id"]
        job = _queue_job(tenant["api_key"])
        assert job["kafka_bootstrap"] == cells.cell(home)["kafka_bootstrap"]
        assert tenant["kafka"]["bootstrap"] == cells.cell(home)["kafka_bootstrap"]
        assert _rows(cells.cell(home)["database_url"], tid) == {
            "tenants": 1, "api_keys": 1, "jobs": 1, "timers": 1,
        }  # fmt: skip
        assert _rows(cells.cell(away)["database_url"], tid) == {
            "tenants": 0, "api_keys": 0, "jobs": 0, "timers": 0,
        }  # fmt: skip
        # The queue topic, made by the home cell's dispatcher on its broker alone.
        queue = job["topic"]
        admin = cells.kafka_admin(home)
        wait_for(
            lambda a=admin, t=tid, q=queue: q in _topics_of(a, t),
            60, 0.2, f"{queue} on {home}'s broker",
        )  # fmt: skip
        assert _topics_of(cells.kafka_admin(away), tid) == set()
        assert _logs_in(cells.cell(home)["kafka_bootstrap"], tenant["kafka"])
        assert not _logs_in(cells.cell(away)["kafka_bootstrap"], tenant["kafka"])


def test_tenant_views__operator_sees_cell_and_state__tenant_its_cell_and_broker(cells):
    eu_tenant = _tenant("views", "eu")
    tid = eu_tenant["tenant_id"]
    got = httpx.get(f"{ROUTER}/v1/tenants/{tid}", headers=OPERATOR, timeout=10)
    assert got.status_code == 200, got.text
    assert {k: got.json()[k] for k in ("tenant_id", "cell", "state")} == {
        "tenant_id": tid, "cell": "eu", "state": "active",
    }  # fmt: skip
    own = httpx.get(f"{ROUTER}/v1/tenant", headers=_as(eu_tenant["api_key"]), timeout=10)
    assert own.json() == {
        "tenant_id": tid, "cell": "eu", "kafka_bootstrap": cells.cell("eu")["kafka_bootstrap"],
    }  # fmt: skip


def test_create_tenant__unknown_cell__422_naming_cell__router_and_gateway(cells):
    for base in (ROUTER, cells.cell("us")["api_url"]):
        answer = httpx.post(
            f"{base}/v1/tenants", json={"name": "nowhere", "cell": "mars"}, headers=OPERATOR
        )
        assert answer.status_code == 422, answer.text
        assert answer.json()["field"] == "cell"


# -- the router and the 421 ----------------------------------------------------------


def test_router__eu_key_works_through_the_public_address__every_tenant_listed(cells):
    eu_tenant, us_tenant = _tenant("routed", "eu"), _tenant("routed-us", "us")
    job = _queue_job(eu_tenant["api_key"])
    got = httpx.get(f"{ROUTER}/v1/jobs/{job['job_id']}", headers=_as(eu_tenant["api_key"]))
    assert got.status_code == 200 and got.json()["tenant_id"] == eu_tenant["tenant_id"]
    listed, cursor = set(), None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{ROUTER}/v1/tenants", params=params, headers=OPERATOR).json()
        listed |= {t["tenant_id"] for t in page["items"]}
        if not (cursor := page["next_cursor"]):
            break
    assert {eu_tenant["tenant_id"], us_tenant["tenant_id"]} <= listed


def test_gateway__another_cell_s_tenant__421_with_its_home_cell(cells):
    eu_tenant = _tenant("stale-route", "eu")
    us_gateway = cells.cell("us")["api_url"]
    for method, path, headers in (
        ("GET", "/v1/jobs", _as(eu_tenant["api_key"])),
        ("GET", f"/v1/tenants/{eu_tenant['tenant_id']}", OPERATOR),
    ):
        answer = httpx.request(method, f"{us_gateway}{path}", headers=headers)
        assert answer.status_code == 421, answer.text
        assert answer.json()["code"] == "MISDIRECTED"
        assert answer.json()["cell"] == "eu"
        assert answer.json()["api_url"] == cells.cell("eu")["api_url"]
    # Creating a tenant for eu at us's gateway: misdirected too, nothing made in us.
    answer = httpx.post(
        f"{us_gateway}/v1/tenants", json={"name": "wrong-door", "cell": "eu"}, headers=OPERATOR
    )
    assert answer.status_code == 421 and answer.json()["cell"] == "eu"


def test_router__system_of_each_cell__by_its_name__an_unknown_one_422(cells):
    """The operator's GET /v1/system?cell=NAME through the router is that
    cell's health (the console's cell switch); its /readyz names the cells."""
    assert set(httpx.get(f"{ROUTER}/readyz").json()["cells"]) == {"us", "eu"}
    for cell in ("us", "eu"):
        got = httpx.get(f"{ROUTER}/v1/system", params={"cell": cell}, headers=OPERATOR, timeout=30)
        assert got.status_code == 200, got.text
        assert got.json()["cell"] == cell
        assert not got.json()["services"].get("error"), got.json()["services"]
    plain = httpx.get(f"{ROUTER}/v1/system", headers=OPERATOR, timeout=30)
    assert plain.status_code == 200 and plain.json()["cell"] in ("us", "eu")
    unknown = httpx.get(f"{ROUTER}/v1/system", params={"cell": "mars"}, headers=OPERATOR)
    assert unknown.status_code == 422, unknown.text
    assert unknown.json()["field"] == "cell"


def test_router__directory_stopped__routes_on_from_its_cache(cells):
    """Last in the module: it stops the directory's cluster (and starts it again)."""
    eu_tenant = _tenant("cached", "eu")
    key = _as(eu_tenant["api_key"])
    assert httpx.get(f"{ROUTER}/v1/tenant", headers=key).status_code == 200  # cached now
    never_seen = _tenant("never-routed", "eu")
    cells.directory_pg("stop")
    try:
        assert not port_open(27432)
        # Past the cache's TTL (300 ms) every answer is a failed refresh served stale.
        for _ in range(5):
            got = httpx.get(f"{ROUTER}/v1/tenant", headers=key, timeout=10)
            assert got.status_code == 200, got.text
            assert got.json()["cell"] == "eu"
        # A tenant the router never routed cannot be: 503 with Retry-After.
        refused = httpx.get(f"{ROUTER}/v1/tenant", headers=_as(never_seen["api_key"]), timeout=10)
        assert refused.status_code == 503 and refused.headers["Retry-After"]
    finally:
        cells.directory_pg("start")
    wait_for(
        lambda: httpx.get(f"{ROUTER}/v1/tenant", headers=_as(never_seen["api_key"])).status_code
        == 200,
        30, 0.2, "the router to read the directory again",
    )  # fmt: skip
