"""Shared fixtures: real servers, a fresh database and unique topics per test."""

from __future__ import annotations

import uuid

import pytest

from tests.support import db as dbsupport
from tests.support import kafka as kafkasupport
from tests.support.servers import Servers, provide

# The files (or a package, a shared fixture's unit) that take minutes, longest
# first, per make test's --durations in a clean clone: started before the rest
# so that none of them is the last thing a worker does while the others idle.
# xdist alone would start them last (it orders files by their count of tests,
# and each of these has few). A file missing here is only started later.
LONGEST_FIRST = (
    "tests/faults/test_faults.py",
    "tests/faults/test_faults_second.py",
    "tests/e2e/cells/",
    "tests/integration/test_gateway_schemathesis.py",
    "tests/integration/test_dispatcher_leases.py",
    "tests/e2e/test_tenant_churn.py",
    "tests/upgrade/test_upgrade.py",
    "tests/e2e/test_timer_faults.py",
    "tests/integration/test_dozing.py",
    "tests/e2e/test_sdk_worker.py",
    "tests/e2e/test_stack.py",
    "tests/e2e/test_tenant_burst.py",
    "tests/e2e/test_sdk_slim_install.py",
)
# Packages whose tests share one package-scoped stack: one unit, one worker.
_ONE_UNIT = ("tests/e2e/cells/",)


def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile` (make test): a file per worker as before, a
    package of _ONE_UNIT as one unit, and the LONGEST_FIRST units first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((p for p in _ONE_UNIT if path.startswith(p)), path)

        def _assign_work_unit(self, node) -> None:
            first = next((u for u in LONGEST_FIRST if u in self.workqueue), None)
            if first is not None:
                self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


# The topic prefixes this session's tests were given (see topic_prefix).
_prefixes: list[str] = []


@pytest.fixture(scope="session")
def servers() -> Servers:
    with provide() as s:
        yield s
        kafkasupport.delete_topics(s.kafka_bootstrap, _prefixes)
        kafkasupport.revoke(s.kafka_bootstrap, _prefixes)


@pytest.fixture(scope="session")
def db_template(servers: Servers) -> str:
    return dbsupport.template(servers.database_url)


@pytest.fixture
def admin_database_url(servers: Servers, db_template: str) -> str:
    """A migrated database of this test's own, dropped afterwards, as its owner
    (what migrations and operators use; no service logs in so)."""
    name = dbsupport.clone(servers.database_url, db_template)
    yield dbsupport.with_dbname(servers.database_url, name)
    dbsupport.drop(servers.database_url, name)


@pytest.fixture(scope="session")
def expand_only_db_template(servers: Servers) -> str:
    return dbsupport.template(servers.database_url, contract=False)


@pytest.fixture
def expand_only_admin_database_url(servers: Servers, expand_only_db_template: str) -> str:
    """Like admin_database_url, but migrated without the contract steps: the
    schema of a platform mid-upgrade (`cronwheel migrate` run, `--contract`
    not yet), where the legacy `runs` and `run_attempts` and their mirror
    still stand. For the tests of what only that schema has."""
    name = dbsupport.clone(servers.database_url, expand_only_db_template)
    yield dbsupport.with_dbname(servers.database_url, name)
    dbsupport.drop(servers.database_url, name)


@pytest.fixture
def expand_only_database_url(expand_only_admin_database_url: str) -> str:
    """expand_only_admin_database_url as the platform's services log in to it."""
    return dbsupport.platform_url(expand_only_admin_database_url)


@pytest.fixture
def database_url(admin_database_url: str) -> str:
    """The test's database as the platform's services log in to it (the role
    cronwheel_platform): what tests hand the services they construct or start,
    and use to read and write the tables themselves."""
    return dbsupport.platform_url(admin_database_url)


@pytest.fixture
def gateway_database_url(admin_database_url: str) -> str:
    """The same database as the gateway logs in to it (cronwheel_gateway). A
    gateway given `database_url` acts as that role too (transactions.py)."""
    return dbsupport.gateway_url(admin_database_url)


@pytest.fixture
def kafka_bootstrap(servers: Servers) -> str:
    return servers.kafka_bootstrap


def _new_topic_prefix(servers: Servers) -> str:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    _prefixes.append(prefix)
    kafkasupport.grant(servers.kafka_bootstrap, prefix)
    return prefix


@pytest.fixture
def topic_prefix(servers: Servers) -> str:
    """Topics of this test start with this, so tests never read each other's records.
    The platform's principals get their ACLs for it (as `cronwheel up` grants them
    for `cw`). Topics and ACLs are deleted when the session ends (a broker that
    kept every test's topics ran out of file descriptors after a day of runs)."""
    return _new_topic_prefix(servers)


@pytest.fixture(scope="session")
def new_topic_prefix(servers: Servers):
    """topic_prefix for fixtures wider than a test: call it for a prefix whose
    topics are deleted when the session ends."""
    return lambda: _new_topic_prefix(servers)


@pytest.fixture
def keyring():
    """A keyring of the test's own (one key, "test-a"), which the store seals
    and opens secrets at rest with until the test ends."""
    from cronwheel.core.sealing import Keyring, new_key, parse_keys
    from cronwheel.store import sealed

    ring = Keyring(parse_keys(f"test-a:{new_key()}"))
    sealed.use_keyring(ring)
    yield ring
    sealed.use_keyring(None)
