"""Where the tests' PostgreSQL and Kafka come from, in this order: the servers
named by DATABASE_URL / KAFKA_BOOTSTRAP; testcontainers when a Docker engine
answers; otherwise the local stack of `cronwheel up` (what CI uses here)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Servers:
    database_url: str
    kafka_bootstrap: str
    source: str


def _docker_answers() -> bool:
    if not os.path.exists("/var/run/docker.sock") and not os.environ.get("DOCKER_HOST"):
        return False
    try:
        import docker

        client = docker.from_env(timeout=2)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def provide():
    if os.environ.get("DATABASE_URL") and os.environ.get("KAFKA_BOOTSTRAP"):
        yield Servers(os.environ["DATABASE_URL"], os.environ["KAFKA_BOOTSTRAP"], "environment")
        return
    if os.environ.get("CRONWHEEL_TESTCONTAINERS", "1") != "0" and _docker_answers():
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16") as pg, KafkaContainer().with_kraft() as kafka:
            url = pg.get_connection_url().replace("postgresql+psycopg2://", "postgresql://")
            yield Servers(url, kafka.get_bootstrap_server(), "testcontainers")
        return
    from cronwheel import stack

    st = stack.up()
    yield Servers(st["admin_database_url"], st["kafka_bootstrap"], "local stack")
