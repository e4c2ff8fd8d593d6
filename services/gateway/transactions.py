"""One request, one transaction, in the caller's scope.

A handler hands `Gateway.as_tenant` (or `as_operator`) one function that calls
into cronwheel/store. Around it, in a single transaction on a pooled
connection: the key is looked up (a revoked key fails at once), the
transaction's scope is set for row-level security (docs/tenancy.md), the
Idempotency-Key is claimed or replayed, and the answer is rendered. The key
check and the scope are one statement (cronwheel_authenticate, migration 0007).
Every pooled session acts as the role `cronwheel_gateway`, whose policies show
no tenant's row outside a scope; an operator request becomes
`cronwheel_operator` for its transaction alone (migration 0018).
The worker protocol's routes also run in psycopg's pipeline mode, so BEGIN goes
out with the key check and the statements nobody reads (an outbox row, a
notify) with the COMMIT: a StartRun or CompleteRun is three round trips.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg_pool import ConnectionPool
from starlette.responses import Response

from cronwheel.core.clock import now_ms
from cronwheel.core.ssrf import Network
from cronwheel.kafka import Topics
from cronwheel.store.db import LINK_LIMITS, pipelined_transaction
from cronwheel.store.jobs import Jobs, hash_key
from cronwheel.store.lifecycle import Lifecycle
from cronwheel.store.sql_loader import queries
from cronwheel.store.workflows import Workflows
from services.gateway import idempotency, problems, topics_ready
from services.gateway.auth import READS, Caller, unauthenticated
from services.gateway.destinations import DestinationCheck
from services.gateway.problems import Problem
from services.gateway.ratelimit import RateLimiter
from services.gateway.topics_ready import TopicsReady

OPERATOR_SCOPE = "operator"  # the idempotency scope of operator requests


@functools.cache
def _q() -> dict[str, str]:
    return {**queries("transactions"), **queries("auth")}


@dataclass(frozen=True)
class Tx:
    """What a handler's store call gets: the connection, the tenant and `now`."""

    conn: Any
    tenant: dict | None
    now: int


@dataclass(frozen=True)
class Reply:
    """A result whose status depends on what happened (201 created, 200 existed)."""

    status: int
    body: Any


