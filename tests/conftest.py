"""Shared fixtures: real servers, a fresh database and unique topics per test."""

from __future__ import annotations

import uuid

import pytest

from tests.support import db as dbsupport
from tests.support import kafka as kafkasupport
from tests.support.servers import Servers, provide

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
    from cronwheel.store import webhooks

    ring = Keyring(parse_keys(f"test-a:{new_key()}"))
    webhooks.use_keyring(ring)
    yield ring
    webhooks.use_keyring(None)
