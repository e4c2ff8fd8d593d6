"""The local stack behind `cronwheel up | down | status`: PostgreSQL and Kafka on
loopback with no Docker. Servers named by DATABASE_URL / KAFKA_BOOTSTRAP are used
as they are and never started or stopped here. With cells (`up --cells us,eu`),
each cell is this same stack on ports of its own (stack/cells.py), and the
default stack's cluster holds the directory."""

from __future__ import annotations

from cronwheel import config
from cronwheel.stack.kafka import LocalKafka
from cronwheel.stack.postgres import LocalPostgres
from cronwheel.stack.process import StackError

__all__ = ["StackError", "up", "down", "status"]


def _parts():
    home = config.project_home()
    home.mkdir(parents=True, exist_ok=True)
    return LocalPostgres(home), LocalKafka(home)


def up(cells: list[str] | None = None) -> dict:
    """The stack; with `cells` (names), those cells too, remembered for the
    commands after. Without, the cells a former `up --cells` remembered."""
    from cronwheel.stack import cells as cellstack

    chosen = cellstack.configured() if cells is None else cellstack.cells_of(cells)
    if not chosen:
        return up_single()
    cellstack.refuse_external()
    pg, _kafka = _parts()
    pg.up()  # the directory's cluster; the cells have brokers of their own
    if cells is not None:
        cellstack.remember(cells)
    cellstack.up(chosen)
    return status()


def up_single() -> dict:
    pg, kafka = _parts()
    if not config.external_database():
        pg.up()
    if not config.external_kafka():
        kafka.up()
    return status()


def down() -> dict:
    """The stack and every configured cell, which are forgotten (their state
    stays under <home>/cells/)."""
    from cronwheel.stack import cells as cellstack

    cellstack.down(cellstack.configured())
    cellstack.forget()
    return down_single()


def down_single() -> dict:
    pg, kafka = _parts()
    if not config.external_kafka():
        kafka.down()
    if not config.external_database():
        pg.down()
    return status()


def status() -> dict:
    """The stack's servers and addresses; with `services` (each one's pid,
    state, restarts and last exit) while `cronwheel dev` runs them."""
    from cronwheel.stack import cells as cellstack
    from cronwheel.supervisor import read_state

    pg, kafka = _parts()
    cells = cellstack.configured()
    supervised = read_state(config.project_home())
    services = {"services": supervised["services"]} if supervised else {}
    bootstrap = config.kafka_bootstrap()
    return {
        **services,
        # The services' login (the platform's role: no superuser, no table of
        # its own) and the owner's, for migrations and operators' tools
        # (CONTRACT.md, "Tenants' Kafka credentials"). With DATABASE_URL set,
        # that is the services' URL, and the owner's is CRONWHEEL_ADMIN_DATABASE_URL
        # or, without it, DATABASE_URL too.
        "database_url": config.load(config.Common).database_url,
        "admin_database_url": config.database_url(),
        "kafka_bootstrap": bootstrap,
        # For tools and tests: the observer principal's client settings (it reads
        # every topic of the deployment, with group ids under its prefix, and
        # writes nothing). CONTRACT.md, "Tenants' Kafka credentials".
        "kafka_client": _kafka_client(bootstrap),
        "postgres": "external" if config.external_database() else _state(pg.pid),
        "kafka": "external" if config.external_kafka() else _state(kafka.pid),
        "home": str(config.project_home()),
        # With cells: each one's servers and addresses, and the directory's
        # database (CONTRACT.md, "Cells").
        **(cellstack.status(cells) if cells else {}),
    }


def _kafka_client(bootstrap: str) -> dict:
    from cronwheel.kafka import security

    try:
        conf = security("observer", bootstrap)
    except (ValueError, KeyError):  # a credentials file of an older stack: no principals yet
        conf = {}
    return {"bootstrap.servers": bootstrap, **conf}


def _state(pid_of) -> str:
    pid = pid_of()
    return f"running (pid {pid})" if pid else "stopped"
