"""Local cells (`cronwheel up --cells us,eu`): per cell a whole single-cell
stack, its own PostgreSQL cluster and Kafka broker, plus the directory's
database. docs/cells.md.

Each cell is the single-cell stack unchanged, run with the cell's settings: a
child process (`python -m cronwheel.stack.cells up`) whose environment names
the cell's state directory `<home>/cells/<name>/` (CRONWHEEL_HOME: its
cluster, its broker's storage and principals file) and the cell's ports; the
secret keys are the deployment's (Cell.service_env). The cells start side by
side (a broker takes most of its start waiting on the JVM). Cell i (0-based, in the order `--cells` named them) takes
the base ports plus STEP * (i + 1): with the defaults

    cell 0  PostgreSQL 25442  Kafka 29102 (controller 29103)  gateway 8090
    cell 1  PostgreSQL 25452  Kafka 29112 (controller 29113)  gateway 8100

so every port stays below Linux's ephemeral range (config.Stack says why) and
a private home on other base ports (a test's) moves its cells with it. A
service's metrics port (CRONWHEEL_METRICS_PORT, offsets 0-6) moves by the
same step; the router's (offset 7) is the deployment's and stays.

The directory (cronwheel/store/directory.py) lives in a database
`cronwheel_directory` on the default stack's cluster (25432): that cluster is
no cell's, so a cell's outage leaves the directory up and stopping the
directory stops no cell. A deployment gives it a database of its own.

Which cells are configured is remembered in `<home>/cells.json`, written by
`up --cells` and removed by `down` (which stops them): `status`, `migrate`,
`dev` and a later `up` read it. A home without the file is one cell, as
before.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from cronwheel import config
from cronwheel.stack.process import StackError

CELLS_FILE = "cells.json"
STEP = 10  # ports between one cell and the next
NAME = re.compile(r"^[a-z0-9-]{1,50}$")  # as a tenant's `cell` (services/gateway/accounts.py)
DIRECTORY_DATABASE = "cronwheel_directory"
# What points a process at other servers or another home: a cell's own settings replace them.
_FOREIGN = (
    "DATABASE_URL",
    "KAFKA_BOOTSTRAP",
    "CRONWHEEL_ADMIN_DATABASE_URL",
    "CRONWHEEL_HOME",
    "CRONWHEEL_PG_PORT",
    "CRONWHEEL_KAFKA_PORT",
    "CRONWHEEL_KAFKA_CONTROLLER_PORT",
)


@dataclass(frozen=True)
class Cell:
    """One configured cell: its name, position and where its stack lives."""

    name: str
    index: int
    home: Path
    pg_port: int
    kafka_port: int
    kafka_controller_port: int
    http_port: int
    metrics_port: int | None

    @property
    def database_url(self) -> str:
        """The services' URL (the platform's role), as config.local_database_url."""
        return _with_port(config.local_role_url(config.PG_PLATFORM_USER), self.pg_port)

    @property
    def admin_database_url(self) -> str:
        return _with_port(config.local_role_url(config.PG_USER), self.pg_port)

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def stack_env(self) -> dict[str, str]:
        """The variables that make a process see this cell's stack as the local one."""
        return {
            "CRONWHEEL_HOME": str(self.home),
            "CRONWHEEL_PG_PORT": str(self.pg_port),
            "CRONWHEEL_KAFKA_PORT": str(self.kafka_port),
            "CRONWHEEL_KAFKA_CONTROLLER_PORT": str(self.kafka_controller_port),
        }

    def service_env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` (a process's environment) made this cell's services': its stack,
        its name (CRONWHEEL_CELL), its gateway's address, its metrics ports, the
        directory, and the operator key and secret keys of the whole deployment
        (the router forwards the operator's requests to every cell, and its
        mover opens the credentials a cell's gateway sealed)."""
        from cronwheel.demo import operator_key

        env = {k: v for k, v in base.items() if k not in _FOREIGN}
        env.update(self.stack_env())
        env["CRONWHEEL_CELL"] = self.name
        env["CRONWHEEL_HTTP_ADDR"] = f"127.0.0.1:{self.http_port}"
        env["CRONWHEEL_DIRECTORY_URL"] = directory_url()
        env["CRONWHEEL_OPERATOR_KEY"] = operator_key()
        env["CRONWHEEL_SECRET_KEYS"] = config.deployment_secret_keys()
        if self.metrics_port is not None:
            env["CRONWHEEL_METRICS_PORT"] = str(self.metrics_port)
        return env


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    login, _, host = parts.netloc.rpartition("@")
    hostname = host.rpartition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{login}@{hostname}:{port}"))


def parse_names(text: str) -> list[str]:
    """`us,eu` -> ["us", "eu"]; StackError (one line) for a bad or repeated name."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise StackError("--cells: name at least one cell, e.g. --cells us,eu")
    for name in names:
        if not NAME.match(name):
            raise StackError(f"--cells: {name!r} is not a cell name (1-50 of a-z 0-9 -)")
    if len(set(names)) != len(names):
        raise StackError("--cells: a cell is named twice")
    return names


def cells_of(names: list[str]) -> list[Cell]:
    """The cells named, in order, with their ports (module docstring)."""
    stack = config.load(config.Stack)
    http_port = int(config.http_addr().rpartition(":")[2])
    metrics = config.load(config.Metrics).port
    home = config.project_home() / "cells"
    out = []
    for i, name in enumerate(names):
        shift = STEP * (i + 1)
        out.append(
            Cell(
                name=name,
                index=i,
                home=home / name,
                pg_port=stack.pg_port + shift,
                kafka_port=stack.kafka_port + shift,
                kafka_controller_port=stack.kafka_controller_port + shift,
                http_port=http_port + shift,
                metrics_port=None if metrics is None else metrics + shift,
            )
        )
    return out


def configured() -> list[Cell]:
    """The cells `up --cells` recorded in this home; [] for one cell."""
    try:
        doc = json.loads((config.project_home() / CELLS_FILE).read_text())
    except FileNotFoundError:
        return []
    return cells_of(list(doc["cells"]))


def become(name: str) -> None:
    """This process's environment made cell `name`'s services' (a cell of
    `cronwheel up --cells`): its stack, its gateway's address, the directory.
    StackError (one line) when this stack has no such cell."""
    cell = next((c for c in configured() if c.name == name), None)
    if cell is None:
        raise StackError(f"--cell {name}: not a cell of this stack (`cronwheel up --cells ...`)")
    env = cell.service_env(dict(os.environ))
    os.environ.clear()
    os.environ.update(env)


def remember(names: list[str]) -> None:
    path = config.project_home() / CELLS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cells": names}) + "\n")
    tmp.replace(path)


def forget() -> None:
    (config.project_home() / CELLS_FILE).unlink(missing_ok=True)


def directory_url() -> str:
    """The directory's database as the services log in (the platform's role)."""
    return _directory(config.local_database_url())


def directory_admin_url() -> str:
    """The directory's database as its owner (migrations, tools)."""
    return _directory(config.local_role_url(config.PG_USER))


def _directory(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{DIRECTORY_DATABASE}"))


def refuse_external() -> None:
    if config.external_database() or config.external_kafka():
        raise StackError(
            "--cells runs local cells: unset DATABASE_URL and KAFKA_BOOTSTRAP "
            "(a deployment runs each cell's stack on its own servers)"
        )


# -- each cell's stack, in a child process with the cell's settings -------------


def _each(cells: list[Cell], verb: str) -> None:
    """`verb` (up or down) of every cell's stack, side by side; the first
    failure is raised once all have finished."""
    if not cells:
        return
    with ThreadPoolExecutor(len(cells)) as pool:
        errors = [e for e in pool.map(lambda c: _run(c, verb), cells) if e]
    if errors:
        raise StackError(errors[0])


def _run(cell: Cell, verb: str) -> str | None:
    cell.home.mkdir(parents=True, exist_ok=True)
    # PostgreSQL's user (we may be root) reaches <home>/cells/<name>/pg.
    for d in (cell.home.parent, cell.home):
        d.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
    env.update(cell.stack_env())
    proc = subprocess.run(
        [sys.executable, "-m", "cronwheel.stack.cells", verb],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"cell {cell.name}: {last}"
    return None


def up(cells: list[Cell]) -> None:
    """Every cell's PostgreSQL and Kafka, and the directory's database on the
    default cluster (which the caller has started)."""
    _each(cells, "up")
    _ensure_directory_database()


def down(cells: list[Cell]) -> None:
    _each(cells, "down")


def _ensure_directory_database() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(config.local_role_url(config.PG_USER), autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DIRECTORY_DATABASE]
        ).fetchone()
        if not found:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DIRECTORY_DATABASE)))


def status(cells: list[Cell]) -> dict:
    """`cells` and `directory_url` of `cronwheel status --json`."""
    from cronwheel.stack.kafka import LocalKafka
    from cronwheel.stack.postgres import LocalPostgres

    out = {}
    for cell in cells:
        pg, kafka = LocalPostgres(cell.home), LocalKafka(cell.home)
        out[cell.name] = {
            "database_url": cell.database_url,
            "admin_database_url": cell.admin_database_url,
            "kafka_bootstrap": cell.kafka_bootstrap,
            "api_url": cell.api_url,
            "home": str(cell.home),
            "postgres": _state(pg.pid()),
            "kafka": _state(kafka.pid()),
        }
    return {"cells": out, "directory_url": directory_url()}


def _state(pid: int | None) -> str:
    return f"running (pid {pid})" if pid else "stopped"


def migrate(cells: list[Cell], contract: bool) -> list[str]:
    """Every cell's database and the directory's, with the cells registered in
    the directory (name, order, gateway and broker). Lines for people."""
    from cronwheel.store import directory
    from cronwheel.store.migrate import migrate as migrate_cell

    lines = []
    for cell in cells:
        for m in migrate_cell(cell.admin_database_url, contract=contract):
            lines.append(f"cell {cell.name}: applied {m.version:04d}_{m.name}")
    for m in directory.migrate(directory_admin_url()):
        lines.append(f"directory: applied {m.version:04d}_{m.name}")
    directory.register_cells(
        directory_admin_url(),
        [directory.CellInfo(c.name, c.index, c.api_url, c.kafka_bootstrap) for c in cells],
    )
    return lines


def _main(verb: str) -> None:
    """One cell's stack (this process's environment names it): the single-cell
    `up` or `down`, its status as JSON on stdout."""
    from cronwheel import stack

    st = stack.up_single() if verb == "up" else stack.down_single()
    print(json.dumps({"postgres": st["postgres"], "kafka": st["kafka"]}))


if __name__ == "__main__":
    try:
        _main(sys.argv[1])
    except StackError as e:
        print(f"cronwheel: {e}", file=sys.stderr)
        sys.exit(1)
