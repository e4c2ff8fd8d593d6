"""Growing a tenant's queue topic online (operator): at least N partitions,
never fewer; a retry changes nothing."""

from __future__ import annotations

import pytest

from cronwheel import kafka
from cronwheel.kafka import Topics
from services.gateway.app import create_app
from tests.integration.test_gateway_api import OPERATOR, assert_problem
from tests.support.gateway import served
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, "cwop_test_operator_key")
    with served(app) as c:
        yield c


def _partitions(bootstrap: str, topic: str) -> int:
    meta = kafka.admin(bootstrap, principal="observer").list_topics(topic, timeout=10).topics[topic]
    return len(meta.partitions) if meta.error is None else 0


def _partitions_become(bootstrap: str, topic: str, n: int) -> int:
    """The topic's partition count once the broker's metadata shows `n`: the
    controller has made them when the call returns, and the broker's
    metadata cache learns them a moment later (CI read 2 for 5 once)."""
    return wait_for(
        lambda: (got := _partitions(bootstrap, topic)) == n and got,
        timeout=30,
        interval=0.1,
        what=f"{topic} at {n} partitions",
    )


def test_grow_queue__missing_topic_created__then_grown__fewer_changes_nothing(
    client, kafka_bootstrap
):
    r = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
    tenant = r.json()["tenant_id"]
    path = f"/v1/tenants/{tenant}/queues/reports/partitions"

    first = client.post(path, json={"partitions": 2}, headers=OPERATOR)
    assert first.status_code == 200, first.text
    topic = first.json()["topic"]
    assert first.json() == {"topic": topic, "partitions": 2}
    assert topic.endswith(f".q.{tenant}.reports")
    assert _partitions_become(kafka_bootstrap, topic, 2) == 2

    grown = client.post(path, json={"partitions": 5}, headers=OPERATOR)
    assert grown.json() == {"topic": topic, "partitions": 5}
    assert _partitions_become(kafka_bootstrap, topic, 5) == 5

    fewer = client.post(path, json={"partitions": 3}, headers=OPERATOR)
    assert fewer.status_code == 200 and fewer.json()["partitions"] == 5
    assert _partitions(kafka_bootstrap, topic) == 5


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "partitions"), ({"partitions": 0}, "partitions"), ({"partitions": 65}, "partitions"),
     ({"partitions": "2"}, "partitions"), ({"partitions": True}, "partitions"),
     ({"partitions": 2, "x": 1}, "x")],
)  # fmt: skip
def test_grow_queue__bad_body__422_naming_the_field(client, body, field):
    tenant = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR).json()
    path = f"/v1/tenants/{tenant['tenant_id']}/queues/reports/partitions"
    assert_problem(client.post(path, json=body, headers=OPERATOR), 422, "INVALID_FIELD", field)


def test_grow_queue__unknown_tenant_404__bad_queue_422__tenant_key_403(client):
    tenant = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR).json()
    body = {"partitions": 2}
    r = client.post("/v1/tenants/ten_nobody/queues/q/partitions", json=body, headers=OPERATOR)
    assert r.status_code == 404, r.text
    bad = f"/v1/tenants/{tenant['tenant_id']}/queues/a.b/partitions"
    assert_problem(client.post(bad, json=body, headers=OPERATOR), 422, "INVALID_FIELD", "queue")
    own = {"Authorization": f"Bearer {tenant['api_key']}"}
    path = f"/v1/tenants/{tenant['tenant_id']}/queues/q/partitions"
    assert client.post(path, json=body, headers=own).status_code == 403
