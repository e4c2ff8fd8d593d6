"""Priority classes and fairness in the store, against the real database: the
operator's entitlement and quota routes, the firing loop's claim by class and
round-robin across tenants, fire quotas, and the relay's fair outbox read.
The whole path through Kafka is in test_priority_pipeline.py."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core.clock import iso, now_ms, to_dt
from cronwheel.core.jobs import parse_job
from cronwheel.core.runs import PRIORITIES, PRIORITY_RANK
from cronwheel.kafka import Topics
from cronwheel.store import outbox, pgarrays, timers
from cronwheel.store.firing import Firing
from cronwheel.store.jobs import _spec_columns, create_tenant
from cronwheel.store.leases import Leases
from cronwheel.store.quotas import fair_shares
from services.gateway.app import create_app
from services.gateway.routes import quotas as quota_routes
from tests.support.gateway import served

pytestmark = pytest.mark.integration

OP_KEY = "cwop_test_operator_key"
OPERATOR = {"Authorization": f"Bearer {OP_KEY}"}

# Jobs and their timers in one statement, with the values Jobs.create writes
# (bench/common.py does the same for the benchmarks); timers carry the tenant.
BULK = """
WITH src AS (
    SELECT g, 'job_' || substr(md5(%(seed)s || g::text), 1, 20) AS job_id
      FROM generate_series(1, %(n)s) AS g
), ins AS (
    INSERT INTO jobs (partition_id, job_id, tenant_id, name, schedule, target, payload,
                      priority, retry, timeout_ms, lease_ms, overlap, catchup, jitter_ms,
                      anchor_at, last_instant, created_at, updated_at)
    SELECT ((get_byte(d, 6) << 8) | get_byte(d, 7)) & 1023, job_id, %(tenant)s,
           %(name)s || '-' || g, %(schedule)s, %(target)s, %(payload)s, %(priority)s,
           %(retry)s, %(timeout_ms)s, %(lease_ms)s, %(overlap)s, %(catchup)s, %(jitter_ms)s,
           %(created)s, %(created)s, %(created)s, %(created)s
      FROM src, LATERAL (SELECT sha256(convert_to(job_id, 'UTF8')) AS d) h
    RETURNING partition_id, job_id
)
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
SELECT partition_id, 'job:' || job_id, 'job', job_id, %(due)s, %(prio)s, NULL, %(tenant)s
  FROM ins
