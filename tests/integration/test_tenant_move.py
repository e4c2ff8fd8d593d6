"""Moving a tenant between cells, the protocol in-process (cronwheel/moves.py,
docs/cells.md "Moving a tenant"): two cells' databases (each a database of
its own on the test server, as the mover sees them: an owner's URL per
cell), a directory database, the real timer service firing in both cells and
the real relay draining the source's outbox.

The two-cell stack with the router and the move API is
tests/e2e/cells/test_move.py."""

from __future__ import annotations

import threading
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from cronwheel.core.clock import now_ms, to_dt, to_ms
from cronwheel.kafka import Topics
from cronwheel.moves import Mover, MoveRefused, MoveSettings
from cronwheel.store import directory as dirstore
from cronwheel.store import moves as cellstore
from cronwheel.store.directory import CellInfo
from cronwheel.store.jobs import Jobs, create_tenant
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.workflows import Workflows
from services.gateway.problems import Problem
from services.gateway.transactions import Gateway
from services.relay.service import Relay
from services.timer.service import TimerService
from tests.support import db as dbsupport
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

TENANT_TABLES = ("tenants", "api_keys", "jobs", "runs_daily", "timers", "timers_parked")


class Cells:
    """Two cells' databases and a directory, on the test server."""

    def __init__(self, server_url: str, template: str):
        self.server_url = server_url
        self.names = {c: dbsupport.clone(server_url, template) for c in ("us", "eu")}
        self.admin = {c: dbsupport.with_dbname(server_url, n) for c, n in self.names.items()}
        self.platform = {c: dbsupport.platform_url(u) for c, u in self.admin.items()}
        self.directory_name = f"cw_dir_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.directory_name}"')
        self.directory_admin = dbsupport.with_dbname(server_url, self.directory_name)
        dirstore.migrate(self.directory_admin)
        dirstore.register_cells(
            self.directory_admin,
            [CellInfo(c, i, f"http://{c}.invalid", f"{c}.invalid:9092") for i, c in
             enumerate(("us", "eu"))],
        )  # fmt: skip
        self.directory = dbsupport.platform_url(self.directory_admin)

    def mover(self, **kw) -> Mover:
        return Mover(self.directory, self.admin, **kw)

    def tenant(self, topics: Topics, cell: str = "us") -> dict:
        with psycopg.connect(self.platform[cell], autocommit=True) as conn:
            tenant = create_tenant(conn, f"acme-{uuid.uuid4().hex[:6]}", cell)
        with psycopg.connect(self.directory, autocommit=True) as d:
            dirstore.place(d, tenant["tenant_id"], cell)
        return tenant

    def job(self, topics: Topics, cell: str, tenant: dict, every_ms: int) -> dict:
        with psycopg.connect(self.platform[cell], autocommit=True) as conn:
            return Jobs(topics).create(
                conn,
                tenant,
                {
                    "name": f"tick-{every_ms}",
                    "schedule": {"every_ms": every_ms},
                    "target": {"type": "queue", "queue": "billing"},
                },
                now_ms(),
            )

    def rows(self, cell: str, tenant_id: str) -> dict[str, int]:
        with psycopg.connect(self.admin[cell], autocommit=True) as conn:
            return {
                t: conn.execute(
                    f"SELECT count(*) FROM {t} WHERE tenant_id = %s", [tenant_id]
                ).fetchone()[0]
                for t in TENANT_TABLES
            }

    def runs(self, cell: str, job_id: str) -> dict[str, tuple[int, int]]:
        """run_id -> (instant ms, created_at ms) of the job's runs in a cell."""
        with psycopg.connect(self.admin[cell], autocommit=True) as conn:
            rows = conn.execute(
                "SELECT run_id, scheduled_at, created_at FROM runs_daily WHERE job_id = %s",
                [job_id],
            ).fetchall()
        return {r[0]: (to_ms(r[1]), to_ms(r[2])) for r in rows}

    def close(self) -> None:
        for name in [*self.names.values(), self.directory_name]:
            dbsupport.drop(self.server_url, name)


@pytest.fixture
def cells(servers, db_template):
    two = Cells(servers.database_url, db_template)
    yield two
    two.close()


