"""The directory of cells, in its own database (docs/cells.md): which cell each
tenant is homed in (tenant -> cell, epoch, state) and which cells there are.
Its migrations are its own (`directory_migrations/`, recorded in that
database's schema_migrations); its SQL is sql/directory.sql. Routers and
gateways read it through cronwheel/directory.py's cache, never directly.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg.rows import class_row

from cronwheel.store import migrate as migrations
from cronwheel.store.sql_loader import queries

MIGRATIONS_DIR = Path(__file__).with_name("directory_migrations")
STATES = ("active", "moving", "frozen")
# A move's states (directory migration 0002, cronwheel/moves.py): the first
# three are open (at most one per tenant), the last three final.
MOVE_STATES = ("copying", "freezing", "switching", "done", "failed", "rolled_back")
OPEN_MOVE_STATES = MOVE_STATES[:3]


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


@dataclass(frozen=True)
class Move:
    """A move of a tenant from `source` to `target`, recorded at the
    placement's `epoch`; `frozen_at` .. `unfrozen_at` is the freeze window."""

    move_id: str
    tenant_id: str
    source: str
    target: str
    epoch: int
    state: str
    error: str | None
    started_at: datetime
    frozen_at: datetime | None
    unfrozen_at: datetime | None
    finished_at: datetime | None
    source_removed_at: datetime | None = None  # NULL: the source's copy is kept

    @property
    def frozen_ms(self) -> int | None:
        if self.frozen_at is None:
            return None
        end = self.unfrozen_at or self.finished_at
        if end is None:
            return None
        return int((end - self.frozen_at).total_seconds() * 1000)


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


# -- moves (cronwheel/moves.py is the caller) ---------------------------------
def record_move(
    conn: psycopg.Connection, move_id: str, placed: Placement, target: str
) -> Move | None:
    """Record a move of `placed`'s tenant to `target`, as the operator; None
    when the tenant already has an open move (one at a time)."""
    params = {
        "move_id": move_id,
        "tenant_id": placed.tenant_id,
        "source": placed.cell,
        "target": target,
        "epoch": placed.epoch,
    }
    try:
        with conn.transaction(), conn.cursor(row_factory=class_row(Move)) as cur:
            cur.execute(_q()["operator_role"])
            return cur.execute(_q()["record_move"], params).fetchone()
    except psycopg.errors.UniqueViolation:
        return None


def move(conn: psycopg.Connection, move_id: str) -> Move | None:
    with conn.cursor(row_factory=class_row(Move)) as cur:
        return cur.execute(_q()["move"], {"move_id": move_id}).fetchone()


def latest_move(conn: psycopg.Connection, tenant_id: str) -> Move | None:
    with conn.cursor(row_factory=class_row(Move)) as cur:
        return cur.execute(_q()["latest_move"], {"tenant_id": tenant_id}).fetchone()


def open_moves(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute(_q()["open_moves"]).fetchall()]


def kept_sources(
    conn: psycopg.Connection,
    retention_s: float,
    *,
    tenant_id: str | None = None,
    cell: str | None = None,
) -> list[Move]:
    """Moves done whose source copy is kept and past `retention_s`; with
    `tenant_id`, that tenant's kept in `cell` whatever their age."""
    params = {"retention_s": retention_s, "tenant_id": tenant_id, "cell": cell}
    with conn.cursor(row_factory=class_row(Move)) as cur:
        return cur.execute(_q()["kept_sources"], params).fetchall()


@contextlib.contextmanager
def tenant_lock(conn: psycopg.Connection, tenant_id: str):
    """A session lock on the tenant in the directory for the block (an
    advisory lock: the removal of a move's kept copy, and a move back into
    that cell, one at a time)."""
    key = "cronwheel.tenant:" + tenant_id
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [key])
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])


def mark_source_removed(conn: psycopg.Connection, move_id: str) -> Move | None:
    """Record that the move's source copy is gone, as the operator."""
    with conn.transaction(), conn.cursor(row_factory=class_row(Move)) as cur:
        cur.execute(_q()["operator_role"])
        return cur.execute(_q()["mark_source_removed"], {"move_id": move_id}).fetchone()


def step_move(
    conn: psycopg.Connection,
    move_id: str,
    frm: str,
    to: str,
    *,
    error: str | None = None,
    frozen: bool = False,
    unfrozen: bool = False,
) -> Move | None:
    """Move `move_id` from state `frm` to `to`; None when it was not in `frm`
    (another mover took the step)."""
    if to not in MOVE_STATES:
        raise ValueError(f"a move's state is one of {', '.join(MOVE_STATES)}")
    params = {
        "move_id": move_id,
        "from": frm,
        "to": to,
        "error": error,
        "frozen": frozen,
        "unfrozen": unfrozen,
    }
    with conn.transaction(), conn.cursor(row_factory=class_row(Move)) as cur:
        cur.execute(_q()["operator_role"])
        return cur.execute(_q()["step_move"], params).fetchone()


def mark_frozen(conn: psycopg.Connection, move_id: str) -> None:
    with conn.transaction():
        conn.execute(_q()["operator_role"])
        conn.execute(_q()["mark_frozen"], {"move_id": move_id})
