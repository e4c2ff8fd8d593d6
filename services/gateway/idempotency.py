"""`Idempotency-Key` on POSTs: a replay returns the first response and does nothing.

Keys are scoped per tenant (or the operator). The key's row is written in the
same transaction as the request's effect, so either both commit or neither:
a crash between them cannot leave an effect without its recorded response. A
concurrent duplicate blocks on the row until the first commits, then replays.
The same key with a different request (method, path or body) is a 422.
Responses of 4xx are recorded too (the effect rolled back to a savepoint);
a 5xx records nothing, so the client may retry with the same key.
Keys are kept for RETENTION_MS; after that the key may be used afresh.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cronwheel.core.clock import to_dt
from cronwheel.store.sql_loader import queries
from services.gateway.problems import Problem

HEADER = "Idempotency-Key"
RETENTION_MS = 24 * 3600 * 1000
MAX_KEY_CHARS = 255


def _q() -> dict[str, str]:
    return queries("idempotency")


@dataclass(frozen=True)
class IdempotentRequest:
    key: str
    fingerprint: bytes


@dataclass(frozen=True)
class Stored:
    status: int
    body: str | None


def parse_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_KEY_CHARS or not all(" " < ch < "\x7f" for ch in value):
        raise Problem(
            422,
            "INVALID_FIELD",
            f"must be 1-{MAX_KEY_CHARS} visible ASCII characters",
            HEADER,
        )
    return value


def fingerprint(method: str, path: str, body: Any) -> bytes:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method}\n{path}\n{canonical}".encode()).digest()


def begin(conn, scope: str, req: IdempotentRequest, now: int) -> Stored | None:
    """Claim the key for this request (None: go ahead), or the stored first response."""
    args = {
        "scope": scope,
        "key": req.key,
        "fingerprint": req.fingerprint,
        "now": to_dt(now),
        "expired_before": to_dt(now - RETENTION_MS),
    }
    conn.execute(_q()["forget_expired"], args)
    if conn.execute(_q()["claim"], args).fetchone() is not None:
        return None
    row = conn.execute(_q()["stored"], args).fetchone()
    if row is None or row[1] is None:  # pragma: no cover - only a rolled-back race
        raise Problem(409, "IDEMPOTENCY_IN_PROGRESS", "retry: the first request is still running")
    if bytes(row[0]) != req.fingerprint:
        raise Problem(
            422,
            "IDEMPOTENCY_KEY_REUSED",
            "this key was used with a different request",
            HEADER,
        )
    return Stored(row[1], row[2])


def record(conn, scope: str, req: IdempotentRequest, status: int, body: str | None) -> None:
    conn.execute(_q()["record"], {"scope": scope, "key": req.key, "status": status, "body": body})
