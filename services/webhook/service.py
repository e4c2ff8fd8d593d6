"""The webhook service: consumes every tenant's webhook topic and, as the run's
worker (`webhook:<instance>`), makes the signed HTTP request and completes the
run with fencing.

One asyncio loop per process (uvloop when installed) with one shared HTTP/1.1
client (services/webhook/http.py; connections made by the SSRF guard,
guard.py). The Kafka consumer (confluent-kafka, as every other
service; docs/webhooks.md says why not faust) and the database (psycopg, the
same Lifecycle calls the gateway makes) run on their own threads. The
lifecycle calls of deliveries under way together share transactions
(database.py), the StartRuns of a group as one Lifecycle.start_many and the
CompleteRuns as one complete_many: each delivery still waits for its own
StartRun to commit before its request goes out and its offset may be committed.

Per record, in order:
1. Look the run up (batched per poll): skip it unless it is PENDING at the
   record's attempt, so duplicates and stale attempts cost no request.
2. Wait for admission (limits.py): a free slot of the endpoint, a breaker
   that is not open, and a free slot of the tenant (`tenant_slots`, so one
   tenant's hanging endpoints cannot take the service's `max_in_flight`).
   The run stays PENDING meanwhile: no lease, no attempt. Each record is a
   task of its own, so a record that waits holds back no other.
3. StartRun. From here the platform tracks the run, so the record's offset may
   be committed (in order per partition): a crash from now on ends in the
   lease expiring and the run coming back as its next attempt.
4. The request, heart-beating every lease/3 while it is out; a heartbeat that
   finds the attempt gone (cancelled, timed out) abandons the request.
5. Classify (delivery.py), tell the breaker, free the slot, CompleteRun with
   the result and, when Retry-After asked for longer than the backoff, the
   retry timer deferred in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge, Histogram
from psycopg import pq

try:
    import uvloop
except ImportError:  # pragma: no cover - a dependency; asyncio's loop does the same, slower
    uvloop = None

from cronwheel import consuming, kafka
from cronwheel.assignment import LeasedAssignment
from cronwheel.consumer import (
    NEW_TOPIC_FETCH_ERROR_BACKOFF_MS,
    QUIET,
    DeadLetters,
    Poison,
    expect_owned,
    shut_down,
    watch_fetching,
)
from cronwheel.consuming import TrackedOffsets
from cronwheel.core.clock import iso, now_ms
from cronwheel.core.errors import Conflict, NotFound
from cronwheel.core.events import traceparent
from cronwheel.core.runs import priority_rank
from cronwheel.core.ssrf import Network
from cronwheel.fetch_nudge import FetchNudge, ensurer
from cronwheel.fetch_watch import EndsAsked, FetchWatch
from cronwheel.kafka import Placement, Topics
from cronwheel.logs import run_fields
from cronwheel.store import webhooks
from cronwheel.store.db import Reconnecting
from cronwheel.store.leases import Leases
from cronwheel.store.lifecycle import NO_RUN, CompleteCall, Lifecycle, StartCall
from cronwheel.store.webhooks import DeliveryTarget
from cronwheel.topic_watch import TopicWatch
from services.webhook import delivery, signing
from services.webhook.breaker import State
from services.webhook.database import Database, Stopping
from services.webhook.guard import Guard
from services.webhook.http import Client, Response
from services.webhook.limits import Endpoints, Slots, TenantSlots, admit, endpoint_of

log = logging.getLogger("cronwheel.webhook")

CONSUMER = "webhook"
USER_AGENT = "cronwheel-webhook/1"
# The job's headers may not replace these: the signature, the fencing headers,
# and what framing the HTTP client owns.
RESERVED = ("webhook-", "cronwheel-")
FRAMING = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
)

DELIVERIES = PromCounter(
    "cronwheel_webhook_deliveries_total",
    "Webhook delivery attempts by outcome (succeeded, retry, failed, refused, abandoned)",
    ["outcome"],
)
SKIPPED = PromCounter(
    "cronwheel_webhook_skipped_total",
    "Webhook records not delivered: run not PENDING at that attempt, or StartRun refused",
    ["reason"],
)
DELIVERY_SECONDS = Histogram(
    "cronwheel_webhook_request_seconds",
    "From sending a webhook request to its response or error",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
BREAKER_CHANGES = PromCounter(
    "cronwheel_webhook_breaker_transitions_total", "Circuit breaker state changes", ["to"]
)
WAITING = Gauge("cronwheel_webhook_waiting_runs", "Runs held back by an endpoint limit or breaker")
# No tenant label (docs/observability.md: the metrics carry none); the log line
# of a tenant reaching its cap names it (_tenant_full).
TENANT_WAITING = Gauge(
    "cronwheel_webhook_tenant_waiting_runs",
    "Runs held back because their tenant's slots are in use",
)
TENANTS_AT_CAP = Gauge(
    "cronwheel_webhook_tenants_at_cap", "Tenants with every delivery slot of theirs in use"
)
OPEN_BREAKERS = Gauge("cronwheel_webhook_open_breakers", "Endpoints whose breaker is not closed")


@dataclass(frozen=True)
class Settings:
    """Tunables, with their defaults; main.py's TuningSettings reads
    CRONWHEEL_WEBHOOK_<NAME> for each field."""

    per_endpoint: int = 16  # concurrent deliveries to one scheme://host:port
    max_in_flight: int = 512  # concurrent deliveries in all
    tenant_slots: int = 64  # concurrent deliveries of one tenant (admission to response)
    breaker_failures: int = 5  # consecutive failures that open a breaker
    breaker_cooldown_ms: int = 30_000  # open this long before a half-open probe
    connect_timeout_ms: int = 5_000
    default_timeout_ms: int = 30_000  # the whole request, unless the target says
    max_response_bytes: int = 64 * 1024  # read at most this much of a response
    retry_after_cap_ms: int = 3_600_000
    db_workers: int = 2  # connections for lifecycle groups (more: wall time vs PG CPU)
    db_group: int = 128  # at most this many lifecycle calls in one transaction (<= 128)
    batch: int = 500
    max_waiting_per_partition: int = 1000  # then the partition is paused
    shutdown_grace_ms: int = 10_000
    keepalive_ms: int = 30_000
    # Partitions held and not read for this long though the broker has
    # records for them: new Kafka clients (cronwheel.fetch_watch); 0: never.
    fetch_watch_ms: int = 15_000


class WebhookService:
    name = "webhook"  # run_restarting's
    log = log

    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        topics: Topics,
        *,
        instance: str | None = None,
        allow: Sequence[Network] = (),  # beyond public addresses (core/ssrf.py)
        settings: Settings | None = None,
        group_id: str | None = None,
    ):
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.topics = topics
        self.instance = instance or secrets.token_hex(4)
        self.worker_id = f"webhook:{self.instance}"
        self.allow = list(allow)
        self.settings = settings or Settings()
        self.group_id = group_id or f"{topics.prefix}.webhook"
        self.lifecycle = Lifecycle(topics)
        self.counts: Counter[str] = Counter()  # outcomes, for tests and the bench
        self.endpoints: Endpoints | None = None
        self.tenants: TenantSlots | None = None

    # -- the loop -------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        if uvloop is not None:  # less CPU per request than asyncio's loop (docs/webhooks.md)
            uvloop.run(self._main(stop))
        else:
            asyncio.run(self._main(stop))

    async def _main(self, stop: threading.Event) -> None:
        s = self.settings
        self._loop = asyncio.get_running_loop()
        self._kafka_thread = ThreadPoolExecutor(1, thread_name_prefix="webhook-kafka")
        self._db = Database(self.dsn, s.db_workers, stop, s.db_group)
        self._db.warm(self._warm)
        self.endpoints = Endpoints(
            s.per_endpoint,
            s.breaker_failures,
            s.breaker_cooldown_ms / 1000,
            on_change=_breaker_moved,
        )
        self._slots = Slots(s.max_in_flight)
        self.tenants = TenantSlots(s.tenant_slots, self._tenant_full)
        self._full_logged: dict[str, float] = {}
        # Deliveries finish out of order: an offset moves past finished ones only.
        self._offsets = TrackedOffsets(CONSUMER)
        self._unfinished: Counter[tuple[str, int]] = Counter()
        self._paused: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._waiting: set[asyncio.Task] = set()
        self._active: set[tuple[str, int]] = set()
        self._producer = kafka.producer(self.bootstrap, principal="webhook")
        self._dead_letters = DeadLetters(
            self._producer, self.topics.dead_letter, CONSUMER, log, self._make_topic
        )
        # Webhook topics by name, announced by the dispatcher when it creates
        # one; read are those of the tenants whose partitions this instance
        # leases (cronwheel.assignment), renewed on the Kafka thread through a
        # connection of its own.
        self._stop = stop
        # Ends the consumer's fetch around an assignment, so a new tenant's
        # first record is fetched at once (cronwheel.fetch_nudge), and when a
        # topic is announced, so it is assigned at once.
        self._fetch_nudge = FetchNudge(
            self.topics.nudge(CONSUMER), self._producer, ensurer(self.bootstrap, CONSUMER)
        )
        self._watch = TopicWatch(
            self.dsn,
            self._producer,
            f"{self.topics.prefix}.webhook.",
            on_change=self._fetch_nudge.wake,
            wake_on_announce=True,
        )
        self._assignment = LeasedAssignment(
            Leases(self.group_id),
            f"{self.topics.prefix}.webhook.",
            Placement(self._producer),
            end_fetch=self._fetch_nudge.nudge,
        )
        self._lease_db = Reconnecting(self.dsn, log)
        # Its consumer is assigned by hand, whose partitions librdkafka was
        # seen to stop fetching: run() then ends with ClientsWedged
        # (cronwheel.fetch_watch; main.py's run_restarting).
        every_s = s.fetch_watch_ms / 1000
        self._fetch_watch = FetchWatch(every_s) if every_s else None
        self._asker = kafka.RenewingAsker(  # made when asked
            self.bootstrap, principal=CONSUMER, group=f"{self.group_id}.ask"
        )
        self._ends_asked = EndsAsked(self._asker.end_offsets)  # off the Kafka thread
        self._client = Client(
            Guard(self.allow),
            keepalive_s=s.keepalive_ms / 1000,
            headers={"user-agent": USER_AGENT},
        )
        try:
            consumer = await self._kafka(self._subscribe)
        except BaseException:
            await self._close_clients()
            raise
        next_sweep = time.monotonic()
        try:
            while not stop.is_set():
                msgs = await self._kafka(self._consume, consumer)
                if msgs:
                    try:
                        await self._accept(msgs)
                    except Stopping:  # the database is away and we are asked to stop
                        break
                await self._kafka(self._housekeeping, consumer, self._pause_plan())
                now = time.monotonic()
                if now >= next_sweep:
                    self._client.sweep()
                    next_sweep = now + 5
                WAITING.set(self.endpoints.waiting())
                TENANT_WAITING.set(self.tenants.waiting())
                TENANTS_AT_CAP.set(self.tenants.full())
                OPEN_BREAKERS.set(self.endpoints.open_count())
        finally:
            await self._shutdown(consumer)

    async def _kafka(self, fn, *args):
        """Every consumer call on one thread: confluent-kafka blocks, the loop must not."""
        return await self._loop.run_in_executor(self._kafka_thread, fn, *args)

    def _make_topic(self, name: str) -> None:
        """The dead-letter topic, where it does not exist yet (its ACLs allow it)."""
        kafka.ensure_topics([name], bootstrap=self.bootstrap, principal=CONSUMER)
        log.info("%s made before the first dead letter (or there already)", name)

    def _subscribe(self) -> Consumer:
        self._consumer = kafka.consumer(
            self.group_id,
            self.bootstrap,
            principal=CONSUMER,
            on_commit=self._offsets.on_commit,
            # New tenants' topics are assigned as they are made (cronwheel.consumer).
            **{"fetch.error.backoff.ms": NEW_TOPIC_FETCH_ERROR_BACKOFF_MS},
        )
        self._fetch_nudge.start(self._consumer)
        return self._consumer

    def _consume(self, consumer: Consumer) -> list[Message]:
        """Block briefly for one record, then take what else is there; first,
        bring the assignment up to date (new webhook topics, moved leases)."""
        give_up = self._give_up
        if (
            self._assignment.follow(consumer, self._watch, self._lease_db, self._stop, give_up)
            is None
        ):
            return []  # stopping while the database is away
        return self._fetch_nudge.drop(
            consuming.take(consumer, self.settings.batch, 0.1, 0.002, QUIET)
        )

    # -- records in ------------------------------------------------------------

    async def _accept(self, msgs: list[Message]) -> None:
        wanted: list[tuple[tuple[str, int, int], dict, Message]] = []
        for m in msgs:
            where = (m.topic(), m.partition(), m.offset())
            self._offsets.begin(*where)
            self._unfinished[where[:2]] += 1
            try:
                wanted.append((where, self._decode(m), m))
            except Poison as p:
                self._dead_letter(m, where, p)
        if not wanted:
            return
        targets = await self._db.call(
            webhooks.delivery_targets, [rec["run_id"] for _w, rec, _m in wanted], now_ms()
        )
        for where, rec, m in wanted:
            target = targets.get(rec["run_id"])
            reason = _skip_reason(rec, target)
            key = (rec["run_id"], rec["attempt"])
            if reason is None and key in self._active:
                reason = "duplicate"
            if reason is not None:
                SKIPPED.labels(reason).inc()
                self.counts[f"skipped:{reason}"] += 1
                self._finish(where)
                continue
            self._active.add(key)
            rank = priority_rank(rec.get("priority"))
            task = asyncio.create_task(self._deliver(where, target, m, rank))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(lambda _t, key=key: self._active.discard(key))

    def _decode(self, m: Message) -> dict:
        return expect_owned(m, "RunReady", self.topics.webhook)

    def _warm(self, conn) -> None:
        """A delivery's statements, once on each new connection (Database.warm)."""
        webhooks.delivery_targets(conn, [NO_RUN], now_ms())
        self.lifecycle.warm(conn, self.worker_id, now_ms())

    def _dead_letter(self, m: Message, where: tuple[str, int, int], p: Poison) -> None:
        self._dead_letters.count(p)

        def on_delivery(err, _msg):
            if err is None:  # only then may its offset be committed
                self._loop.call_soon_threadsafe(self._finish, where)
            else:
                log.error("dead letter for %s[%d]@%d not written: %s", *where, err)

        self._dead_letters.produce(m, p, on_delivery)

    def _finish(self, where: tuple[str, int, int]) -> None:
        self._offsets.finish(*where)
        tp = where[:2]
        if self._unfinished.get(tp, 0) > 0:
            self._unfinished[tp] -= 1

    # -- one delivery ------------------------------------------------------------

    async def _deliver(
        self, where: tuple[str, int, int], t: DeliveryTarget, m: Message, rank: int
    ) -> None:
        task = asyncio.current_task()
        self._waiting.add(task)
        try:
            permit = await admit(
                self.endpoints, self.tenants, endpoint_of(t.target["url"]), t.tenant_id, rank
            )
        finally:
            self._waiting.discard(task)
        result: str | None = None
        hold_s = 0.0
        try:
            async with self._slots.held(rank):
                try:
                    started = await self._db.submit_many(self._start_many, t)
                except Stopping:
                    raise
                except Exception as exc:  # not a refusal: a bug, or data this run cannot pass
                    log.exception(
                        "StartRun of %s failed; setting its record aside",
                        t.run_id,
                        extra=run_fields(tenant_id=t.tenant_id, run_id=t.run_id, attempt=t.attempt),
                    )
                    # Its offset must not hold back the partition's: the record
                    # goes to the dead-letter topic, as an undecodable one would.
                    reason = f"StartRun failed: {type(exc).__name__}: {exc}"
                    self._dead_letter(m, where, Poison("start_failed", reason[:1000]))
                    return
                self._finish(where)
                if isinstance(started, str):  # refused: another worker has it, or stale
                    SKIPPED.labels(started).inc()
                    self.counts[f"skipped:{started}"] += 1
                    return
                attempt = await self._attempt(t, started)
                if attempt is None:  # the attempt was taken from us mid-request
                    return
                outcome, run_result = attempt
                result = outcome.breaker
                if outcome.retry_after_ms:
                    hold_s = outcome.retry_after_ms / 1000
                permit.release(result, hold_s)
                await self._db.submit_many(self._complete_many, (t, started, outcome, run_result))
        except Stopping:
            pass
        except Exception:
            log.exception(
                "delivering run %s failed",
                t.run_id,
                extra=run_fields(tenant_id=t.tenant_id, run_id=t.run_id, attempt=t.attempt),
            )
        finally:
            permit.release(result, hold_s)

    def _tenant_full(self, tenant_id: str) -> None:
        """A tenant's deliveries wait for its slots: one line per tenant a minute
        at most (the gauges carry no tenant id)."""
        now = time.monotonic()
        last = self._full_logged.get(tenant_id)
        if last is not None and now - last < 60:
            return
        if len(self._full_logged) >= 10_000:
            self._full_logged.clear()
        self._full_logged[tenant_id] = now
        log.info(
            "tenant %s has all %d of its delivery slots in use; its runs wait",
            tenant_id,
            self.settings.tenant_slots,
            extra=run_fields(tenant_id=tenant_id),
        )

    def _start(self, conn, t: DeliveryTarget) -> dict | str:
        """StartRun's answer, or the code it refused with (lower case)."""
        answer = self._start_many(conn, [t])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _start_many(self, conn, targets: list[DeliveryTarget]) -> list[dict | str | Exception]:
        """StartRun for each target in one batch: its answer, the code it was
        refused with (lower case), or the exception it met (ValidationError)."""
        calls = [StartCall(t.tenant_id, t.run_id, self.worker_id, t.attempt) for t in targets]
        return [
            a.code.lower() if isinstance(a, Conflict | NotFound) else a
            for a in self.lifecycle.start_many(conn, calls, now_ms())
        ]

    async def _attempt(
        self, t: DeliveryTarget, started: dict
    ) -> tuple[delivery.Outcome, dict] | None:
        """Sign and send, heart-beating while the request is out."""
        if not t.secrets:
            outcome = delivery.no_secret()
            DELIVERIES.labels("refused").inc()
            self.counts["refused"] += 1
            return outcome, delivery.error_result(outcome, 0)
        s = self.settings
        target = t.target
        method = target.get("method", "POST")
        body = b"" if method == "GET" else t.payload.encode()
        total_ms = target.get("timeout_ms") or s.default_timeout_ms
        if t.timeout_ms:
            total_ms = min(total_ms, t.timeout_ms)
        headers = self._headers(t, started, body)
        request = asyncio.create_task(self._request(method, target["url"], headers, body, total_ms))
        every = max(0.2, started["lease_ms"] / 3000)
        try:
            while True:
                done, _ = await asyncio.wait({request}, timeout=every)
                if done:
                    break
                if not await self._db.submit(self._heartbeat, t, started):
                    request.cancel()
                    DELIVERIES.labels("abandoned").inc()
                    self.counts["abandoned"] += 1
                    return None
        finally:
            if not request.done():
                request.cancel()
                await asyncio.gather(request, return_exceptions=True)
        got, duration_ms = request.result()
        DELIVERY_SECONDS.observe(duration_ms / 1000)
        if isinstance(got, Response):
            outcome = delivery.classify_status(
                got.status, got.headers.get("retry-after"), now_ms(), s.retry_after_cap_ms
            )
            result = delivery.response_result(
                got.status, got.headers, got.body, got.truncated, duration_ms,
                outcome.retry_after_ms,
            )  # fmt: skip
        else:
            outcome = delivery.classify_error(got, total_ms)
            result = delivery.error_result(outcome, duration_ms)
        label = _label(outcome)
        DELIVERIES.labels(label).inc()
        self.counts[label] += 1
        return outcome, result

    def _headers(self, t: DeliveryTarget, started: dict, body: bytes) -> dict[str, str]:
        headers = {"content-type": "application/json"} if body else {}
        for name, value in (t.target.get("headers") or {}).items():
            low = name.lower()
            if low in FRAMING or low.startswith(RESERVED):
                continue
            headers[low] = value
        headers.update(signing.headers(t.secrets, t.run_id, int(time.time()), body))
        headers["cronwheel-run-id"] = t.run_id
        headers["cronwheel-attempt"] = str(started["attempt"])
        headers["cronwheel-fencing-token"] = started["start_token"]
        headers["cronwheel-scheduled-at"] = iso(t.scheduled_ms)
        # The run's W3C trace (docs/events.md, "The traceparent rule"): the
        # endpoint's spans join the run's trace, this attempt their parent.
        headers["traceparent"] = traceparent(t.run_id, started["attempt"])
        if t.job_id:
            headers["cronwheel-job-id"] = t.job_id
        return headers

    async def _request(
        self, method: str, url: str, headers: dict, body: bytes, total_ms: int
    ) -> tuple[Response | BaseException, int]:
        """The HTTP exchange under the total timeout, reading at most
        max_response_bytes of the body: the response or the error, and the ms."""
        s = self.settings
        total_s = total_ms / 1000
        t0 = time.monotonic()
        try:
            got = await self._client.request(
                method,
                url,
                headers,
                body,
                timeout_s=total_s,
                connect_timeout_s=min(s.connect_timeout_ms / 1000, total_s),
                max_body=s.max_response_bytes,
            )
        except Exception as exc:  # classified by delivery.classify_error
            got = exc
        return got, int((time.monotonic() - t0) * 1000)

    def _heartbeat(self, conn, t: DeliveryTarget, started: dict) -> bool:
        try:
            self.lifecycle.heartbeat(
                conn, t.tenant_id, t.run_id, started["attempt"], started["start_token"], now_ms()
            )
            return True
        except (Conflict, NotFound):
            return False

    def _complete(self, conn, t: DeliveryTarget, started, outcome: delivery.Outcome, result):
        answer = self._complete_many(conn, [(t, started, outcome, result)])[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _complete_many(self, conn, items: list[tuple]) -> list[dict | None | Exception]:
        """CompleteRun for each (target, started, outcome, result) in one batch;
        an attempt that ended meanwhile (its lease or timeout timer, a cancel)
        answers None. A Retry-After longer than the backoff defers the retry
        timer in the same transaction."""
        now = now_ms()
        calls = [
            CompleteCall(
                t.tenant_id, t.run_id, started["attempt"], started["start_token"],
                outcome.outcome, result, outcome.error, outcome.retryable,
            )
            for t, started, outcome, result in items
        ]  # fmt: skip
        deferring = any(outcome.retry_after_ms for _t, _s, outcome, _r in items)
        idle = conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        with conn.transaction() if deferring and idle else contextlib.nullcontext():
            answers = self.lifecycle.complete_many(conn, calls, now)
            for (t, started, outcome, _r), done in zip(items, answers, strict=True):
                if (
                    outcome.retry_after_ms
                    and isinstance(done, dict)
                    and done["state"] == "RETRY_WAIT"
                ):
                    webhooks.defer_retry(
                        conn, t.run_id, started["attempt"], now + outcome.retry_after_ms
                    )
        out: list[dict | None | Exception] = []
        for (t, started, _o, _r), done in zip(items, answers, strict=True):
            if isinstance(done, Conflict | NotFound):
                log.info(
                    "completing run %s attempt %s: %s",
                    t.run_id,
                    started["attempt"],
                    done,
                    extra=run_fields(
                        tenant_id=t.tenant_id, run_id=t.run_id, attempt=started["attempt"]
                    ),
                )
                done = None
            out.append(done)
        return out

    # -- offsets, pausing, shutdown ---------------------------------------------

    def _pause_plan(self) -> tuple[set, set]:
        """Partitions to pause (too many records waiting) and to resume (half way back)."""
        cap = self.settings.max_waiting_per_partition
        over = {tp for tp, n in self._unfinished.items() if n >= cap and tp not in self._paused}
        under = {tp for tp in self._paused if self._unfinished.get(tp, 0) < cap // 2}
        self._paused = (self._paused | over) - under
        return over, under

    def _housekeeping(self, consumer: Consumer, plan: tuple[set, set]) -> None:
        pause, resume = plan
        if pause:
            consumer.pause([TopicPartition(t, p) for t, p in pause])
        if resume:
            consumer.resume([TopicPartition(t, p) for t, p in resume])
        self._producer.poll(0)
        self._offsets.commit(consumer, asynchronous=True, assigned=self._assignment.assigned)
        self._offsets.report_lag(consumer, assigned=self._assignment.assigned)
        if self._fetch_watch is not None:
            watch_fetching(
                self._fetch_watch,
                lambda: [key for key in self._assignment.assigned if key not in self._paused],
                lambda keys: consuming.positions(consumer, keys),
                self._ends_asked,
            )

    def _give_up(self, partitions: list[TopicPartition]) -> None:
        """A lease moved: commit what this instance finished of these partitions,
        then forget them; deliveries still waiting go on (StartRun lets only
        one instance win)."""
        self._offsets.give_up(self._consumer, partitions)

    async def _shutdown(self, consumer: Consumer) -> None:
        """Runs not yet started are dropped (their records come again); started
        ones get `shutdown_grace_ms` to finish, then their leases bring them back."""
        for task in list(self._waiting):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.settings.shutdown_grace_ms / 1000)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self._kafka(self._close_consumer, consumer)
        finally:
            await self._close_clients()

    async def _close_clients(self) -> None:
        self._kafka_thread.shutdown(wait=True)
        self._ends_asked.close()
        self._client.close()
        await self._loop.run_in_executor(None, self._db.close)

    def _close_consumer(self, consumer: Consumer) -> None:
        self._producer.flush(self.settings.shutdown_grace_ms / 1000)
        shut_down(consumer, self._offsets, self._lease_db, self._assignment, self._watch)
        self._lease_db.close()


def _skip_reason(rec: dict, t: DeliveryTarget | None) -> str | None:
    if t is None or t.tenant_id != rec["tenant_id"]:
        return "unknown_run"
    if t.state != "PENDING":
        return "not_pending"
    if t.attempt != rec["attempt"]:
        return "stale_attempt"
    if t.target.get("type") != "webhook" or not t.target.get("url"):
        return "not_webhook"
    return None


def _label(outcome: delivery.Outcome) -> str:
    if outcome.outcome == "SUCCEEDED":
        return "succeeded"
    if outcome.breaker is None and not outcome.retryable:
        return "refused"
    return "retry" if outcome.retryable else "failed"


def _breaker_moved(endpoint: str, before: State, after: State) -> None:
    BREAKER_CHANGES.labels(after.value).inc()
    log.info("breaker of %s: %s -> %s", endpoint, before.value, after.value)
