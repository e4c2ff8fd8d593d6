"""Secrets at rest in the store: the keyring they are sealed and opened with,
and the walk that seals them again with its current key.

Two kinds of row hold a sealed secret (cronwheel/core/sealing.py): webhook
signing secrets (cronwheel/store/webhooks.py, migration 0016) and tenants'
kept Kafka credentials (cronwheel/store/tenant_credentials.py, migration
0027). Both seal with the process's keyring (`config.secret_keyring()`,
CRONWHEEL_SECRET_KEYS), which tests may replace (`use_keyring`), and both
are resealed by `cronwheel secrets reseal` through `resealing`.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from cronwheel import config
from cronwheel.core.sealing import Keyring

# The keyring to seal and open with; tests may replace it (use_keyring).
_keyring: Callable[[], Keyring] = config.secret_keyring


def use_keyring(keyring: Keyring | None) -> None:
    """Seal and open with `keyring` (None: the process's, from the environment)."""
    global _keyring
    _keyring = config.secret_keyring if keyring is None else (lambda: keyring)


def keyring() -> Keyring:
    """The keyring secrets at rest are sealed and opened with (use_keyring)."""
    return _keyring()


def resealing(
    conn: psycopg.Connection,
    to_reseal: str,
    batch: int,
    one: Callable[[tuple, Keyring], bool],
    after_of: Callable[[tuple], str],
) -> int:
    """Walk the rows `to_reseal` selects (params: current, after, batch; in
    the order of `after_of(row)`), `batch` per transaction, calling
    `one(row, keyring)` for each; returns how many it said it changed. Each
    batch its own transaction, so it runs beside the live system; call it
    with a connection in autocommit mode."""
    ring = keyring()
    changed, after = 0, ""
    while True:
        with conn.transaction():
            rows = conn.execute(
                to_reseal, {"current": ring.current_id, "after": after, "batch": batch}
            ).fetchall()
            changed += sum(1 for row in rows if one(row, ring))
        if len(rows) < batch:
            return changed
        after = after_of(rows[-1])