def _set_state(url: str, tenant_id: str, state: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE tenants SET state = %s WHERE tenant_id = %s", [state, tenant_id])


def test_standby_tenant__its_timers_are_not_claimed__until_it_is_active(database_url, topic_prefix):
    topics = Topics(topic_prefix)
    with psycopg.connect(database_url, autocommit=True) as conn:
        live, standby = create_tenant(conn, "live"), create_tenant(conn, "standby")
        jobs = {
            t["tenant_id"]: Jobs(topics).create(
                conn,
                t,
                {"name": "tick", "schedule": {"every_ms": 200},
                 "target": {"type": "queue", "queue": "q"}},
                now_ms(),
            )["job_id"]
            for t in (live, standby)
        }  # fmt: skip
        conn.execute(
            "UPDATE tenants SET state = 'standby' WHERE tenant_id = %s", [standby["tenant_id"]]
        )

        def fired(tenant: dict) -> int:
            return conn.execute(
                "SELECT count(*) FROM runs_daily WHERE job_id = %s", [jobs[tenant["tenant_id"]]]
            ).fetchone()[0]

        timer = TimerService(database_url, topics, lease_ttl_ms=5000, ahead_ms=0)
        with running(timer):
            wait_for(lambda: fired(live) >= 5, what="the active tenant's job to fire 5 times")
            assert fired(standby) == 0
            conn.execute(
                "UPDATE tenants SET state = 'active' WHERE tenant_id = %s", [standby["tenant_id"]]
            )
            wait_for(lambda: fired(standby) >= 1, what="the tenant, active again, to fire")


def test_move__refused__unknown_tenant_404__own_or_unknown_cell_422(cells, topic_prefix):
    tenant = cells.tenant(Topics(topic_prefix), "us")
    mover = cells.mover()
    with pytest.raises(MoveRefused) as e:
        mover.start("t_nobody", "eu")
    assert e.value.status == 404
    for cell in ("us", "mars"):
        with pytest.raises(MoveRefused) as e:
            mover.start(tenant["tenant_id"], cell)
        assert (e.value.status, e.value.field) == (422, "cell")
    mover.start(tenant["tenant_id"], "eu")
    with pytest.raises(MoveRefused) as e:
        mover.start(tenant["tenant_id"], "eu")
    assert e.value.status == 409


def test_move__mover_dies_after_the_copy__a_new_mover_finishes_it(cells, topic_prefix):
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    job = cells.job(topics, "us", tenant, 86_400_000)  # no instant during the test
    move = cells.mover().start(tid, "eu")
    first = cells.mover().advance(move.move_id)  # the copy, then this mover is gone
    assert first.state == "freezing"
    assert cells.rows("eu", tid)["jobs"] == 1
    with psycopg.connect(cells.admin["eu"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "standby"
    done = cells.mover().run(move.move_id)
    assert done.state == "done", done.error
    assert done.frozen_ms is not None and done.frozen_ms >= 0
    assert set(cells.rows("us", tid).values()) == {0}
    eu = cells.rows("eu", tid)
    assert (eu["tenants"], eu["jobs"], eu["timers"], eu["timers_parked"]) == (1, 1, 1, 0)
    with psycopg.connect(cells.directory, autocommit=True) as d:
        placed = dirstore.placement(d, tid)
    assert (placed.cell, placed.epoch, placed.state) == ("eu", move.epoch + 1, "active")
    with psycopg.connect(cells.admin["eu"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "active"
        due = conn.execute(
            "SELECT due_at FROM timers WHERE owner_id = %s", [job["job_id"]]
        ).fetchone()[0]
    assert to_ms(due) > now_ms()  # the job's next instant carried over


def test_move__rolled_back_after_the_copy__the_tenant_is_whole_in_the_source(cells, topic_prefix):
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    cells.job(topics, "us", tenant, 86_400_000)
    before = cells.rows("us", tid)
    mover = cells.mover()
    move = mover.start(tid, "eu")
    mover.advance(move.move_id)
    back = mover.rollback(move.move_id, "the operator changed their mind")
    assert back.state == "rolled_back"
    assert cells.rows("us", tid) == before
    assert set(cells.rows("eu", tid).values()) == {0}
    with psycopg.connect(cells.directory, autocommit=True) as d:
        placed = dirstore.placement(d, tid)
    assert (placed.cell, placed.epoch, placed.state) == ("us", move.epoch, "active")


def test_move__while_its_job_fires__every_instant_fires_once_across_both_cells(
    cells, topic_prefix, kafka_bootstrap
):
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    job = cells.job(topics, "us", tenant, 200)
    seen: dict[str, dict[str, tuple[int, int]]] = {"us": {}, "eu": {}}
    stop = threading.Event()

    def watch() -> None:  # what each cell held at any time (the source's go at cleanup)
        while not stop.is_set():
            for cell in ("us", "eu"):
                seen[cell].update(cells.runs(cell, job["job_id"]))
            stop.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    services = [
        TimerService(cells.platform["us"], topics, lease_ttl_ms=5000),
        TimerService(cells.platform["eu"], topics, lease_ttl_ms=5000),
        Relay(cells.platform["us"], kafka_bootstrap),
    ]
    watcher.start()
    with running(services[0]), running(services[1]), running(services[2]):
        wait_for(lambda: len(seen["us"]) >= 5, what="the job to fire in us")
        mover = cells.mover()
        move = mover.run(mover.start(tid, "eu").move_id)
        assert move.state == "done", move.error
        after = len(seen["eu"])
        wait_for(lambda: len(seen["eu"]) >= after + 5, what="the job to fire on in eu")
    stop.set()
    watcher.join(10)
    for cell in ("us", "eu"):
        seen[cell].update(cells.runs(cell, job["job_id"]))

    frozen_ms = to_ms(move.frozen_at)
    late = {r: v for r, v in seen["us"].items() if v[1] > frozen_ms}
    assert not late, f"the source created runs after its freeze: {late}"
    runs = {**seen["us"], **seen["eu"]}
    by_instant: dict[int, set[str]] = {}
    for run_id, (instant, _) in runs.items():
        by_instant.setdefault(instant, set()).add(run_id)
    assert all(len(ids) == 1 for ids in by_instant.values()), "an instant fired twice"
    instants = sorted(by_instant)
    assert [b - a for a, b in zip(instants, instants[1:], strict=False)] == [200] * (
        len(instants) - 1
    ), "an instant is missing"
    assert instants[0] <= to_ms(move.frozen_at) < to_ms(move.unfrozen_at) <= instants[-1]
    assert set(seen["us"]) <= set(seen["eu"])  # the source's runs were copied
    assert set(cells.rows("us", tid).values()) == {0}


def test_freeze__waits_for_a_write_in_flight__a_later_write_is_refused_503(
    admin_database_url, gateway_database_url
):
    """The source's freeze and the tenant's API writes, in their transactions:
    the freeze waits for a write that holds the tenant's write fence, and a
    write after the freeze is refused in its own transaction (not only by the
    directory, which a gateway reads through its cache)."""
    with psycopg.connect(admin_database_url, autocommit=True) as owner:
        tenant = create_tenant(owner, "fenced")
    tid = tenant["tenant_id"]
    frozen: list[bool] = []
    with psycopg.connect(gateway_database_url, autocommit=True) as gw:
        with gw.transaction():
            assert Gateway.authenticate(gw, tenant["api_key"], write=True) is not None
            mover = cellstore.connect(admin_database_url)
            freezer = threading.Thread(target=lambda: frozen.append(cellstore.freeze(mover, tid)))
            freezer.start()
            wait_for(
                lambda: _waiting_for_advisory_lock(admin_database_url),
                what="the freeze to wait for the write in flight",
            )
            assert not frozen
        freezer.join(10)
        mover.close()
        assert frozen == [True]
        with pytest.raises(Problem) as refused, gw.transaction():
            Gateway.authenticate(gw, tenant["api_key"], write=True)
        assert refused.value.status == 503
        assert refused.value.headers == {"Retry-After": "1"}
        with gw.transaction():  # reads go on
            assert Gateway.authenticate(gw, tenant["api_key"])["tenant_id"] == tid


def _waiting_for_advisory_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return (
            conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()[0]
            > 0
        )


def test_catch_up__copies_what_changed_since__the_checksums_find_what_it_cannot(
    cells, topic_prefix
):
    """The freeze's catch-up takes the small tables whole and of the history
    only the rows unfinished or finished since `since`; an older finished run
    changed in the source is what it cannot see, and the checksums show it
    (the mover then copies whole)."""
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    job = cells.job(topics, "us", tenant, 86_400_000)
    src, dst = cellstore.connect(cells.admin["us"]), cellstore.connect(cells.admin["eu"])
    insert = (
        "INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, scheduled_at, spec,"
        " state, created_at, finished_at) SELECT partition_id, %s, tenant_id, job_id, %s, '{}',"
        " %s, %s, %s FROM jobs WHERE job_id = %s"
    )
    old = now_ms() - 3_600_000
    src.execute(insert, ["run_old", to_dt(old), "SUCCEEDED", to_dt(old), to_dt(old), job["job_id"]])
    src.execute(insert, ["run_open", to_dt(old), "PENDING", to_dt(old), None, job["job_id"]])
    cellstore.copy(src, dst, tid, "eu")
    since = to_dt(now_ms())
    src.execute(
        "UPDATE runs_daily SET state = 'SUCCEEDED', finished_at = now() WHERE run_id = 'run_open'"
    )
    src.execute("UPDATE jobs SET name = 'renamed' WHERE job_id = %s", [job["job_id"]])
    src.execute(
        insert, ["run_new", to_dt(now_ms()), "PENDING", to_dt(now_ms()), None, job["job_id"]]
    )
    cellstore.catch_up(src, dst, tid, "eu", since)
    assert cellstore.checksums(src, tid) == cellstore.checksums(dst, tid)

    src.execute("UPDATE runs_daily SET error = 'changed late' WHERE run_id = 'run_old'")
    cellstore.catch_up(src, dst, tid, "eu", since)
    here, there = cellstore.checksums(src, tid), cellstore.checksums(dst, tid)
    assert [t for t in here if here[t] != there[t]] == ["runs_daily"]
    cellstore.copy(src, dst, tid, "eu")
    assert cellstore.checksums(src, tid) == cellstore.checksums(dst, tid)
    src.close()
    dst.close()


def _tenant_with_a_workflow_run(cells, topics: Topics) -> tuple[str, str]:
    """A tenant in us with a one-node workflow triggered (its run going on):
    (tenant id, workflow run id)."""
    tenant = cells.tenant(topics, "us")
    flows = Workflows(topics)
    dag = {"name": "nightly", "nodes": [{"name": "a", "target": {"type": "queue", "queue": "q"}}]}
    with psycopg.connect(cells.platform["us"], autocommit=True) as conn:
        made = flows.create(conn, tenant, dag, now_ms())
        fired = flows.trigger(conn, tenant, made["workflow_id"], now_ms())
    return tenant["tenant_id"], fired["workflow_run_id"]


def test_catch_up__a_tenant_with_workflow_runs__its_workflows_copied_again(cells, topic_prefix):
    """The catch-up deletes the tenant's workflows and copies them again
    while its finished workflow runs stay in the target: their reference to
    the workflow is checked at the commit (migration 0028). Checked at once,
    the delete failed (ForeignKeyViolation) for any tenant with a workflow
    run, and the move stopped there with the tenant frozen."""
    tid, workflow_run_id = _tenant_with_a_workflow_run(cells, Topics(topic_prefix))
    src, dst = cellstore.connect(cells.admin["us"]), cellstore.connect(cells.admin["eu"])
    cellstore.copy(src, dst, tid, "eu")
    src.execute("UPDATE workflows SET name = 'renamed' WHERE tenant_id = %s", [tid])
    cellstore.catch_up(src, dst, tid, "eu", to_dt(now_ms()))
    assert cellstore.checksums(src, tid) == cellstore.checksums(dst, tid)
    names = dst.execute("SELECT name FROM workflows WHERE tenant_id = %s", [tid]).fetchall()
    assert names == [("renamed",)]
    kept = dst.execute(
        "SELECT count(*) FROM workflow_runs WHERE workflow_run_id = %s", [workflow_run_id]
    )
    assert kept.fetchone()[0] == 1
    src.close()
    dst.close()


def test_move__a_step_the_database_keeps_failing__rolled_back__not_left_frozen(cells, topic_prefix):
    """A step that fails in a database (here eu's catch-up, its workflow
    reference made NOT DEFERRABLE again, as before 0028) is tried again after
    2 and 4 s, then the move is rolled back and the tenant is active in the
    source. Before, the error ended the mover's thread with the tenant
    frozen (writes refused) until the router's next start."""
    tid, _ = _tenant_with_a_workflow_run(cells, Topics(topic_prefix))
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:  # no relay here
        conn.execute("DELETE FROM outbox WHERE strpos(topic, %s) > 0", ["." + tid])
    with psycopg.connect(cells.admin["eu"], autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE workflow_runs ALTER CONSTRAINT"
            " workflow_runs_partition_id_workflow_id_fkey NOT DEFERRABLE"
        )
    pauses: list[float] = []
    mover = cells.mover(sleep=pauses.append)
    move = mover.start(tid, "eu")
    back = mover.run(move.move_id)
    assert back.state == "rolled_back", back
    assert "not deferrable" in (back.error or ""), back.error
    assert [p for p in pauses if p >= 1] == [2.0, 4.0]
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "active"
    with psycopg.connect(cells.directory, autocommit=True) as d:
        placed = dirstore.placement(d, tid)
    assert (placed.cell, placed.state) == ("us", "active")


def test_move__the_target_unreachable_in_the_freeze__rolled_back__the_source_active(
    cells, topic_prefix
):
    """The target's database goes away after the copy (a mover that reaches
    it at a closed port): the freeze fails three times, and the rollback
    unfreezes the source and leaves the standby copy in the target (the next
    copy there replaces it) instead of failing on the target first, which
    left the tenant frozen in the source."""
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    cells.job(topics, "us", tenant, 86_400_000)
    move = cells.mover().start(tid, "eu")
    assert cells.mover().advance(move.move_id).state == "freezing"
    parts = urlsplit(cells.admin["eu"])
    login = parts.netloc.rpartition("@")[0]
    closed = {**cells.admin, "eu": urlunsplit(parts._replace(netloc=f"{login}@127.0.0.1:1"))}
    mover = Mover(cells.directory, closed, sleep=lambda s: None)
    back = mover.run(move.move_id)
    assert back.state == "rolled_back", back
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "active"
    with psycopg.connect(cells.admin["eu"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "standby"  # left for the next copy
    with psycopg.connect(cells.directory, autocommit=True) as d:
        placed = dirstore.placement(d, tid)
    assert (placed.cell, placed.state) == ("us", "active")


def test_freeze__waits_for_a_webhook_attempt_under_way__its_end_is_what_eu_gets(
    cells, topic_prefix
):
    """A run the source's webhook service holds at the freeze (RUNNING,
    worker `webhook:...`) is waited for: the service ends it in the source
    (its delivery answered) and the last copy carries the end to eu. Before,
    eu got it RUNNING, and the end written in the source after the copy was
    lost: the lease ran out in eu and the webhook was delivered again."""
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    job = cells.job(topics, "us", tenant, 86_400_000)
    life = Lifecycle(topics)
    with psycopg.connect(cells.platform["us"], autocommit=True) as conn:
        run_id = Jobs(topics).trigger(conn, tenant, job["job_id"], now_ms())["run_id"]
        held = life.start(conn, tid, run_id, "webhook:w1", now_ms())
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:  # no relay here
        conn.execute("DELETE FROM outbox WHERE strpos(topic, %s) > 0", ["." + tid])

    def answered() -> None:  # the delivery comes back a second into the freeze
        def frozen() -> bool:
            with psycopg.connect(cells.admin["us"], autocommit=True) as conn:
                return cellstore.tenant_state(conn, tid) == "frozen"

        wait_for(frozen, 30, 0.02, "the freeze")
        time.sleep(1.0)  # the delivery's time in flight: the fault
        with psycopg.connect(cells.platform["us"], autocommit=True) as conn:
            life.complete(
                conn, tid, run_id, held["attempt"], held["start_token"], "SUCCEEDED", now_ms()
            )

    webhook = threading.Thread(target=answered)
    webhook.start()
    mover = cells.mover()
    done = mover.run(mover.start(tid, "eu").move_id)
    webhook.join(30)
    assert done.state == "done", done.error
    assert done.frozen_ms is not None and done.frozen_ms >= 1000  # it waited for the delivery
    with psycopg.connect(cells.admin["eu"], autocommit=True) as conn:
        state = conn.execute("SELECT state FROM runs_daily WHERE run_id = %s", [run_id]).fetchone()
    assert state == ("SUCCEEDED",)


def _metric(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_move__metrics__each_final_move_counted_once__its_length_and_freeze_observed(
    cells, topic_prefix
):
    topics = Topics(topic_prefix)
    done_before = _metric("cronwheel_moves_total", outcome="done")
    back_before = _metric("cronwheel_moves_total", outcome="rolled_back")
    lengths_before = _metric("cronwheel_move_seconds_count", outcome="done")
    frozen_before = _metric("cronwheel_move_frozen_seconds_count")
    frozen_sum_before = _metric("cronwheel_move_frozen_seconds_sum")

    moving = cells.tenant(topics, "us")
    cells.job(topics, "us", moving, 86_400_000)
    move = cells.mover().start(moving["tenant_id"], "eu")
    cells.mover().advance(move.move_id)  # one mover copies, another finishes
    done = cells.mover().run(move.move_id)
    assert done.state == "done", done.error
    assert cells.mover().run(move.move_id).state == "done"  # run again: nothing to count

    staying = cells.tenant(topics, "us")
    back = cells.mover().start(staying["tenant_id"], "eu")
    cells.mover().advance(back.move_id)
    assert cells.mover().rollback(back.move_id, "changed my mind").state == "rolled_back"

    assert _metric("cronwheel_moves_total", outcome="done") == done_before + 1
    assert _metric("cronwheel_moves_total", outcome="rolled_back") == back_before + 1
    assert _metric("cronwheel_move_seconds_count", outcome="done") == lengths_before + 1
    # The move that switched froze its tenant's writes; the rollback before
    # any freeze adds no window.
    assert _metric("cronwheel_move_frozen_seconds_count") == frozen_before + 1
    frozen_s = _metric("cronwheel_move_frozen_seconds_sum") - frozen_sum_before
    assert frozen_s == pytest.approx(done.frozen_ms / 1000, abs=0.01)


def _kept(cells: Cells, settings: MoveSettings) -> Mover:
    return cells.mover(settings=settings)


def test_move__source_kept_for_the_retention__frozen__then_removed_by_the_sweep(
    cells, topic_prefix
):
    """Step 6 of the move (docs/cells.md, "After the switch"): with a
    retention, the source keeps the tenant's copy frozen (nothing of it fires
    or is claimed there) until a sweep past the retention removes it."""
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    cells.job(topics, "us", tenant, 86_400_000)
    before = cells.rows("us", tid)
    keeping = _kept(cells, MoveSettings(source_retention_s=3600))
    move = keeping.start(tid, "eu")
    done = keeping.run(move.move_id)
    assert done.state == "done", done.error
    assert done.source_removed_at is None
    # Kept in us as it was at the freeze: frozen, its timers parked there.
    kept = cells.rows("us", tid)
    assert (kept["tenants"], kept["jobs"], kept["timers"]) == (1, before["jobs"], 0)
    assert kept["timers_parked"] == before["timers"]
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "frozen"
    assert cells.rows("eu", tid)["jobs"] == before["jobs"]

    # Within the retention, a sweep leaves it; past it (a retention of 0 for
    # this mover, as if the hour had passed), the sweep removes it once.
    assert keeping.remove_kept_sources() == []
    assert cells.rows("us", tid) == kept
    sweeper = _kept(cells, MoveSettings(source_retention_s=0.001))
    (swept,) = sweeper.remove_kept_sources()
    assert swept.move_id == move.move_id and swept.source_removed_at is not None
    assert set(cells.rows("us", tid).values()) == {0}
    assert sweeper.remove_kept_sources() == []
    assert sweeper.get(move.move_id).source_removed_at == swept.source_removed_at
    assert cells.rows("eu", tid)["tenants"] == 1  # the tenant's home untouched


def test_move__back_into_a_cell_that_keeps_the_old_copy__it_goes_first__the_move_succeeds(
    cells, topic_prefix
):
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    cells.job(topics, "us", tenant, 86_400_000)
    keeping = _kept(cells, MoveSettings(source_retention_s=3600))
    there = keeping.run(keeping.start(tid, "eu").move_id)
    assert there.state == "done", there.error
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "frozen"

    back = keeping.run(keeping.start(tid, "us").move_id)
    assert back.state == "done", back.error
    assert keeping.get(there.move_id).source_removed_at is not None  # us's old copy went first
    with psycopg.connect(cells.admin["us"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "active"
    with psycopg.connect(cells.admin["eu"], autocommit=True) as conn:
        assert cellstore.tenant_state(conn, tid) == "frozen"  # kept in eu now
    us = cells.rows("us", tid)
    assert (us["tenants"], us["jobs"], us["timers"], us["timers_parked"]) == (1, 1, 1, 0)

    # A sweep removes eu's copy and never the tenant's home.
    (swept,) = _kept(cells, MoveSettings(source_retention_s=0.001)).remove_kept_sources()
    assert swept.move_id == back.move_id
    assert set(cells.rows("eu", tid).values()) == {0}
    assert cells.rows("us", tid) == us


def test_move__without_retention__source_removed_at_the_switch__and_recorded(cells, topic_prefix):
    topics = Topics(topic_prefix)
    tenant = cells.tenant(topics, "us")
    tid = tenant["tenant_id"]
    cells.job(topics, "us", tenant, 86_400_000)
    mover = cells.mover()
    done = mover.run(mover.start(tid, "eu").move_id)
    assert done.state == "done" and done.source_removed_at is not None
    assert set(cells.rows("us", tid).values()) == {0}
    assert mover.remove_kept_sources() == []
