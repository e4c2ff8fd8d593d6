"""The indexes of partitioned tables, built without blocking their writers.

`CREATE INDEX` on a partitioned table builds every partition's index under a
lock that stops writes to it, and `CONCURRENTLY` is refused there. So a
migration declares the index on the parent alone (`CREATE INDEX ... ON ONLY`,
a catalog entry, invalid until complete), and `complete()`, which `cronwheel
migrate` runs after the steps it applied, builds each partition's index
`CONCURRENTLY` and attaches it; once every partition has one, PostgreSQL marks
the parent's valid. A partition made later (`CREATE TABLE ... PARTITION OF`,
or attached) gets its indexes with its table. Each partition's index is named
`<partition>_<the parent index's name less its table's>`.
"""

from __future__ import annotations

import functools
import hashlib

import psycopg
from psycopg import sql

from cronwheel.store.sql_loader import queries

MAX_NAME = 63  # PostgreSQL's identifier length


@functools.cache
def _q() -> dict[str, str]:
    return queries("partition_indexes")


def child_name(parent_index: str, parent_table: str, partition: str) -> str:
    """`<partition>_<suffix>`; past PostgreSQL's 63 bytes, cut and told apart
    by a hash of the whole name, so two parents never share a child's name."""
    name = f"{partition}_{parent_index.removeprefix(parent_table + '_')}"
    if len(name.encode()) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name.encode()[: MAX_NAME - 9].decode(errors='ignore')}_{digest}"


def complete(conn: psycopg.Connection) -> list[str]:
    """Build and attach every partition's missing index; returns the names
    built. `conn` is the owner's, in autocommit (CONCURRENTLY runs outside a
    transaction). A build that failed before left an invalid index of the
    same name: it is dropped and built again. A partition dropped meanwhile
    (a retention pass) is passed over."""
    built = []
    for parent_index, parent_table, partition, unique, body in conn.execute(_q()["missing"]):
        child = child_name(parent_index, parent_table, partition)
        try:
            if _build(conn, parent_index, partition, child, unique, body):
                built.append(child)
        except psycopg.errors.UndefinedTable:
            continue
    return built


def _build(conn, parent_index: str, partition: str, child: str, unique: bool, body: str) -> bool:
    """One partition's index, built unless a valid one is there, then
    attached; whether it was built."""
    valid = conn.execute(_q()["index_valid"], {"name": child, "partition": partition}).fetchone()
    if valid is not None and not valid[0]:
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY {}").format(sql.Identifier(child)))
        valid = None
    if valid is None:
        conn.execute(
            sql.SQL("CREATE {unique}INDEX CONCURRENTLY {child} ON {partition} USING {body}").format(
                unique=sql.SQL("UNIQUE " if unique else ""),
                child=sql.Identifier(child),
                partition=sql.Identifier(partition),
                body=sql.SQL(body),
            )
        )
    conn.execute(
        sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(
            sql.Identifier(parent_index), sql.Identifier(child)
        )
    )
    return valid is None
