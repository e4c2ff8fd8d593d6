"""Webhook targets in the store: signing secrets and what a delivery reads.

Secrets belong to an owner: the job (or, for a workflow's webhook nodes, the
workflow) whose runs they sign. The gateway calls `create_secret` in the
transaction that creates a webhook job and `rotate_secret` for
`POST /v1/jobs/{id}/rotate-secret`; both return the secret, which the API
shows that once. `secret_ids` is what `GET /v1/jobs/{id}` shows instead.

The webhook service calls `delivery_targets` once per batch of records, and
`defer_retry` in the transaction of a CompleteRun whose response asked (with
Retry-After) for a longer wait than the run's backoff.

At rest the secrets are sealed (cronwheel/core/sealing.py, migration 0016) with
the process's keyring (cronwheel/store/sealed.py, CRONWHEEL_SECRET_KEYS):
written sealed, opened here when read. Rows from before 0016 hold plaintext
and are still read; `reseal` seals them (and re-seals rows of an older key
after a rotation) in batches.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg

from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.errors import Conflict, NotFound, ValidationError
from cronwheel.core.ids import new_id, partition_of, partition_of_run
from cronwheel.core.sealing import Keyring, SealingError
from cronwheel.store import sealed as sealed_store
from cronwheel.store.run_days import Days, in_days
from cronwheel.store.sql_loader import queries

Q = queries("webhooks")
log = logging.getLogger(__name__)
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # Standard Webhooks asks for 24 to 64
DEFAULT_OVERLAP_MS = 24 * 3_600_000  # both signatures are sent for a day after a rotation
MAX_OVERLAP_MS = 7 * 24 * 3_600_000


def _context(owner_id: str, secret_id: str) -> str:
    """What a sealed secret is bound to: a copy in another row does not open."""
    return f"webhook_secrets|{owner_id}|{secret_id}"


def _open(owner_id: str, secret_id: str, plain, sealed, key_id) -> str | None:
    """The secret of one row (sealed or, before 0016, plaintext); None, logged,
    when it does not open (a key missing from CRONWHEEL_SECRET_KEYS): the
    delivery then fails as having no secret, never goes unsigned."""
    if sealed is None:
        return plain
    try:
        return sealed_store.keyring().open(sealed, key_id, _context(owner_id, secret_id))
    except SealingError as e:
        log.error("webhook secret %s of %s cannot be opened: %s", secret_id, owner_id, e)
        return None


def new_secret() -> str:
    """`whsec_` + base64 of 32 random bytes, the Standard Webhooks secret format."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


@dataclass(frozen=True)
class DeliveryTarget:
    """What the webhook service needs to deliver one run, read in one query."""

    run_id: str
    tenant_id: str
    state: str
    attempt: int
    # {type: webhook, url, method, headers, timeout_ms?}; headers may carry a
    # tenant's credentials for its endpoint, so neither they nor the signing
    # secrets show in a repr (a log line, a traceback's locals).
    target: dict = field(repr=False)
    payload: str  # JSON text, as the job holds it
    lease_ms: int
    timeout_ms: int | None  # the run's own timeout (its timer ends the attempt)
    owner_id: str | None
    job_id: str | None
    scheduled_ms: int
    secrets: tuple[str, ...] = field(repr=False)  # newest first; empty when the owner has none


def _check_owner(conn: psycopg.Connection, tenant_id: str, owner_id: str) -> int:
    p = partition_of(owner_id)
    found = conn.execute(
        Q["owner_exists"], {"p": p, "owner_id": owner_id, "tenant_id": tenant_id}
    ).fetchone()
    if found is None:
        raise NotFound("job")
    return p


def _issue(conn, p: int, tenant_id: str, owner_id: str, now: int) -> dict:
    secret, secret_id = new_secret(), new_id("whs")
    sealed, key_id = sealed_store.keyring().seal(secret, _context(owner_id, secret_id))
    row = conn.execute(
        Q["insert_secret"],
        {
            "p": p,
            "owner_id": owner_id,
            "secret_id": secret_id,
            "tenant_id": tenant_id,
            "sealed": sealed,
            "key_id": key_id,
            "now": to_dt(now),
        },
    ).fetchone()
    return {"secret_id": row[0], "secret": secret, "created_at": iso(to_ms(row[1]))}


def create_secret(conn: psycopg.Connection, tenant_id: str, owner_id: str, now: int) -> dict:
    """The owner's first secret: `{secret_id, secret, created_at}`. Call it in the
    transaction that creates the webhook job; Conflict SECRET_EXISTS if the owner
    already has a current secret (rotate it instead)."""
    with conn.transaction():
        p = _check_owner(conn, tenant_id, owner_id)
        try:
            with conn.transaction():
                return _issue(conn, p, tenant_id, owner_id, now)
        except psycopg.errors.UniqueViolation as e:
            raise Conflict("SECRET_EXISTS", "the job already has a signing secret") from e


def ensure_secret(conn: psycopg.Connection, tenant_id: str, owner_id: str, now: int) -> dict | None:
    """A new secret if the owner has none that signs (a job changed to a webhook
    target); None if it has one. The gateway shows a returned secret once."""
    with conn.transaction():
        p = _check_owner(conn, tenant_id, owner_id)
        if conn.execute(
            Q["secrets_of"], {"p": p, "owner_id": owner_id, "now": to_dt(now)}
        ).fetchone():
            return None
        return _issue(conn, p, tenant_id, owner_id, now)