"""


def bulk_jobs(
    conn, tenant_id: str, n: int, due_ms: int, priority: str = "normal", queue: str = "q"
) -> None:
    """`n` one-off queue jobs of one tenant, all due at `due_ms`."""
    created = min(now_ms(), due_ms - 1)
    body = {
        "name": f"bulk-{priority}",
        "schedule": {"at": iso(due_ms)},
        "target": {"type": "queue", "queue": queue},
        "priority": priority,
    }
    spec = parse_job(body, now_ms=created, allowed_priorities=PRIORITIES)
    with conn.transaction():
        conn.execute(
            BULK,
            {
                **_spec_columns(spec),
                "seed": uuid.uuid4().hex,
                "n": n,
                "tenant": tenant_id,
                "created": to_dt(created),
                "due": to_dt(due_ms),
                "prio": PRIORITY_RANK[priority],
            },
        )
        conn.execute("SELECT pg_notify('cw_timers', %s::text)", [due_ms])  # as Jobs.create does


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def all_leases(conn, service: str = "timer") -> Leases:
    leases = Leases(service, ttl_ms=60_000)
    leases.tick(conn, now_ms())
    assert len(leases.owned) == 1024
    return leases


# -- entitlement and quotas over HTTP ---------------------------------------


@pytest.fixture
def client(database_url, kafka_bootstrap, topic_prefix):
    app = create_app(database_url, Topics(topic_prefix), kafka_bootstrap, OP_KEY)
    paths = {getattr(r, "path", None) for r in app.routes}
    if "/v1/tenants/{tenant_id}/quotas" not in paths:  # until app.py includes it
        app.include_router(quota_routes.router)
    with served(app) as c:
        yield c


def job_body(priority: str) -> dict:
    return {
        "name": f"j-{priority}",
        "schedule": {"every_ms": 60_000},
        "target": {"type": "queue", "queue": "q"},
        "priority": priority,
    }


def test_entitlement__critical_without_grant_403__granted_201__revoked_in_use_409(client):
    r = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR)
    tenant = r.json()
    key = {"Authorization": f"Bearer {tenant['api_key']}"}
    assert tenant["priority_classes"] == ["high", "normal", "low"]

    denied = client.post("/v1/jobs", json=job_body("critical"), headers=key)
    assert denied.status_code == 403, denied.text
    assert denied.json()["code"] == "PRIORITY_NOT_ALLOWED"
    assert denied.json()["field"] == "priority"

    path = f"/v1/tenants/{tenant['tenant_id']}/priority-classes"
    assert client.put(path, json={"priority_classes": ["critical"]}, headers=key).status_code == 403
    granted = client.put(
        path, json={"priority_classes": ["normal", "critical", "high", "low"]}, headers=OPERATOR
    )
    assert granted.status_code == 200, granted.text
    assert granted.json()["priority_classes"] == ["critical", "high", "normal", "low"]

    made = client.post("/v1/jobs", json=job_body("critical"), headers=key)
    assert made.status_code == 201, made.text
    assert made.json()["priority"] == "critical"

    # Taking critical away while a live job uses it would strand the job.
    revoke = client.put(path, json={"priority_classes": ["high", "normal"]}, headers=OPERATOR)
    assert revoke.status_code == 409 and revoke.json()["code"] == "PRIORITY_IN_USE", revoke.text
    assert client.delete(f"/v1/jobs/{made.json()['job_id']}", headers=key).status_code in (200, 204)
    assert client.put(path, json={"priority_classes": ["high", "normal"]}, headers=OPERATOR).json()[
        "priority_classes"
    ] == ["high", "normal"]
    bad = client.put(path, json={"priority_classes": ["urgent"]}, headers=OPERATOR)
    assert bad.status_code == 422 or bad.status_code == 400, bad.text
    missing = client.put(
        "/v1/tenants/ten_nope/priority-classes",
        json={"priority_classes": ["low"]},
        headers=OPERATOR,
    )
    assert missing.status_code == 404


def test_quotas__operator_sets_reads_and_removes__tenant_forbidden(client):
    tenant = client.post("/v1/tenants", json={"name": "acme"}, headers=OPERATOR).json()
    key = {"Authorization": f"Bearer {tenant['api_key']}"}
    path = f"/v1/tenants/{tenant['tenant_id']}/quotas"
    assert client.get(path, headers=OPERATOR).json() == {"fire": None, "dispatch": None}
    r = client.put(path, json={"fire": {"rate_per_s": 5, "burst": 10}}, headers=OPERATOR)
    assert r.status_code == 200, r.text
    assert r.json()["fire"]["rate_per_s"] == 5 and r.json()["fire"]["tokens"] == 10
    assert r.json()["dispatch"] is None
    assert client.put(path, json={"fire": None}, headers=key).status_code == 403
    for rate in (0, 5e-324):  # the second one underflowed in PostgreSQL (schemathesis)
        bad = client.put(path, json={"fire": {"rate_per_s": rate}}, headers=OPERATOR)
        assert bad.status_code == 422 and bad.json()["field"] == "fire.rate_per_s", bad.text
    assert client.put(path, json={"fire": None}, headers=OPERATOR).json()["fire"] is None


# -- the firing loop ------------------------------------------------------------


def test_fair_shares__classes_first__equal_shares__remainder_rotates():
    lanes = [(0, "a"), (2, "a"), (2, "b"), (2, "c")]
    assert fair_shares(lanes, 10) == {(0, "a"): 10}
    normal = lanes[1:]
    assert fair_shares(normal, 10, turn=0) == {(2, "a"): 4, (2, "b"): 3, (2, "c"): 3}
    assert fair_shares(normal, 10, turn=1) == {(2, "b"): 4, (2, "c"): 3, (2, "a"): 3}
    assert fair_shares(normal, 2, turn=2) == {(2, "c"): 1, (2, "a"): 1}
    assert fair_shares(normal, 0) == {}


def test_claim__flood_and_small_tenant_same_instant__small_in_first_batch(conn, topic_prefix):
    flood = create_tenant(conn, "flood")
    small = create_tenant(conn, "small")
    due = now_ms() - 1000
    bulk_jobs(conn, flood["tenant_id"], 3000, due)
    bulk_jobs(conn, small["tenant_id"], 10, due)
    firing = Firing(Topics(topic_prefix))
    report = firing.fire_due(conn, all_leases(conn), now_ms(), limit=500)
    assert report.timers == 500 and report.lanes == 2
    per_tenant = dict(
        conn.execute("SELECT tenant_id, count(*) FROM runs_daily GROUP BY tenant_id").fetchall()
    )
    assert per_tenant == {flood["tenant_id"]: 490, small["tenant_id"]: 10}
    # The batch was full: the report asks the wheel to wake again at once.
    assert report.next_due_ms and min(report.next_due_ms) <= now_ms()


def test_due_lanes__off_the_due_timers_or_by_lane__same_lanes_either_way(conn):
    """A crowded instant's lanes are read off its due timers (their cost is
    the due timers', not the idle tenants'); a backlog's by one probe per lane.
    Both give exactly the lanes with something due: not the idle tenants', not
    a job timer beyond the lead, not a retry due only by the lead, not a timer
    of a partition the caller does not own."""
    now = now_ms()
    busy = [create_tenant(conn, f"busy-{i}")["tenant_id"] for i in range(3)]
    idle = [create_tenant(conn, f"idle-{i}")["tenant_id"] for i in range(20)]
    for tenant in busy:
        bulk_jobs(conn, tenant, 40, now - 100)
    bulk_jobs(conn, busy[0], 5, now + 500, "critical")  # due by the lead: a job timer
    for tenant in idle:
        bulk_jobs(conn, tenant, 1, now + 60_000)
    retry = create_tenant(conn, "retry")["tenant_id"]
    conn.execute(
        "INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority,"
        " attempt, tenant_id) VALUES (3, 'retry:r1', 'retry', 'r1', %s, 2, 1, %s)",
        [to_dt(now + 500), retry],  # within the lead, but a retry waits for its time
    )
    elsewhere = create_tenant(conn, "elsewhere")["tenant_id"]
    bulk_jobs(conn, elsewhere, 1, now - 100)
    mine = {
        p
        for (p,) in conn.execute(
            "SELECT DISTINCT partition_id FROM timers WHERE tenant_id <> %s", [elsewhere]
        )
    }
    part = min(set(range(1024)) - mine)  # a partition of its own, not owned below
    conn.execute("UPDATE timers SET partition_id = %s WHERE tenant_id = %s", [part, elsewhere])
    owned = [p for p in range(1024) if p != part]
    due_by = {"now": to_dt(now), "ahead": to_dt(now + 1000)}
    arr = pgarrays.int2_array(owned)
    want = sorted([(0, busy[0])] + [(PRIORITY_RANK["normal"], t) for t in busy])
    by_due = timers.due_lanes(conn, due_by, arr)  # 125 due: off the due timers
    by_lane = timers.due_lanes(conn, due_by, arr, few=10)  # more than 10: a probe a lane
    assert by_due == want and by_lane == want


def test_claim__critical_behind_normal_backlog__critical_first(conn, topic_prefix):
    tenant = create_tenant(conn, "acme", priority_classes=list(PRIORITIES))
    due = now_ms() - 1000
    bulk_jobs(conn, tenant["tenant_id"], 2000, due - 500, "normal")  # older, still normal
    bulk_jobs(conn, tenant["tenant_id"], 30, due, "critical")
    bulk_jobs(conn, tenant["tenant_id"], 30, due, "low")
    firing = Firing(Topics(topic_prefix))
    firing.fire_due(conn, all_leases(conn), now_ms(), limit=100)
    got = dict(conn.execute("SELECT priority, count(*) FROM runs_daily GROUP BY 1").fetchall())
    assert got == {"critical": 30, "normal": 70}
    # Outbox rows say their class, so the relay can read by it.
    ranks = dict(conn.execute("SELECT priority, count(*) FROM outbox GROUP BY 1").fetchall())
    assert ranks == {0: 30, 2: 70}


def test_fire_quota__bucket_limits_runs__rest_stay_due_and_fire_on_refill(conn, topic_prefix):
    limited = create_tenant(conn, "limited")
    free = create_tenant(conn, "free")
    # One instant for the bucket's last refill and the firing: the grant must
    # not depend on how long the setup took.
    t0 = now_ms()
    conn.execute(
        "INSERT INTO tenant_quotas (tenant_id, kind, rate_per_s, burst, tokens, refilled_at)"
        " VALUES (%s, 'fire', 10, 20, 5, %s)",
        [limited["tenant_id"], to_dt(t0)],
    )
    due = t0 - 1000
    bulk_jobs(conn, limited["tenant_id"], 40, due)
    bulk_jobs(conn, free["tenant_id"], 40, due)
    firing = Firing(Topics(topic_prefix))
    leases = all_leases(conn)
    report = firing.fire_due(conn, leases, t0, limit=500)
    counts = dict(conn.execute("SELECT tenant_id, count(*) FROM runs_daily GROUP BY 1").fetchall())
    assert counts == {limited["tenant_id"]: 5, free["tenant_id"]: 40}
    assert report.held == 35
    # The wheel is told when the bucket has a token again (10/s: ~100 ms).
    assert t0 < min(report.next_due_ms) <= t0 + 200
    held = conn.execute(
        "SELECT held_total FROM tenant_quotas WHERE tenant_id = %s", [limited["tenant_id"]]
    ).fetchone()[0]
    assert held == 35
    # One second later the bucket has refilled 10 tokens: 10 more fire, no more.
    firing.fire_due(conn, leases, t0 + 1000, limit=500)
    n = conn.execute(
        "SELECT count(*) FROM runs_daily WHERE tenant_id = %s", [limited["tenant_id"]]
    ).fetchone()[0]
    assert n == 15
    # Held timers are not in the wheel's upcoming times (no busy loop): only the refill is.
    upcoming = firing.upcoming(conn, list(leases.owned), t0 + 1500).due_ms
    assert upcoming and all(u > t0 + 1000 for u in upcoming)


def test_upsert_timer__fills_tenant_from_owner(conn, topic_prefix):
    from cronwheel.store.jobs import Jobs

    tenant = create_tenant(conn, "acme")
    Jobs(Topics(topic_prefix)).create(conn, tenant, job_body("normal"), now_ms())
    assert conn.execute("SELECT tenant_id FROM timers").fetchall() == [(tenant["tenant_id"],)]


# -- the relay's read ---------------------------------------------------------------


def _rows(topic: str, n: int, rank: int, partition: int = 1) -> list[outbox.RankedRow]:
    return [
        outbox.RankedRow(partition, topic, f"{topic}-{rank}-{i}".encode(), b"v", priority=rank)
        for i in range(n)
    ]


def test_read_fair__critical_first__small_lane_not_behind_flood__nothing_skipped(conn):
    with conn.transaction():
        outbox.append(conn, _rows("t.runs.flood", 3000, 2))
    with conn.transaction():
        outbox.append(conn, _rows("t.runs.small", 10, 2) + _rows("t.runs.flood", 5, 0))
    parts = list(range(1024))
    first = outbox.read_fair(conn, parts, 100)
    topics_ranks = [(r[1], r[5]) for r in first.rows]
    assert topics_ranks[:5] == [("t.runs.flood", 0)] * 5  # critical first
    assert topics_ranks.count(("t.runs.small", 2)) == 10  # the small lane whole
    assert len(first.rows) == 100 and first.more
    # Within a lane, oldest first.
    flood_ids = [r[0] for r in first.rows if r[1] == "t.runs.flood" and r[5] == 2]
    assert flood_ids == sorted(flood_ids)
    # No cursor: a pass reads what is there, so deleting and reading again
    # drains everything, each row once.
    seen = {r[0] for r in first.rows}
    outbox.delete_delivered(conn, list(seen))
    while True:
        batch = outbox.read_fair(conn, parts, 1000)
        if not batch.rows:
            break
        ids = {r[0] for r in batch.rows}
        assert not ids & seen
        seen |= ids
        outbox.delete_delivered(conn, list(ids))
    assert len(seen) == 3015


def test_read_small__fits_a_batch__all_by_class_then_age__else_none(conn):
    with conn.transaction():
        outbox.append(conn, _rows("t.runs.a", 3, 2) + _rows("t.runs.b", 2, 3))
    with conn.transaction():
        outbox.append(conn, _rows("t.runs.b", 2, 0) + _rows("t.runs.a", 1, 2, partition=7))
    parts = list(range(1024))
    small = outbox.read_small(conn, parts, 8)
    assert small is not None and not small.more
    assert [r[5] for r in small.rows] == [0, 0, 2, 2, 2, 2, 3, 3]
    assert [r[0] for r in small.rows if r[5] == 2] == sorted(r[0] for r in small.rows if r[5] == 2)
    assert small.lanes == 3
    # Only the caller's partitions.
    assert len(outbox.read_small(conn, [1], 8).rows) == 7
    # More than a batch: a backlog, which read_fair orders.
    assert outbox.read_small(conn, parts, 7) is None


def test_outbox_rows__say_their_class__run_ready_the_runs__others_normal(conn):
    from cronwheel.core import events
    from cronwheel.core.avro import default_registry
    from cronwheel.store.new_runs import ready_row

    ready = ready_row("x", 1, "r1", "t1", 1, 1, 2, "high", "queue", "q", "null")
    assert ready.priority == PRIORITY_RANK["high"] and ready.not_before_ms is None
    assert default_registry().decode(ready.value)[1]["priority"] == "high"
    done = events.run_completed(
        run_id="r1", tenant_id="t1", partition_id=1, attempt=1, state="SUCCEEDED", finished_ms=3
    )
    assert events.OutboxRow(1, "x", b"r1", done).priority == outbox.NORMAL
    # As written: one row (one statement) or many, each with its class.
    with conn.transaction():
        outbox.append(conn, [ready])
        outbox.append(conn, [events.OutboxRow(1, "x", b"r2", done), ready])
    got = conn.execute("SELECT key, priority FROM outbox ORDER BY id").fetchall()
    assert got == [(b"r1", 1), (b"r2", 2), (b"r1", 1)]


def test_class_partitions__quarters_of_the_topic__small_topics_one_normal_lane():
    assert [list(kafka.class_partitions(r, 8)) for r in range(4)] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]
    assert list(kafka.class_partitions(3, 10)) == [6, 7, 8, 9]
    for n in (4, 8, 10, 16):
        for rank in range(4):
            p = kafka.partition_for(rank, b"some-run", n)
            assert kafka.class_of_partition(p, n) == rank
    # A topic too small to be laid out is one lane, read as the normal class:
    # every class goes to partition 0, whatever the producer's partitioner says.
    for rank in range(4):
        assert kafka.partition_for(rank, b"k", 1) == 0
    assert kafka.class_of_partition(0, 1) == PRIORITY_RANK["normal"]
    assert kafka.class_of_partition(1, 1) is None
