"""Settings read from the environment, with the local stack's addresses as defaults.

Every service and test asks here, so `DATABASE_URL` / `KAFKA_BOOTSTRAP` switch the
whole system to external servers in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

# Below Linux's ephemeral range (32768-60999): a client that keeps reconnecting
# to a stopped server on a port inside it can be handed that very port as its
# own, connect to itself, and hold the port (then TIME_WAIT for 60 s), so the
# next `cronwheel up` fails with "Address already in use".
PG_PORT = int(os.environ.get("CRONWHEEL_PG_PORT", "25432"))
KAFKA_PORT = int(os.environ.get("CRONWHEEL_KAFKA_PORT", "29092"))
KAFKA_CONTROLLER_PORT = int(os.environ.get("CRONWHEEL_KAFKA_CONTROLLER_PORT", "29093"))
PG_USER = "cronwheel"
PG_PASSWORD = "cronwheel"
PG_DATABASE = "cronwheel"
LOCAL_DATABASE_URL = f"postgresql://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{PG_PORT}/{PG_DATABASE}"
LOCAL_KAFKA_BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"


def project_home() -> Path:
    """Where the local stack keeps its state: `CRONWHEEL_HOME`, else `.cronwheel/`
    beside the checkout this package runs from, else in the working directory."""
    if env := os.environ.get("CRONWHEEL_HOME"):
        return Path(env).resolve()
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".cronwheel"
    return Path.cwd() / ".cronwheel"


def database_url() -> str:
    return os.environ.get("DATABASE_URL") or LOCAL_DATABASE_URL


def kafka_bootstrap() -> str:
    return os.environ.get("KAFKA_BOOTSTRAP") or LOCAL_KAFKA_BOOTSTRAP


def external_database() -> bool:
    return bool(os.environ.get("DATABASE_URL"))


def external_kafka() -> bool:
    return bool(os.environ.get("KAFKA_BOOTSTRAP"))


def cell() -> str:
    return os.environ.get("CRONWHEEL_CELL", "local")


def http_addr() -> str:
    return os.environ.get("CRONWHEEL_HTTP_ADDR", "127.0.0.1:8080")


def fire_ahead_ms() -> int:
    """How long before a job's instant the timer service may create its run
    (docs/architecture.md, "Firing ahead"); the relay publishes it at the
    instant. 0: create each run at its instant."""
    return max(0, int(os.environ.get("CRONWHEEL_FIRE_AHEAD_MS", "1000")))