def rotate_secret(
    conn: psycopg.Connection,
    tenant_id: str,
    owner_id: str,
    now: int,
    overlap_ms: int = DEFAULT_OVERLAP_MS,
) -> dict:
    """A new current secret; the old ones keep signing for `overlap_ms` at most,
    so every delivery in the window carries both signatures (`overlap_ms=0`: the
    old ones stop now, for a leaked secret). Returns the new secret (shown once)
    and `previous`: each secret whose end moved, and when it stops signing."""
    if isinstance(overlap_ms, bool) or not isinstance(overlap_ms, int):
        raise ValidationError("overlap_ms", "must be an integer")
    if not 0 <= overlap_ms <= MAX_OVERLAP_MS:
        raise ValidationError("overlap_ms", f"must be between 0 and {MAX_OVERLAP_MS}")
    with conn.transaction():
        p = _check_owner(conn, tenant_id, owner_id)
        retired = conn.execute(
            Q["retire_current"],
            {
                "p": p,
                "owner_id": owner_id,
                "tenant_id": tenant_id,
                "until": to_dt(now + overlap_ms),
            },
        ).fetchall()
        issued = _issue(conn, p, tenant_id, owner_id, now)
    issued["previous"] = [{"secret_id": r[0], "signs_until": iso(to_ms(r[2]))} for r in retired]
    return issued


def secret_ids(conn: psycopg.Connection, owner_id: str, now: int) -> list[dict]:
    """The secrets that sign now, newest first, without the secrets themselves:
    `[{secret_id, created_at, expires_at}]` (expires_at None for the current one)."""
    rows = conn.execute(
        Q["secrets_of"],
        {"p": partition_of(owner_id), "owner_id": owner_id, "now": to_dt(now)},
    ).fetchall()
    return [
        {
            "secret_id": r[0],
            "created_at": iso(to_ms(r[2])),
            "expires_at": iso(to_ms(r[3])) if r[3] else None,
        }
        for r in rows
    ]


def active_secrets(conn: psycopg.Connection, owner_id: str, now: int) -> list[str]:
    """The secrets a delivery is signed with now, newest first (those that open)."""
    rows = conn.execute(
        Q["secrets_of"],
        {"p": partition_of(owner_id), "owner_id": owner_id, "now": to_dt(now)},
    ).fetchall()
    opened = (_open(owner_id, r[0], r[1], r[4], r[5]) for r in rows)
    return [s for s in opened if s is not None]


def delivery_targets(
    conn: psycopg.Connection, run_ids: Sequence[str], now: int
) -> dict[str, DeliveryTarget]:
    """The runs among `run_ids` that exist, by id, in one query. Ids that are not
    run ids are left out (the caller treats them as unknown runs)."""
    keys = []
    for run_id in dict.fromkeys(run_ids):
        try:
            keys.append((partition_of_run(run_id), run_id))
        except ValueError:
            continue
    if not keys:
        return {}

    def ask(keys: list[tuple[int, str]], window: Days) -> list[tuple | None]:
        found = {
            row[0]: row
            for row in window.execute(
                conn,
                Q["delivery_targets"],
                {"p": [k[0] for k in keys], "id": [k[1] for k in keys], "now": to_dt(now)},
            )
        }
        return [found.get(run_id) for _p, run_id in keys]

    rows = [r for r in in_days(now, keys, ask, lambda r: r is None) if r is not None]
    out = {}
    for run_id, tenant_id, state, attempt, spec, job_id, _wf, _node, sched, owner, *held in rows:
        secs = [] if held[0] is None else [_open(owner, *one) for one in zip(*held, strict=True)]
        payload = spec.get("payload", "null")
        out[run_id] = DeliveryTarget(
            run_id=run_id,
            tenant_id=tenant_id,
            state=state,
            attempt=attempt,
            target=spec.get("target") or {},
            payload=payload if isinstance(payload, str) else json.dumps(payload),
            lease_ms=int(spec.get("lease_ms") or 30_000),
            timeout_ms=spec.get("timeout_ms"),
            owner_id=owner,
            job_id=job_id,
            scheduled_ms=to_ms(sched),
            secrets=tuple(s for s in secs if s is not None),
        )
    return out


def defer_retry(
    conn: psycopg.Connection, run_id: str, attempt: int, not_before_ms: int
) -> int | None:
    """Move the run's retry timer for `attempt` to no earlier than `not_before_ms`;
    the due time in ms, or None when there is no such timer (no retry was armed).
    Call it in the transaction of the CompleteRun that armed the timer."""
    row = conn.execute(
        Q["defer_retry"],
        {
            "p": partition_of_run(run_id),
            "run_id": run_id,
            "attempt": attempt,
            "not_before": to_dt(not_before_ms),
        },
    ).fetchone()
    return to_ms(row[0]) if row else None


def reseal(conn: psycopg.Connection, batch: int = 500) -> int:
    """Seal every secret with the keyring's current key, in batches of `batch`
    rows, each its own transaction (so it runs beside the live system): rows
    in plaintext (from before migration 0016) and rows sealed with an older key
    (after a rotation). Returns how many rows it changed. A row whose key is
    not in the keyring is left as it is (logged). Idempotent; call it with a
    connection in autocommit mode."""

    def one(row, keyring: Keyring) -> bool:
        p, owner_id, secret_id, plain, sealed, key_id = row
        secret = _open(owner_id, secret_id, plain, sealed, key_id)
        if secret is None:
            return False
        new, new_key = keyring.seal(secret, _context(owner_id, secret_id))
        conn.execute(
            Q["reseal"],
            {
                "p": p,
                "owner_id": owner_id,
                "secret_id": secret_id,
                "sealed": new,
                "key_id": new_key,
            },
        )
        return True

    return sealed_store.resealing(conn, Q["to_reseal"], batch, one, after_of=lambda row: row[2])