def dumps(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def respond(status: int, text: str | None) -> Response:
    if status == 204 or text is None:
        return Response(status_code=status)
    media = problems.MEDIA_TYPE if status >= 400 else "application/json"
    return Response(text, status_code=status, media_type=media)


class Gateway:
    """The gateway's wiring: pool, store objects, limiter, clock and settings."""

    def __init__(
        self,
        dsn: str,
        topics: Topics,
        bootstrap: str,
        operator_key: str,
        *,
        limiter: RateLimiter,
        clock: Callable[[], int] = now_ms,
        cell: str = "local",
        webhook_allow: Sequence[Network] = (),
        pool_min: int = 1,
        pool_max: int = 10,
        make_topics: bool = False,
        topics_wait_s: float = topics_ready.WAIT_S,
    ):
        """`make_topics`: tenants' topics made before the calls that create
        tenants and jobs answer, waiting for the broker `topics_wait_s` at
        most (topics_ready.py; main.py turns it on)."""
        if not operator_key:
            raise ValueError("an operator key is required")
        self.topics = topics
        self.bootstrap = bootstrap
        self.operator_key = operator_key
        self.limiter = limiter
        self.clock = clock
        self.cell = cell
        self.webhook_allow = list(webhook_allow)
        # Webhook URLs looked up before the transaction; main.py sets the
        # timeout from CRONWHEEL_WEBHOOK_DNS_TIMEOUT_MS.
        self.destinations = DestinationCheck(self.webhook_allow)
        self.jobs = Jobs(topics, bootstrap)
        self.lifecycle = Lifecycle(topics)
        self.workflows = Workflows(topics)
        self.pool = ConnectionPool(
            dsn,
            min_size=pool_min,
            max_size=pool_max,
            kwargs={"autocommit": True, **LINK_LIMITS},  # a lost link ends (db.py)
            configure=self._configure,
            timeout=5.0,
            name="gateway",
            open=True,
        )
        self._admin = None
        self._admin_lock = threading.Lock()
        self.topics_ready = (
            TopicsReady(topics, self.kafka_admin, wait_s=topics_wait_s) if make_topics else None
        )

    @staticmethod
    def _configure(conn) -> None:
        conn.execute(_q()["gateway_role"])

    def answer_with_topics(
        self, response: Response, *, tenants: Iterable[str] = (), jobs: Iterable[dict] = ()
    ) -> Response:
        """`response` to a call that made these tenants or jobs (its transaction
        committed), once their topics exist (topics_ready.py; when this gateway
        makes them)."""
        if self.topics_ready is not None and response.status_code < 300:
            self.topics_ready.make(tenants, jobs)
        return response

    def close(self) -> None:
        self.pool.close()
        self.destinations.close()
        with self._admin_lock:
            self._admin = None  # librdkafka handles close when collected

    # -- requests ------------------------------------------------------------
    def as_tenant(
        self, who: Caller, fn: Callable[[Tx], Any], status: int = 200, *, pipeline: bool = False
    ) -> Response:
        """`pipeline`: for handlers whose store calls read every answer they need
        (the worker protocol); cursors of a pipeline know no rowcount until read."""
        with (
            self.pool.connection() as conn,
            pipelined_transaction(conn) if pipeline else conn.transaction() as tx_or_pipeline,
        ):
            tenant = self.authenticate(
                conn,
                who.token,
                tx_or_pipeline if pipeline else None,
                write=who.request is not None and who.request.method not in READS,
            )
            if tenant is None:
                raise unauthenticated("unknown or revoked key")
            tx = Tx(conn, tenant, self.clock())
            return self._execute(tx, who, tenant["tenant_id"], fn, status)

    @staticmethod
    def authenticate(conn, token: str, pipeline=None, *, write: bool = False) -> dict | None:
        """The key's tenant, with the transaction scoped to it; None (and a scope
        that matches no tenant) for an unknown or revoked key. A `write` also
        takes the tenant's write fence and is refused (503, Retry-After) unless
        the tenant is active in this cell: a move freezing it waits for the
        writes in flight, and a write after the freeze is refused here, in its
        own transaction (docs/cells.md, "Moving a tenant"). In a pipeline the
        fence goes out with the key check (a pipeline of its own when the
        transaction is not one): no round trip more."""
        own = conn.pipeline() if write and pipeline is None else contextlib.nullcontext(pipeline)
        state = None
        with own as batch:
            cur = conn.execute(_q()["authenticate"], {"hash": hash_key(token)})
            if write:
                conn.execute(_q()["write_fence"])
                state = conn.execute(_q()["scope_state"])
            if batch is not None:
                batch.sync()
        row = cur.fetchone()
        if row is None:
            return None
        if state is not None and (st := state.fetchone()) is not None and st[0] != "active":
            raise Problem(
                503,
                "TENANT_MOVING",
                f"tenant {row[0]} is being moved to another cell; retry",
                headers={"Retry-After": "1"},
            )
        return {"tenant_id": row[0], "name": row[1], "cell": row[2], "priority_classes": row[3]}

    def as_operator(self, who: Caller, fn: Callable[[Tx], Any], status: int = 200) -> Response:
        with self.pool.connection() as conn, conn.transaction():
            if not who.operator:
                if self.authenticate(conn, who.token) is None:
                    raise unauthenticated("unknown or revoked key")
                raise Problem(403, "FORBIDDEN", "this needs the operator key")
            conn.execute(_q()["operator_role"])
            tx = Tx(conn, None, self.clock())
            return self._execute(tx, who, OPERATOR_SCOPE, fn, status)

    def as_anyone(self, who: Caller, fn: Callable[[], Any]) -> Response:
        """For reads that touch no tenant data (schedule preview): any valid key."""
        if not who.operator:
            with self.pool.connection() as conn, conn.transaction():
                if self.authenticate(conn, who.token) is None:
                    raise unauthenticated("unknown or revoked key")
        return respond(200, dumps(fn()))

    def _execute(self, tx: Tx, who: Caller, scope: str, fn, status: int) -> Response:
        req = who.idempotent_request()
        if req is None:
            status, result = _unwrap(status, fn(tx))
            return respond(status, None if result is None else dumps(result))
        stored = idempotency.begin(tx.conn, scope, req, tx.now)
        if stored is not None:
            response = respond(stored.status, stored.body)
            response.headers["Idempotent-Replayed"] = "true"
            if hidden := idempotency.not_shown(stored.body):
                response.headers[idempotency.NOT_SHOWN_HEADER] = hidden
            return response
        headers: dict[str, str] = {}
        try:
            with tx.conn.transaction():
                status, result = _unwrap(status, fn(tx))
            text = None if result is None else dumps(result)
        except problems.REQUEST_ERRORS as e:
            status, doc, headers = problems.from_exception(e)
            text = dumps(doc)
        idempotency.record(tx.conn, scope, req, status, text)
        response = respond(status, text)
        response.headers.update(headers)
        return response

    # -- readiness -----------------------------------------------------------
    def check_database(self) -> None:
        with self.pool.connection(timeout=2.0) as conn:
            conn.execute(_q()["ping"])

    def kafka_admin(self):
        """The gateway's one admin client (readiness, growing topics), made on first use."""
        from cronwheel.kafka import admin

        with self._admin_lock:
            if self._admin is None:
                self._admin = admin(self.bootstrap, principal="gateway")
            return self._admin

    def check_kafka(self) -> None:
        md = self.kafka_admin().list_topics(timeout=2.0)
        if not md.brokers:
            raise RuntimeError("no Kafka broker answered")


def _unwrap(status: int, result: Any) -> tuple[int, Any]:
    return (result.status, result.body) if isinstance(result, Reply) else (status, result)
