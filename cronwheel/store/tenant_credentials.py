"""A tenant's Kafka credential as its broker keeps it (cronwheel/scram.py:
mechanism, iterations, salt, SaltedPassword), kept in the tenant's row so that
a move makes the same credential in another cell's broker.

SaltedPassword lets whoever holds it log in as the tenant (a SCRAM client's
ClientKey is an HMAC of it), so it is sealed at rest with the operator's
keyring, bound to the tenant (a copy in another tenant's row does not open),
as webhook secrets are (cronwheel/core/sealing.py, cronwheel/store/sealed.py).
Rows from before migration 0027 hold it in the clear with no key id; they are
read as they are, and `reseal` (`cronwheel secrets reseal`) seals them.
"""

from __future__ import annotations

import base64
import logging

import psycopg
from psycopg.rows import dict_row

from cronwheel.core.sealing import SealingError
from cronwheel.scram import Verifier
from cronwheel.store import sealed as sealed_store
from cronwheel.store.sql_loader import queries

Q = queries("kafka_scram")
log = logging.getLogger(__name__)


def _context(tenant_id: str) -> str:
    return f"tenants|{tenant_id}|kafka_scram"


def keep(conn: psycopg.Connection, tenant_id: str, kept: Verifier) -> None:
    """Write the tenant's credential, its SaltedPassword sealed, in the
    caller's transaction."""
    text = base64.b64encode(kept.salted_password).decode()
    sealed, key_id = sealed_store.keyring().seal(text, _context(tenant_id))
    conn.execute(
        Q["keep"],
        {
            "t": tenant_id,
            "mechanism": kept.mechanism,
            "iterations": kept.iterations,
            "salt": kept.salt,
            "salted_password": sealed,
            "key_id": key_id,
        },
    )


def _open(tenant_id: str, stored: bytes, key_id: str | None) -> bytes:
    """SaltedPassword from its column: sealed, or in the clear without a key id."""
    if key_id is None:
        return bytes(stored)
    text = sealed_store.keyring().open(bytes(stored), key_id, _context(tenant_id))
    return base64.b64decode(text)


def kept(conn: psycopg.Connection, tenant_id: str) -> Verifier | None:
    """The tenant's credential, or None for a tenant made before they were
    kept. A sealed one that does not open (its key is not in this process's
    keyring, or the row was copied from another tenant's) raises SealingError:
    a move must stop there, not give the target a credential it cannot check."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["kept"], {"t": tenant_id}).fetchone()
    if row is None:
        return None
    return Verifier(
        mechanism=row["mechanism"],
        iterations=row["iterations"],
        salt=bytes(row["salt"]),
        salted_password=_open(tenant_id, row["salted_password"], row["key_id"]),
    )


def reseal(conn: psycopg.Connection, batch: int = 500) -> int:
    """Seal every kept credential with the keyring's current key, in batches
    of `batch` rows, each its own transaction (it runs beside the live
    system): rows in the clear (from before 0027) and rows of an older key.
    Returns how many it changed; a row whose key is not in the keyring is
    left as it is (logged). Idempotent; call it with a connection in
    autocommit mode."""

    def one(row, keyring) -> bool:
        tenant_id, stored, key_id = row
        try:
            salted = _open(tenant_id, stored, key_id)
        except SealingError as e:
            log.error("tenant %s's Kafka credential cannot be opened: %s", tenant_id, e)
            return False
        text = base64.b64encode(salted).decode()
        sealed, new_key = keyring.seal(text, _context(tenant_id))
        conn.execute(Q["reseal"], {"t": tenant_id, "sealed": sealed, "key_id": new_key})
        return True

    return sealed_store.resealing(conn, Q["to_reseal"], batch, one, after_of=lambda row: row[0])
