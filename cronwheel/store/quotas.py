"""What a tenant may take: its fair share of a pass, and its token buckets.

Fair shares: when more is due than one pass takes, the firing loop and the
relay split the pass over lanes (a class and a tenant, or a class and a topic):
classes in order, and within a class the same share for every lane
(round-robin), the remainder rotating so no lane is always last.

Token buckets on firing and dispatch rates, set by the operator.

A bucket (`tenant_quotas` row) holds up to `burst` tokens and refills at
`rate_per_s`; the timer takes one per job timer it fires, the dispatcher one
per record it forwards. A tenant without a bucket of a kind is not limited.
The state lives in PostgreSQL, so several instances of a service share one
bucket: each take refills and debits under the row's lock. What a bucket
refuses stays where it is (a due timer, an unread record) and is offered again
when the bucket refills; the refusal is counted (`held_total`, `held_at`) and
published as `cronwheel_quota_held` / `cronwheel_quota_throttled_total`.

`Buckets.limited` is cached for `refresh_ms`, so the common case (no tenant of
the batch has a bucket) costs no query.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import psycopg

from cronwheel.core.clock import iso, to_dt, to_ms
from cronwheel.core.errors import Conflict, ValidationError
from cronwheel.store.sql_loader import queries

Q = queries("quotas")
KINDS = ("fire", "dispatch")
MAX_RATE = 1_000_000.0
MIN_RATE = 0.001  # a token per 1000 s; below, refill arithmetic underflows


def fair_shares(lanes: list[tuple[int, str]], room: int, turn: int = 0) -> dict:
    """Quotas for one round: `lanes` are (class rank, lane key) sorted by class.
    The highest class present gets the whole room in equal shares (the
    remainder, or the room itself when there are more lanes than room, goes to
    the lanes from position `turn` on); lower classes get room only in a later
    round, once the higher lanes turned out to hold less than their share."""
    out: dict = {}
    if room <= 0 or not lanes:
        return out
    top = lanes[0][0]
    group = [lane for lane in lanes if lane[0] == top]
    n = len(group)
    share, extra = divmod(room, n)
    start = turn % n
    for i in range(n):
        lane = group[(start + i) % n]
        q = share + (1 if i < extra else 0)
        if q > 0:
            out[lane] = q
    return out


@dataclass(frozen=True)
class Grant:
    granted: int
    held: int
    resume_ms: int | None  # when the bucket has a whole token again, if it held any


class Buckets:
    """The buckets of one kind, as a service instance uses them."""

    def __init__(self, kind: str, refresh_ms: int = 1_000):
        if kind not in KINDS:
            raise ValueError(f"unknown quota kind {kind!r}")
        self.kind = kind
        self.refresh_ms = refresh_ms
        self._limited: frozenset[str] = frozenset()
        self._loaded_at: int | None = None

    def limited(self, conn: psycopg.Connection, now: int) -> frozenset[str]:
        """Tenants with a bucket of this kind (cached for refresh_ms)."""
        if self._loaded_at is None or now - self._loaded_at >= self.refresh_ms:
            rows = conn.execute(Q["limited"], {"kind": self.kind}).fetchall()
            self._limited = frozenset(r[0] for r in rows)
            self._loaded_at = now
        return self._limited

    def take(
        self, conn: psycopg.Connection, wants: Mapping[str, int], now: int
    ) -> dict[str, Grant]:
        """Take up to `wants[tenant]` tokens from each tenant's bucket; tenants
        without one are absent from the answer (not limited)."""
        wants = {t: n for t, n in wants.items() if n > 0}
        if not wants:
            return {}
        rows = conn.execute(
            Q["take"],
            {
                "kind": self.kind,
                "tenants": list(wants),
                "wants": list(wants.values()),
                "now": to_dt(now),
            },
        ).fetchall()
        out = {}
        for tenant, granted, held, left, rate in rows:
            resume = None
            if held:
                resume = now + max(1, math.ceil((1 - left) / rate * 1000))
            out[tenant] = Grant(granted, held, resume)
        return out


def _bucket(raw, field: str) -> tuple[float, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError(field, "must be an object {rate_per_s, burst?} or null")
    unknown = sorted(set(raw) - {"rate_per_s", "burst"})
    if unknown:
        raise ValidationError(f"{field}.{unknown[0]}", "unknown field")
    rate = raw.get("rate_per_s")
    if (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not MIN_RATE <= rate <= MAX_RATE
    ):
        raise ValidationError(
            f"{field}.rate_per_s", f"must be a number in [{MIN_RATE}, {MAX_RATE:.0f}]"
        )
    burst = raw.get("burst", max(1.0, float(rate)))
    if isinstance(burst, bool) or not isinstance(burst, int | float) or not 1 <= burst <= MAX_RATE:
        raise ValidationError(f"{field}.burst", f"must be a number in [1, {MAX_RATE:.0f}]")
    return float(rate), float(burst)


def set_quotas(conn: psycopg.Connection, tenant_id: str, body: Mapping, now: int) -> dict:
    """Operator: `{fire?, dispatch?}`, each `{rate_per_s, burst?}` (burst defaults
    to one second's worth) or null to remove the limit. Kinds not named stay."""
    if not isinstance(body, Mapping):
        raise ValidationError("body", "must be an object")
    unknown = sorted(set(body) - set(KINDS))
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    parsed = {kind: _bucket(body[kind], kind) for kind in KINDS if kind in body}
    for kind, bucket in parsed.items():
        if bucket is None:
            conn.execute(Q["remove"], {"tenant_id": tenant_id, "kind": kind})
        else:
            conn.execute(
                Q["upsert"],
                {
                    "tenant_id": tenant_id,
                    "kind": kind,
                    "rate": bucket[0],
                    "burst": bucket[1],
                    "now": to_dt(now),
                },
            )
    return get_quotas(conn, tenant_id, now)


def get_quotas(conn: psycopg.Connection, tenant_id: str, now: int) -> dict:
    """`{fire, dispatch}`: each null (no limit) or the bucket as of `now`."""
    out: dict = dict.fromkeys(KINDS)
    rows = conn.execute(Q["of_tenant"], {"tenant_id": tenant_id, "now": to_dt(now)}).fetchall()
    for kind, rate, burst, tokens, held_total, held_at, updated_at in rows:
        out[kind] = {
            "rate_per_s": rate,
            "burst": burst,
            "tokens": round(tokens, 3),
            "held_total": held_total,
            "held_at": iso(to_ms(held_at)) if held_at else None,
            "updated_at": iso(to_ms(updated_at)),
        }
    return out


def set_classes(conn: psycopg.Connection, tenant_id: str, classes: list[str]) -> tuple | None:
    """Replace a tenant's entitled classes; the row, or None if no such tenant."""
    return conn.execute(Q["set_classes"], {"tenant_id": tenant_id, "classes": classes}).fetchone()


def jobs_outside(conn: psycopg.Connection, tenant_id: str, classes: list[str]) -> dict[str, int]:
    """Live jobs of the tenant in a class not in `classes`, counted by class."""
    rows = conn.execute(Q["jobs_using"], {"tenant_id": tenant_id, "classes": classes}).fetchall()
    return {r[0]: r[1] for r in rows}


# -- object quotas -------------------------------------------------------------
# How many live jobs and workflows and unrevoked API keys a tenant may hold: the
# gateway's defaults (ObjectLimits, from its settings), unless the operator set
# the tenant's own (`tenant_limits`, migration 0017). A creation counts under a
# lock per (tenant, kind) held to the end of its transaction (`room`), so two
# concurrent creations cannot both take the last slot.

OBJECTS = ("jobs", "workflows", "keys")
MAX_OBJECTS = 1_000_000_000
QUOTA_EXCEEDED = "QUOTA_EXCEEDED"


@dataclass(frozen=True)
class ObjectLimits:
    """The defaults, for tenants the operator set nothing for."""

    jobs: int = 10_000
    workflows: int = 1_000
    keys: int = 100

    def of(self, kind: str) -> int:
        return getattr(self, kind)


@dataclass(frozen=True)
class Room:
    """A tenant's quota of one kind as counted under its lock."""

    kind: str
    limit: int
    count: int

    @property
    def free(self) -> int:
        return max(0, self.limit - self.count)

    def exceeded(self, taken: int = 0) -> Conflict:
        """409 QUOTA_EXCEEDED naming the quota, its limit and the count (with the
        `taken` slots this transaction filled before)."""
        return Conflict(
            QUOTA_EXCEEDED,
            f"quota {self.kind} exceeded: limit {self.limit}, count {self.count + taken}"
            f" ({_COUNTED[self.kind]}); free some or ask the operator to raise it",
        )


_COUNTED = {"jobs": "live jobs", "workflows": "live workflows", "keys": "unrevoked keys"}


def room(conn: psycopg.Connection, tenant_id: str, kind: str, defaults: ObjectLimits) -> Room:
    """Lock the tenant's `kind` until the transaction ends, then count. Call it
    in the transaction that creates the objects, before creating them."""
    args = {"tenant_id": tenant_id, "kind": kind}
    with conn.pipeline():  # one round trip; still two statements, two snapshots
        conn.execute(Q["lock_objects"], args)
        cur = conn.execute(Q[f"count_{kind}"], args)
    limit, count = cur.fetchone()
    return Room(kind, defaults.of(kind) if limit is None else limit, count)


def reserve(
    conn: psycopg.Connection, tenant_id: str, kind: str, n: int, defaults: ObjectLimits
) -> Room:
    """`room`, raising QUOTA_EXCEEDED (409) unless `n` more fit."""
    got = room(conn, tenant_id, kind, defaults)
    if got.count + n > got.limit:
        raise got.exceeded()
    return got


def object_limits(
    conn: psycopg.Connection, tenant_id: str, defaults: ObjectLimits
) -> dict[str, dict]:
    """`{jobs, workflows, keys}`: each `{limit, count, default}` (default: the
    limit is the gateway's default, the operator set none)."""
    out = {}
    for kind in OBJECTS:
        limit, count = conn.execute(
            Q[f"count_{kind}"], {"tenant_id": tenant_id, "kind": kind}
        ).fetchone()
        out[kind] = {
            "limit": defaults.of(kind) if limit is None else limit,
            "count": count,
            "default": limit is None,
        }
    return out


def set_object_limits(
    conn: psycopg.Connection, tenant_id: str, body, defaults: ObjectLimits, now: int
) -> dict[str, dict]:
    """Operator (PUT /v1/tenants/{id}/quotas/objects): `{jobs?, workflows?,
    keys?}`, each a count (0 to 10^9; below what the tenant holds is allowed: it
    only stops new ones) or null for the default. Kinds not named stay."""
    if not isinstance(body, Mapping):
        raise ValidationError("body", "must be an object {jobs?, workflows?, keys?}")
    unknown = sorted(set(body) - set(OBJECTS))
    if unknown:
        raise ValidationError(unknown[0], "unknown field")
    for kind in OBJECTS:
        if kind not in body:
            continue
        value = body[kind]
        args = {"tenant_id": tenant_id, "kind": kind}
        if value is None:
            conn.execute(Q["reset_limit"], args)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OBJECTS:
            raise ValidationError(kind, f"must be an integer from 0 to {MAX_OBJECTS} or null")
        conn.execute(Q["set_limit"], {**args, "max_count": value, "now": to_dt(now)})
    return object_limits(conn, tenant_id, defaults)
