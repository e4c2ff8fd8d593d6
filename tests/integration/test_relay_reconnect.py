"""The relay outlives PostgreSQL going away: its sessions terminated (as a
restart does) or the database refusing connections for a while. It connects
again under the services' reconnect policy and publishes what is written
after, once each."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel.core.events import OutboxRow
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from services.relay.service import Relay
from tests.support.kafka import drain, run_topic_and_record
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def conn(database_url):
    with psycopg.connect(database_url, autocommit=True) as c:
        yield c


def write(conn, topic: str, value: bytes, key: str) -> None:
    with conn.transaction():
        outbox.append(conn, [OutboxRow(0, topic, key.encode(), value)])


def others(conn) -> set[int]:
    """The backends of this test's database other than the test's own: the relay's."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchall()
    return {pid for (pid,) in rows}


def terminate(conn, pids: set[int]) -> int:
    return conn.execute(
        "SELECT count(*) FROM unnest(%s::int[]) AS p WHERE pg_terminate_backend(p)", [list(pids)]
    ).fetchone()[0]


def refusals(caplog) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "cronwheel.relay" and r.getMessage().startswith("database unavailable")
    )


def outbox_empty(conn) -> bool:
    return conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0


def test_relay__its_sessions_terminated__reconnects_and_publishes_rows_written_after(
    database_url, kafka_bootstrap, topic_prefix, conn
):
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    relay = Relay(database_url, kafka_bootstrap, lease_ttl_ms=5_000)
    with running(relay):
        write(conn, topic, value, "before")
        wait_for(lambda: relay.published_total == 1, timeout=30, what="the first row published")
        first = wait_for(lambda: others(conn), what="the relay's sessions")
        assert terminate(conn, first) == len(first)
        # Connected again: sessions of its own, none of those terminated.
        wait_for(lambda: others(conn) and not others(conn) & first, what="new sessions")
        write(conn, topic, value, "after")
        wait_for(lambda: relay.published_total == 2, timeout=30, what="the row written after")
        wait_for(lambda: outbox_empty(conn), what="the outbox drained")
    keys = [key for _t, key, *_ in drain(kafka_bootstrap, topic, want=3, timeout=5)]
    assert sorted(keys) == [b"after", b"before"]


def test_relay__database_refuses_connections_for_a_while__publishes_once_it_is_back(
    database_url, kafka_bootstrap, topic_prefix, conn, caplog, servers
):
    """As a PostgreSQL restart looks from the relay: sessions ended, then
    connection attempts refused until the server is back."""
    topic, value = run_topic_and_record(conn, Topics(topic_prefix), kafka_bootstrap)
    name = conn.info.dbname
    caplog.set_level("WARNING", logger="cronwheel.relay")
    relay = Relay(database_url, kafka_bootstrap, lease_ttl_ms=5_000)
    with running(relay):
        write(conn, topic, value, "before")
        wait_for(lambda: relay.published_total == 1, timeout=30, what="the first row published")
        # From the server's own database: a database cannot close itself.
        admin = psycopg.connect(servers.database_url, autocommit=True)
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            terminate(conn, wait_for(lambda: others(conn), what="the relay's sessions"))
            write(conn, topic, value, "while-away")
            # Refused, waited out and tried again, more than once.
            wait_for(lambda: refusals(caplog) >= 3, what="connection attempts refused")
            assert not others(conn)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.close()
        write(conn, topic, value, "after")
        wait_for(lambda: relay.published_total == 3, timeout=30, what="the rows written since")
        wait_for(lambda: outbox_empty(conn), what="the outbox drained")
    keys = [key for _t, key, *_ in drain(kafka_bootstrap, topic, want=4, timeout=5)]
    assert sorted(keys) == [b"after", b"before", b"while-away"]
