"""The directory of cells, in its own database (docs/cells.md): which cell each
tenant is homed in (tenant -> cell, epoch, state) and which cells there are.
Its migrations are its own (`directory_migrations/`, recorded in that
database's schema_migrations); its SQL is sql/directory.sql. Routers and
gateways read it through cronwheel/directory.py's cache, never directly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import class_row

from cronwheel.store import migrate as migrations
from cronwheel.store.sql_loader import queries

MIGRATIONS_DIR = Path(__file__).with_name("directory_migrations")
STATES = ("active", "moving", "frozen")


@functools.cache
def _q() -> dict[str, str]:
    return queries("directory")


@dataclass(frozen=True)
class Placement:
    """Where a tenant is homed: its cell, the epoch of that placement, its state."""

    tenant_id: str
    cell: str
    epoch: int
    state: str


@dataclass(frozen=True)
class CellInfo:
    """A registered cell: its name, its order (the first is the default cell),
    its gateway's URL and its broker's bootstrap."""

    name: str
    position: int
    api_url: str
    kafka_bootstrap: str


def migrate(admin_url: str) -> list[migrations.Migration]:
    """The directory's own migrations, applied as cronwheel/store/migrate.py applies a cell's."""
    return migrations.migrate(admin_url, MIGRATIONS_DIR)


def register_cells(admin_url: str, cells: Sequence[CellInfo]) -> None:
    """Record (or update) each cell's order and addresses; as the owner."""
    with psycopg.connect(admin_url, autocommit=True) as conn, conn.transaction():
        for c in cells:
            conn.execute(
                _q()["register_cell"],
                {
                    "name": c.name,
                    "position": c.position,
                    "api_url": c.api_url,
                    "kafka_bootstrap": c.kafka_bootstrap,
                },
            )


def cells(conn: psycopg.Connection) -> list[CellInfo]:
    with conn.cursor(row_factory=class_row(CellInfo)) as cur:
        return cur.execute(_q()["cells"]).fetchall()


def placement(conn: psycopg.Connection, tenant_id: str) -> Placement | None:
    with conn.cursor(row_factory=class_row(Placement)) as cur:
        return cur.execute(_q()["placement"], {"tenant_id": tenant_id}).fetchone()


def place(conn: psycopg.Connection, tenant_id: str, cell: str) -> Placement:
    """Home a new tenant in `cell` at epoch 1, as the operator (one transaction)."""
    with conn.transaction(), conn.cursor(row_factory=class_row(Placement)) as cur:
        cur.execute(_q()["operator_role"])
        row = cur.execute(_q()["place"], {"tenant_id": tenant_id, "cell": cell}).fetchone()
    assert row is not None
    return row


def compare_and_set(
    conn: psycopg.Connection, tenant_id: str, epoch: int, cell: str, state: str
) -> Placement | None:
    """Set the tenant's cell and state if its epoch is still `epoch` (a change
    of cell takes the next epoch); None when another writer changed it first.
    The move protocol's write."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}")
    params = {"tenant_id": tenant_id, "epoch": epoch, "cell": cell, "state": state}
    with conn.transaction(), conn.cursor(row_factory=class_row(Placement)) as cur:
        cur.execute(_q()["operator_role"])
        return cur.execute(_q()["compare_and_set"], params).fetchone()
