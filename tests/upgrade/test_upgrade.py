"""make test-upgrade (CONTRACT.md, Releases and evolution): the previous release
(RELEASES' last line) against this one. Both parts run on a database of their
own that this release's `cronwheel migrate` made, expand steps only, which is
the schema a running platform has between an upgrade's expand and its contract:

(a) the previous release's own end-to-end tests, as it released them (its
    services, SDK worker and fixtures from its tree), on that schema: its
    gateway, timer, relay and dispatcher fire, dispatch and complete runs with
    a worker of its own;
(b) a rolling upgrade of the firing path: the previous release's timer, relay
    and dispatcher alone, then this release's three beside them sharing the
    partitions through their leases, then the old ones gone; every job has
    one run per instant without a gap, and every run reaches its queue topic.

Not covered (docs/migrations.md, The upgrade test): the previous release's
gateway, workflow, webhook and executor beside this release's; workers of
both releases on one queue; this release's services on a database the
previous release migrated before the expand steps applied
(the upgrade order in docs/migrations.md migrates first); contract steps."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store import migrate as migrations
from tests.e2e.test_timer_faults import (
    assert_one_run_per_instant,
    create_interval_jobs,
    owned_count,
    wait_caught_up,
)
from tests.e2e.test_timer_faults import lease_epochs as leases
from tests.support import db as dbsupport
from tests.support.kafka import read_all
from tests.support.procs import Launcher, ServiceProc, launcher
from tests.support.wait import wait_for
from tests.upgrade import previous

pytestmark = pytest.mark.e2e

# The previous release's tests that (a) runs: firing, dispatch to a queue topic,
# the worker protocol (start, retry, heartbeat, lease fencing) and its SDK
# worker's outcomes, each on its own gateway, timer, relay and dispatcher.
PREVIOUS_TESTS = (
    "tests/e2e/test_contract_worker.py::test_contract_worker__start_retry_heartbeat_lease_fencing",
    "tests/e2e/test_sdk_worker.py::test_sdk__outcomes__success_retry_and_fatal",
)

# What the previous release's test databases may hold beside the schema (the
# SDK worker's effects table), as tests/support/db.py grants its templates.
TEST_ONLY_GRANT = "GRANT CREATE ON SCHEMA public TO cronwheel_platform"


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[previous.Release, Path]:
    try:
        rel = previous.previous()
        tree = tmp_path_factory.mktemp(f"release-{rel.tag}")
        previous.export(rel, tree)
    except previous.Unavailable as e:
        pytest.fail(str(e), pytrace=False)
    return rel, tree


@contextlib.contextmanager
def expand_only_database(admin_url: str) -> Iterator[str]:
    """A new database migrated by this release's `cronwheel migrate` (the
    command, as an operator runs it: expand steps only), dropped afterwards.
    Yields its owner's URL."""
    name = f"cw_upgrade_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = dbsupport.with_dbname(admin_url, name)
    try:
        # DATABASE_URL set: this database alone (no local cells), as its owner.
        env = {k: v for k, v in os.environ.items() if k != "CRONWHEEL_ADMIN_DATABASE_URL"}
        env["DATABASE_URL"] = url
        out = subprocess.run(
            [previous.PYTHON, "-m", "services.entrypoints", "migrate"],
            cwd=previous.ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, f"cronwheel migrate:\n{out.stdout}{out.stderr}"
        waiting = {m.version for m in migrations.pending(url)}
        assert waiting == {m.version for m in migrations.discover() if m.contract}, out.stdout
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(TEST_ONLY_GRANT)
        yield url
    finally:
        dbsupport.drop(admin_url, name)


def test_previous_release__its_e2e_tests__pass_on_this_release_expand_schema(
    release, servers, tmp_path
):
    rel, tree = release
    used = tmp_path / "template-used"
    with expand_only_database(servers.database_url) as url:
        name = url.rsplit("/", 1)[1]
        env = previous.env(
            tree,
            DATABASE_URL=servers.database_url,  # its tests' servers: the owner's URL
            KAFKA_BOOTSTRAP=servers.kafka_bootstrap,
            CRONWHEEL_UPGRADE_TEMPLATE=name,
            CRONWHEEL_UPGRADE_TEMPLATE_USED=str(used),
        )
        env.pop("CRONWHEEL_ADMIN_DATABASE_URL", None)
        out = subprocess.run(
            [previous.PYTHON, "-m", "pytest", "-q", "-p", "old_release_plugin",
             "-p", "no:cacheprovider", *PREVIOUS_TESTS],
            cwd=tree, env=env, capture_output=True, text=True, timeout=280,
        )  # fmt: skip
    report = out.stdout[-8000:] + out.stderr[-2000:]
    assert out.returncode == 0, f"{rel.tag}'s tests on this release's schema:\n{report}"
    assert f"{len(PREVIOUS_TESTS)} passed" in out.stdout, report  # none skipped
    assert used.read_text().split() == [name], "its tests did not clone this release's schema"


def start_previous(launch: Launcher, tree: Path, name: str, **env: str) -> ServiceProc:
    """`cronwheel serve NAME` of the previous release, with the launcher's
    settings; stopped with the launcher's own processes."""
    path = launch.log_dir / f"{name}-previous-{len(launch.started)}.log"
    with path.open("wb") as out:
        proc = subprocess.Popen(
            [previous.PYTHON, "-m", "services.entrypoints", "serve", name],
            env=previous.env(tree, {**launch.env, **env}), cwd=tree,
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    svc = ServiceProc(name, proc, path)
    launch.started.append(svc)
    return svc


def runs_since(conn, partitions: list[int], since) -> int:
    return conn.execute(
        "SELECT count(*) FROM runs_daily WHERE partition_id = ANY(%s) AND created_at > %s",
        [partitions, since],
    ).fetchone()[0]


def test_rolling_upgrade__previous_firing_path_beside_this_release__one_run_per_instant(
    release, servers, kafka_bootstrap, topic_prefix
):
    _rel, tree = release
    seed = random.randrange(1 << 32)
    topics = Topics(topic_prefix)
    with expand_only_database(servers.database_url) as admin_url:
        url = dbsupport.platform_url(admin_url)
        with (
            psycopg.connect(url, autocommit=True) as conn,
            launcher(url, kafka_bootstrap, topic_prefix, lease_ttl_ms=1000) as launch,
        ):
            create_interval_jobs(conn, topics, 100, (300, 600), random.Random(seed))
            (tenant,) = conn.execute("SELECT DISTINCT tenant_id FROM jobs").fetchone()

            # Before the upgrade: the previous release's firing path, its timer
            # holding every partition.
            old = start_previous(launch, tree, "timer", PGAPPNAME="timer-previous")
            old_relay = start_previous(launch, tree, "relay")
            old_dispatcher = start_previous(launch, tree, "dispatcher")
            wait_for(lambda: owned_count(conn, "timer", old.owner()) == 1024, 20, 0.05, "old")
            wait_for(
                lambda: conn.execute("SELECT count(*) FROM runs_daily").fetchone()[0], 15, 0.05
            )

            # This release's timer, relay and dispatcher join.
            new = launch.start("timer", PGAPPNAME="timer-current")
            new_relay = launch.start("relay")
            launch.start("dispatcher")

            def shared():
                o, n = leases(conn, old.owner()), leases(conn, new.owner())
                return (o, n) if o and n and len(o) + len(n) == 1024 else None

            old_parts, new_parts = wait_for(shared, 20, 0.05, "the two timers to share")
            wait_for(
                lambda: owned_count(conn, "relay", old_relay.owner())
                and owned_count(conn, "relay", new_relay.owner()),
                20, 0.05, "the two relays to share",
            )  # fmt: skip
            # The dispatchers lease tenants' topics under their group's name: both
            # hold partitions (this one tenant's topics are read by one at a time).
            wait_for(
                lambda: conn.execute(
                    "SELECT count(DISTINCT owner) FROM partition_leases"
                    " WHERE service NOT IN ('timer', 'relay')"
                ).fetchone()[0] == 2,
                20, 0.05, "the two dispatchers to share",
            )  # fmt: skip
            (since,) = conn.execute("SELECT now()").fetchone()
            # Both fire their own partitions' instants while they share.
            wait_for(
                lambda: runs_since(conn, list(old_parts), since) >= 20
                and runs_since(conn, list(new_parts), since) >= 20,
                30, 0.1, "both timers to fire",
            )  # fmt: skip
            assert leases(conn, old.owner()) == old_parts, "the shared leases moved meanwhile"

            # The upgrade ends: the previous release's processes leave, this
            # release's take every partition.
            for svc in (old, old_relay, old_dispatcher):
                assert svc.stop() == 0, svc.log()[-2000:]
            wait_for(lambda: owned_count(conn, "timer", new.owner()) == 1024, 20, 0.05, "takeover")
            wait_caught_up(conn, now_ms())
            assert new.stop() == 0
            runs = assert_one_run_per_instant(conn)
            wait_for(
                lambda: conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0,
                30, 0.1, "the relay to drain the outbox",
            )  # fmt: skip

            # Nothing lost on the way to the worker: every run is on its queue topic.
            fired = {r for (r,) in conn.execute("SELECT run_id FROM runs_daily").fetchall()}
            queue = topics.queue(tenant, "q")

            def delivered():
                return fired <= {m.key().decode() for m in read_all(kafka_bootstrap, [queue])}

            wait_for(delivered, 60, 0.5, f"every run on {queue}")
    print(
        f"seed {seed}: {runs} runs, each instant exactly once, all on the queue topic;"
        f" shared {len(old_parts)}/{len(new_parts)} partitions (previous/current)"
    )
