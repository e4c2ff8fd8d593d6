"""`Idempotency-Key` on POSTs: a replay returns the first response and does nothing.

Keys are scoped per tenant (or the operator). The key's row is written in the
same transaction as the request's effect, so either both commit or neither:
a crash between them cannot leave an effect without its recorded response. A
concurrent duplicate blocks on the row until the first commits, then replays.
The same key with a different request (method, path or body) is a 422.
Responses of 4xx are recorded too (the effect rolled back to a savepoint);
a 5xx records nothing, so the client may retry with the same key.
Keys are kept for RETENTION_MS; after that the key may be used afresh, and a
`Pruner` thread of each gateway process deletes expired rows in batches.

No secret is kept here (docs/api.md, "Idempotency"): a response that shows a
secret once (an API key, a webhook signing secret, a Kafka password) is
recorded with that field set to null and named in `not_shown_again`, so its
replay says "done, and the secret is not shown again" (with the header
`Secret-Not-Shown-Again`) rather than handing the secret out a second time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cronwheel.core.clock import to_dt
from cronwheel.store.sql_loader import queries
from services.gateway.problems import Problem

HEADER = "Idempotency-Key"
RETENTION_MS = 24 * 3600 * 1000
MAX_KEY_CHARS = 255
NOT_SHOWN_HEADER = "Secret-Not-Shown-Again"
NOT_SHOWN_FIELD = "not_shown_again"
# Where a successful answer carries a secret shown once: paths from the top of
# the body (whose keys are the API's own, never a tenant's data); "*" is every
# item of a list. API keys (tenants, keys), Kafka passwords, webhook signing
# secrets (job create / patch, the batch's jobs, rotate-secret).
SECRET_PATHS: tuple[tuple[str, ...], ...] = (
    ("api_key",),
    ("kafka", "password"),
    ("password",),
    ("signing_secret", "secret"),
    ("secret",),
    ("results", "*", "job", "signing_secret", "secret"),
)
_SECRET_NAMES = tuple(f'"{path[-1]}"' for path in SECRET_PATHS)
log = logging.getLogger(__name__)


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
    """Keep the answer for replays, without the secrets it showed (`redact`)."""
    kept = redact(body) if status < 300 else body
    conn.execute(_q()["record"], {"scope": scope, "key": req.key, "status": status, "body": kept})


def redact(body: str | None) -> str | None:
    """The JSON answer with every secret of SECRET_PATHS set to null and their
    paths listed in `not_shown_again` (dotted, list items by index); the answer
    itself when it shows none. Only answers that name such a field are parsed."""
    if body is None or not any(name in body for name in _SECRET_NAMES):
        return body
    try:
        doc = json.loads(body)
    except ValueError:  # pragma: no cover - the gateway records JSON only
        return body
    if not isinstance(doc, dict):
        return body
    hidden: list[str] = []
    for path in SECRET_PATHS:
        _blank(doc, path, (), hidden)
    if not hidden:
        return body
    doc[NOT_SHOWN_FIELD] = hidden
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _blank(node: Any, path: tuple[str, ...], at: tuple[str, ...], hidden: list[str]) -> None:
    head, rest = path[0], path[1:]
    if head == "*":
        for i, item in enumerate(node if isinstance(node, list) else ()):
            _blank(item, rest, (*at, str(i)), hidden)
        return
    if not isinstance(node, dict) or head not in node:
        return
    if rest:
        _blank(node[head], rest, (*at, head), hidden)
    elif isinstance(node[head], str):
        node[head] = None
        hidden.append(".".join((*at, head)))


def not_shown(body: str | None) -> str | None:
    """The replay's Secret-Not-Shown-Again header: the paths `redact` blanked."""
    if body is None or f'"{NOT_SHOWN_FIELD}"' not in body:
        return None
    try:
        paths = json.loads(body).get(NOT_SHOWN_FIELD)
    except (ValueError, AttributeError):  # pragma: no cover - recorded by redact
        return None
    return ", ".join(paths) if isinstance(paths, list) and paths else None


# -- retention -------------------------------------------------------------------


def prune(conn, now: int, batch: int = 1000, pause: Callable[[], bool] | None = None) -> int:
    """Delete the keys older than RETENTION_MS, `batch` rows per transaction
    (oldest first, by the created_at index; rows another transaction holds are
    skipped), until none is left or `pause()` says stop. Every tenant's rows:
    the scope is lifted in each transaction. Returns how many it deleted."""
    deleted = 0
    args = {"expired_before": to_dt(now - RETENTION_MS), "batch": batch}
    while True:
        with conn.transaction():
            conn.execute(_q()["all_scopes"])
            n = conn.execute(_q()["prune"], args).rowcount
        deleted += n
        if n < batch or (pause is not None and pause()):
            return deleted


def redact_stored(conn, batch: int = 500) -> int:
    """Redact the answers recorded before `record` redacted them (an upgrade):
    every successful answer that names a secret field is rewritten through
    `redact`, `batch` rows per transaction (SKIP LOCKED). Returns how many
    changed; answers already redacted stay as they are."""
    changed, after = 0, ("", "")
    while True:
        with conn.transaction():
            conn.execute(_q()["all_scopes"])
            rows = conn.execute(
                _q()["unredacted"], {"scope": after[0], "key": after[1], "batch": batch}
            ).fetchall()
            for scope, key, body in rows:
                kept = redact(body)
                if kept != body:
                    conn.execute(_q()["rewrite"], {"scope": scope, "key": key, "body": kept})
                    changed += 1
        if len(rows) < batch:
            return changed
        after = (rows[-1][0], rows[-1][1])


class Pruner:
    """A gateway process's thread that prunes expired keys every `interval_s`,
    on a pooled connection taken per pass: requests never wait for it (it
    holds one connection for a batch at a time, and yields between batches).
    Its first pass also redacts answers recorded before redaction existed
    (`redact_stored`), so an upgrade leaves no secret here for the day
    those rows have left."""

    def __init__(
        self,
        pool,
        clock: Callable[[], int],
        interval_s: float = 60.0,
        batch: int = 1000,
    ):
        self.pool = pool
        self.clock = clock
        self.interval_s = interval_s
        self.batch = batch
        self._legacy_done = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idempotency-pruner", daemon=True)

    def start(self) -> Pruner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def run_once(self) -> int:
        with self.pool.connection() as conn:
            if not self._legacy_done:
                if n := redact_stored(conn):
                    log.info("redacted %d idempotency answers recorded with secrets", n)
                self._legacy_done = True
            return prune(conn, self.clock(), self.batch, pause=lambda: self._stop.wait(0.05))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                n = self.run_once()
                if n:
                    log.info("pruned %d expired idempotency keys", n)
            except Exception:  # a database outage: the next pass tries again
                log.warning("pruning idempotency keys failed", exc_info=True)
