"""The worker loop: consume a queue topic, StartRun, heartbeat while the handler
runs, CompleteRun with its outcome.

Three threads carry a worker's traffic, each one request at a time with
whatever queued while the previous one was out: the starter (start-batch, as
many of the records read as there are free handler slots), the completer
(complete-batch) and the heartbeats (api.py, completer.py, heartbeats.py). Per
run that is a share of two requests instead of two requests and a thread.
The consumer's poll loop only reads: it used to send the start-batch itself,
and every record that arrived meanwhile waited in librdkafka's queue for that
request's answer (tens of milliseconds on a busy gateway) before this worker
even looked at it; now it is read at once and goes in the next start-batch.

A record's offset is committed once StartRun answered (won, or refused because
another worker has it or it is stale): from then on the platform tracks the run,
and if this process dies the lease expires and the run comes back as the next
attempt. Offsets are committed in order per partition (OffsetTracker), so a
crash never skips a record whose run was not started.

A record whose run is not due yet (NOT_RUNNABLE before its instant: a clock
ahead of the gateway's, a record read early) is not dropped: it waits aside
and is started again after its instant (`_later`), while the records behind it
go on; its offset stays uncommitted meanwhile, so a crash reads it again. A
record lost anyway is announced again by the platform once the run's pending
deadline passes (docs/pending-deadline.md).

A worker follows its tenant when a move takes it to another cell
(docs/workers.md, "When the tenant moves"): every `follow_every_s` it asks
the API which cell serves the tenant (GET /v1/tenant); when that changes, it
reads the old broker's records to the end (the source published its last
before the flip) and starts each of their runs, which the API now serves
from the new cell, then consumes the same topic on the new cell's broker
with the same credentials (the move carried them).

A consumer that librdkafka leaves stuck after a broker restart (partitions
assigned and never started, or out of its group with the coordinator never
found again) is replaced by a new one (watchdog.py says when), with a
warning that says why.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

# The codec, the records and the offset tracker only: a customer's worker
# installs confluent-kafka and fastavro and nothing of the platform (no metrics,
# no database driver, no web framework); `make lint` holds this (import-linter).
from cronwheel.core.avro import UndecodableRecord, default_registry
from cronwheel.core.offsets import OffsetTracker
from cronwheel.sdk.api import Stopping, WorkerApi
from cronwheel.sdk.completer import Completer
from cronwheel.sdk.heartbeats import Heartbeats
from cronwheel.sdk.watchdog import (
    ANSWERS,
    BROKER_SILENT,
    COORDINATOR_SILENT,
    STRANDED,
    ConsumerWatchdog,
    stranded,
)

log = logging.getLogger("cronwheel.sdk")

# Where `cronwheel up` runs Kafka, when neither `bootstrap` nor KAFKA_BOOTSTRAP
# says otherwise. The platform's cronwheel.config holds the same address; the
# SDK does not import it (tests/unit/test_sdk_imports.py checks they agree).
LOCAL_KAFKA_BOOTSTRAP = f"127.0.0.1:{os.environ.get('CRONWHEEL_KAFKA_PORT', '29092')}"
# Asynchronous offset commits from the poll loop at most this often: a commit
# per record cost the broker a commit per record at a trickle, and a record read
# again after a crash is answered ALREADY_STARTED or NOT_RUNNABLE.
COMMIT_EVERY_S = 0.2
# A record refused as not due yet is started again this long after its
# instant, then with the wait doubled while it is still refused (clocks that
# disagree), up to NOT_DUE_MAX_WAIT_S.
NOT_DUE_FIRST_WAIT_S = 0.1
NOT_DUE_MAX_WAIT_S = 30.0
# After a move, how often the poll loop checks whether the old broker's
# records are all read and started (a watermark request per partition).
FOLLOW_CHECK_EVERY_S = 0.5
# A consumer let go (a move, or stuck: watchdog.py) is closed in a thread of
# its own and not waited for longer: closing one whose group coordinator is
# gone can wait for it.
CLOSE_WAIT_S = 10.0

# A lost link ended, and made again soon after the network is back, as the
# platform's clients do (cronwheel.kafka.LOST_LINK_MS, which says why; the
# SDK does not import the platform, and a unit test keeps the two equal):
# a worker cut from the broker starts runs again seconds sooner after the
# heal (docs/reliability.md, "Connection attempts that see the heal").
LOST_LINK_MS = {
    "socket.timeout.ms": 15_000,
    "socket.connection.setup.timeout.ms": 10_000,
    "reconnect.backoff.max.ms": 2_000,
}


def kafka_security(username: str | None = None, password: str | None = None) -> dict:
    """The consumer's SASL settings: the tenant's Kafka credentials (returned
    once by `POST /v1/tenants`), from the arguments or else the environment
    (CRONWHEEL_KAFKA_USERNAME, CRONWHEEL_KAFKA_PASSWORD; the protocol, default
    SASL_PLAINTEXT with credentials, from CRONWHEEL_KAFKA_SECURITY_PROTOCOL,
    the mechanism, default SCRAM-SHA-512, from CRONWHEEL_KAFKA_SASL_MECHANISM,
    a CA bundle for TLS from CRONWHEEL_KAFKA_CA_FILE). None of them: no
    authentication (a broker without SASL)."""
    env = os.environ
    username = username or env.get("CRONWHEEL_KAFKA_USERNAME") or None
    password = password or env.get("CRONWHEEL_KAFKA_PASSWORD") or ""
    default = "SASL_PLAINTEXT" if username else "PLAINTEXT"
    conf = {"security.protocol": env.get("CRONWHEEL_KAFKA_SECURITY_PROTOCOL") or default}
    if username:
        conf["sasl.mechanism"] = env.get("CRONWHEEL_KAFKA_SASL_MECHANISM") or "SCRAM-SHA-512"
        conf["sasl.username"] = username
        conf["sasl.password"] = password
    if ca := env.get("CRONWHEEL_KAFKA_CA_FILE"):
        conf["ssl.ca.location"] = ca
    return conf


class Fail(Exception):
    """Raise from a handler to fail the attempt; `retryable=False` skips retries."""

    def __init__(self, message: str, retryable: bool = True, result: Any = None):
        super().__init__(message)
        self.retryable = retryable
        self.result = result


@dataclass
class Run:
    run_id: str
    attempt: int
    payload: Any
    scheduled_at: int  # UTC milliseconds
    priority: str
    job_id: str | None
    workflow_run_id: str | None
    node: str | None
    covers: list[int] | None
    start_token: str = ""
    lease_ms: int = 30_000
    # Set when the platform says this attempt is no longer ours (lease lost,
    # cancelled): a long handler may check it and stop early.
    lost: threading.Event = field(default_factory=threading.Event)
    # From RunReady v2 (docs/events.md); None in a v1 record (a producer of
    # v0.1.0 or before). The W3C traceparent to continue the run's trace
    # from (its trace id is the run's, its parent span the attempt's), and
    # the cell that fired the run.
    traceparent: str | None = None
    cell: str | None = None


class Worker:
    def __init__(
        self,
        topic: str,
        handler: Callable[[Run], Any],
        *,
        api_url: str | None = None,
        api_key: str | None = None,
        bootstrap: str | None = None,
        group_id: str | None = None,
        concurrency: int = 1,
        worker_id: str | None = None,
        drain_seconds: float = 30.0,
        consumer_config: dict | None = None,
        kafka_username: str | None = None,
        kafka_password: str | None = None,
        follow_every_s: float = 5.0,
        follow_drain_s: float = 60.0,
        watchdog: ConsumerWatchdog | None = None,
    ):
        self.topic = topic
        self.handler = handler
        self.api_url = (
            api_url or os.environ.get("CRONWHEEL_URL") or "http://127.0.0.1:8080"
        ).rstrip("/")
        self.api_key = api_key or os.environ.get("CRONWHEEL_API_KEY", "")
        self.bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP") or LOCAL_KAFKA_BOOTSTRAP
        self.group_id = group_id or f"cronwheel-worker.{topic}"
        self.concurrency = max(1, concurrency)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.drain_seconds = drain_seconds
        self.consumer_config = {
            **kafka_security(kafka_username, kafka_password),
            **(consumer_config or {}),
        }
        self._stop = threading.Event()
        self._offsets = OffsetTracker()
        self._committed_at = 0.0  # monotonic time of the poll loop's last commit
        self._active: dict[str, Run] = {}  # started and not yet handed to the completer
        self._running = 0  # handlers holding a slot
        self._active_lock = threading.Lock()
        # Read and begun in _offsets, not yet started; the poll loop appends, the
        # starter takes (under _cond, which also wakes the starter when a
        # handler slot frees).
        self._backlog: list[Message] = []
        # Records refused as not due yet: (monotonic time to start again, order,
        # record), a heap the starter moves to the backlog's head when due;
        # with the refusals each record has had, by (topic, partition, offset).
        self._later: list[tuple[float, int, Message]] = []
        self._not_due: dict[tuple[str, int, int], int] = {}
        self._seq = 0
        self._cond = threading.Condition(self._active_lock)
        self._api = WorkerApi(self.api_url, self.api_key, self._stop, 8)
        self.watchdog = watchdog or ConsumerWatchdog()  # when to replace a stuck consumer
        self._admin_of: tuple[str, AdminClient] | None = None  # (bootstrap, client): _admin
        self.completed = 0
        # Following a move: how often to ask the API for the tenant's cell (0:
        # never), the cell this worker consumes in (None until the API first
        # answers), and the cell it learnt the tenant moved to, with when: the
        # old broker is read to the end first, for at most `follow_drain_s`.
        self.follow_every_s = follow_every_s
        self.follow_drain_s = follow_drain_s
        self.cell: str | None = None
        self._moved_to: tuple[str, str] | None = None  # (cell, kafka_bootstrap)
        self._moved_at = 0.0
        self._follow_checked = 0.0
        self._follow_lock = threading.Lock()

    # -- lifecycle of the worker process ----------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """Consume until stop() or SIGTERM/SIGINT, then drain: finish what is held
        (or release it as a retryable failure after `drain_seconds`)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        consumer = self._consumer(self.bootstrap)
        if self.follow_every_s > 0:
            threading.Thread(
                target=self._following_loop, daemon=True, name="cronwheel-follow"
            ).start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="cronwheel-run")
        self._completer = Completer(self._api, self._answered)
        self._beats = Heartbeats(self._api)
        starter = threading.Thread(
            target=self._starting_loop, args=(pool,), daemon=True, name="cronwheel-start"
        )
        starter.start()
        paused = False
        try:
            while not self._stop.is_set():
                with self._cond:
                    # Read ahead up to two batches. Beyond that, wait a moment
                    # for the starter to take some; pause the partitions only
                    # when the handlers keep every slot longer (a paused
                    # partition fetches again once resumed: pausing around
                    # every start-batch halved a storm's rate).
                    self._cond.wait_for(self._room_or_stop, timeout=0.5)
                    room = 2 * self.concurrency - len(self._backlog)
                full = room <= 0
                if full != paused and (parts := consumer.assignment()):
                    (consumer.pause if full else consumer.resume)(parts)
                    paused = full
                read = []
                for msg in self._read(consumer, max(room, 1), 0.05):
                    if msg.error():
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", msg.error())
                            self.watchdog.error(msg.error().str())
                        continue
                    self._offsets.begin(msg.topic(), msg.partition(), msg.offset())
                    read.append(msg)
                if read:
                    with self._cond:
                        self._backlog += read
                        self._cond.notify_all()
                self._commit(consumer, force=False)
                if self._moved_to is not None and (moved := self._follow(consumer)):
                    consumer, paused = moved, False
                elif fresh := self._unstick(consumer):
                    consumer, paused = fresh, False
        finally:
            self._stop.set()  # also when the loop raised: the starter must end
            with self._cond:
                self._cond.notify_all()
            starter.join()
            self._drain(pool)
            self._commit(consumer)
            consumer.close()
            self._api.close()

    def _consumer(self, bootstrap: str) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 500,  # answered early when a record arrives
                # A crashed worker's partitions move to the others after 10 s.
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 2_000,
                **LOST_LINK_MS,
                "log_level": 3,
                **self.consumer_config,
            }
        )
        consumer.subscribe([self.topic], on_revoke=lambda c, parts: self._on_revoke(c, parts))
        return consumer

    # -- following the tenant to another cell ----------------------------------------
    def _following_loop(self) -> None:
        """Ask the API which cell serves the tenant, every `follow_every_s`;
        note a change for the poll loop (which switches brokers)."""
        while True:
            try:
                where = self._api.tenant()
            except Exception:  # asked again next time: following must not end the worker
                log.debug("could not ask for the tenant's cell", exc_info=True)
                where = None
            if where is not None:
                cell, bootstrap = where.get("cell"), where["kafka_bootstrap"]
                with self._follow_lock:
                    if self.cell is None:
                        self.cell = cell
                    elif cell != self.cell and (self._moved_to or (None,))[0] != cell:
                        log.info("the tenant moved to cell %s: finishing what is on %s first",
                                 cell, self.bootstrap)  # fmt: skip
                        self._moved_to = (cell, bootstrap)
                        self._moved_at = time.monotonic()
            if self._stop.wait(self.follow_every_s):
                return

    def _follow(self, consumer: Consumer) -> Consumer | None:
        """After a move: once every record of the old broker is read and its
        run started (or `follow_drain_s` passed: what is left is announced
        again in the new cell by its pending deadline), commit, close, and
        return a consumer of the new cell's broker; None meanwhile."""
        now = time.monotonic()
        if now - self._follow_checked < FOLLOW_CHECK_EVERY_S:
            return None
        self._follow_checked = now
        with self._follow_lock:
            cell, bootstrap = self._moved_to  # type: ignore[misc]
            late = now - self._moved_at > self.follow_drain_s
        if not late and not self._read_to_end(consumer):
            return None
        self._let_go(consumer)
        with self._follow_lock:
            log.info("consuming %s in cell %s (%s)%s", self.topic, cell, bootstrap,
                     "" if not late else ": the old broker was not read to the end")  # fmt: skip
            self.cell, self.bootstrap, self._moved_to = cell, bootstrap, None
        return self._consumer(bootstrap)

    def _let_go(self, consumer: Consumer) -> None:
        """Done with this consumer (the tenant moved, or it is stuck): commit
        what finished, close it (not waiting more than CLOSE_WAIT_S on a
        broker that does not answer), and drop what it read and did not
        start: its next owner reads it again, and nothing of its offsets may
        reach the next consumer's."""
        moved = self._offsets.committable()
        if moved:
            parts = [TopicPartition(t, p, off) for (t, p), off in moved.items()]
            try:
                consumer.commit(offsets=parts, asynchronous=False)
            except Exception as e:  # the old broker gone already
                log.info("last commit on %s skipped: %s", self.bootstrap, e)
        closing = threading.Thread(target=consumer.close, daemon=True, name="cronwheel-close")
        closing.start()
        closing.join(CLOSE_WAIT_S)
        with self._cond:
            self._backlog.clear()
            self._later.clear()
            self._not_due.clear()
            self._offsets = OffsetTracker()

    def _unstick(self, consumer: Consumer) -> Consumer | None:
        """A new consumer if this one is stuck for good (watchdog.py says when);
        None while it is not."""
        heard, detail = (
            self._ask(consumer)
            if self.watchdog.should_ask(bool(consumer.assignment()))
            else (None, "")
        )
        why = self.watchdog.replace(heard, detail)
        if why is None:
            return None
        log.warning("replacing the consumer of %s: %s", self.topic, why)
        self._let_go(consumer)
        return self._consumer(self.bootstrap)

    def _ask(self, consumer: Consumer) -> tuple[str, str]:
        """Whether the group's coordinator gives the topic's committed offsets
        and, asked to describe the group, shows this consumer in it as it
        should be (watchdog.ANSWERS), shows it stranded (STRANDED, with why),
        or gives no offsets (COORDINATOR_SILENT); or the broker gives not even
        the topic's metadata, to this consumer and to another client
        (BROKER_SILENT), or to this consumer only (STRANDED)."""
        try:
            meta = consumer.list_topics(self.topic, timeout=5).topics[self.topic]
            parts = [TopicPartition(self.topic, p) for p in meta.partitions]
        except KafkaException:
            # The broker down, or this consumer's own client wedged (seen
            # after a broker restart: not one log line, not one request):
            # a client of its own tells them apart.
            if not self._broker_answers():
                return BROKER_SILENT, ""
            return STRANDED, "the broker answers another client and not this consumer"
        try:
            refused = [tp.error for tp in consumer.committed(parts, timeout=5) if tp.error]
        except KafkaException as e:
            refused = [e]
        if refused:
            log.info("the group's coordinator does not answer: %s", refused[0])
            return COORDINATOR_SILENT, ""
        try:
            group = self._admin().describe_consumer_groups([self.group_id])[self.group_id]
            group = group.result(timeout=10)
        except Exception as e:  # noqa: BLE001 - an unanswered description judges nothing
            log.info("the group's coordinator did not describe %s: %s", self.group_id, e)
            self._admin_of = None  # a new client next time, in case this one is stuck
            return ANSWERS, ""
        members = {
            m.member_id: {
                tp.partition
                for tp in (m.assignment.topic_partitions if m.assignment else [])
                if tp.topic == self.topic
            }
            for m in group.members
        }
        why = stranded(group.state.name, members, consumer.memberid() or "", len(parts))
        return (STRANDED, why) if why else (ANSWERS, "")

    def _broker_answers(self) -> bool:
        """Whether the broker gives the topic's metadata to the worker's admin
        client or, when that one is stuck as well, to a new one."""
        for _ in range(2):
            try:
                self._admin().list_topics(self.topic, timeout=5)
                return True
            except KafkaException:
                self._admin_of = None
        return False

    def _admin(self) -> AdminClient:
        """An admin client of the broker this worker reads from, to ask its
        group's coordinator for the group's description (made once asked)."""
        if self._admin_of is None or self._admin_of[0] != self.bootstrap:
            admin = AdminClient(
                {"bootstrap.servers": self.bootstrap, "log_level": 3, **self.consumer_config}
            )
            self._admin_of = (self.bootstrap, admin)
        return self._admin_of[1]

    def _read_to_end(self, consumer: Consumer) -> bool:
        """Every record of this consumer's partitions read, and each one's run
        started (or refused): nothing waits in the backlog, aside or in the
        starter. A broker that no longer answers for them counts as read."""
        with self._cond:
            if self._backlog or self._later:
                return False
        if self._offsets.in_flight():
            return False
        parts = consumer.assignment()
        try:
            committed = None
            for tp in consumer.position(parts):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=5, cached=False
                )
                at = tp.offset
                if at < 0:  # nothing read here since assigned: where the group is
                    if committed is None:
                        committed = {
                            (c.topic, c.partition): c.offset
                            for c in consumer.committed(parts, timeout=5)
                        }
                    at = committed.get((tp.topic, tp.partition), -1)
                    at = at if at >= 0 else low
                if at < high:
                    return False
        except KafkaException as e:
            log.info("the old broker does not answer for %s (%s): switching", self.topic, e)
        return True

    @staticmethod
    def _read(consumer: Consumer, n: int, timeout: float) -> list[Message]:
        """Up to `n` records: wait up to `timeout` for the first, then take what is
        already fetched (consume() with a timeout would wait for all `n`)."""
        first = consumer.poll(timeout)
        if first is None:
            return []
        return [first, *consumer.consume(n - 1, 0)] if n > 1 else [first]

    def _free_slots(self) -> int:
        """Handler slots not taken; the caller holds _active_lock (_cond's lock)."""
        return self.concurrency - self._running

    def _room_or_stop(self) -> bool:
        return len(self._backlog) < 2 * self.concurrency or self._stop.is_set()

    def _starting_loop(self, pool: ThreadPoolExecutor) -> None:
        """The starter: as many records of the backlog as there are free slots, in
        one start-batch, until the worker stops (what is left is not started:
        its offsets stay uncommitted and the next consumer reads it again)."""
        while True:
            with self._cond:
                while True:
                    self._take_due_later()
                    if self._stop.is_set() or (self._backlog and self._free_slots() > 0):
                        break
                    wait = self._later[0][0] - time.monotonic() if self._later else None
                    self._cond.wait(wait)
                if self._stop.is_set():
                    return
                free = self._free_slots()
                batch, self._backlog = self._backlog[:free], self._backlog[free:]
                self._cond.notify_all()  # room for the poll loop
            self._start(batch, pool)

    def _take_due_later(self) -> None:
        """Move the records whose wait is over to the backlog's head (the
        caller holds _cond): they were read first."""
        now = time.monotonic()
        due = []
        while self._later and self._later[0][0] <= now:
            due.append(heapq.heappop(self._later)[2])
        if due:
            self._backlog[:0] = due

    def _retry_after_due(self, msg: Message, run: Run) -> None:
        """StartRun said the run is not due yet: start it again after its
        instant (by this clock), or after a wait that doubles with each refusal."""
        key = (msg.topic(), msg.partition(), msg.offset())
        tries = self._not_due.get(key, 0)
        self._not_due[key] = tries + 1
        wait = min(NOT_DUE_FIRST_WAIT_S * 2**tries, NOT_DUE_MAX_WAIT_S)
        until_due = run.scheduled_at / 1000 - time.time()
        with self._cond:
            self._seq += 1
            heapq.heappush(
                self._later, (time.monotonic() + max(until_due, 0) + wait, self._seq, msg)
            )
            self._cond.notify_all()

    def _drain(self, pool: ThreadPoolExecutor) -> None:
        """Records read but not started stay uncommitted (the next consumer reads
        them again); runs held get `drain_seconds` to finish, then are handed back."""
        with self._cond:
            self._backlog.clear()
            self._later.clear()
        deadline = time.monotonic() + self.drain_seconds
        while self._busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._active_lock:
            held = list(self._active.values())
            self._active.clear()
        for run in held:  # still running after the grace period: hand them back
            run.lost.set()
            self._complete(run, "FAILED", None, "worker stopped before the handler finished", True)
        self._completer.close(timeout=max(10.0, self.drain_seconds))
        self._beats.close()
        pool.shutdown(wait=False, cancel_futures=True)

    def _busy(self) -> bool:
        """Runs being handled."""
        with self._active_lock:
            return bool(self._active)

    def _on_revoke(self, consumer: Consumer, partitions) -> None:
        self._commit(consumer)
        gone = {(p.topic, p.partition) for p in partitions}
        with self._cond:
            self._backlog = [m for m in self._backlog if (m.topic(), m.partition()) not in gone]
            self._later = [x for x in self._later if (x[2].topic(), x[2].partition()) not in gone]
            heapq.heapify(self._later)
            self._not_due = {k: n for k, n in self._not_due.items() if k[:2] not in gone}
        for p in partitions:
            self._offsets.forget(p.topic, p.partition)

    def _commit(self, consumer: Consumer, force: bool = True) -> None:
        """Commit the offsets finished runs moved; unforced (the poll loop) at
        most every COMMIT_EVERY_S."""
        if not force:
            now = time.monotonic()
            if now - self._committed_at < COMMIT_EVERY_S:
                return
            self._committed_at = now
        moved = self._offsets.committable()
        if moved:
            parts = [TopicPartition(t, p, off) for (t, p), off in moved.items()]
            try:
                consumer.commit(offsets=parts, asynchronous=True)
            except Exception as e:  # no assignment any more: the next owner re-reads
                log.debug("commit skipped: %s", e)

    # -- records ---------------------------------------------------------------
    def _start(self, msgs: list[Message], pool: ThreadPoolExecutor) -> None:
        """StartRun for the records' runs in one request; each winner to a handler
        slot. Every record answered is finished in the offsets, won or not."""
        runs: list[tuple[Message, Run]] = []
        for msg in msgs:
            run = _decode(msg.value())
            if run is None:
                self._offsets.finish(msg.topic(), msg.partition(), msg.offset())
            else:
                runs.append((msg, run))
        if not runs:
            return
        try:
            answers = self._api.start_many(
                self.worker_id, [(r.run_id, r.attempt) for _m, r in runs]
            )
        except Stopping:
            return  # not started, not finished: the next consumer gets them again
        except Exception:
            log.exception("could not start %d runs; trying again", len(runs))
            self._stop.wait(1.0)
            with self._cond:
                self._backlog[:0] = [m for m, _r in runs]
            return
        for (msg, run), (status, body) in zip(runs, answers, strict=True):
            if _not_due_yet(status, body, run):
                self._retry_after_due(msg, run)  # not finished: its offset waits for it
                continue
            self._not_due.pop((msg.topic(), msg.partition(), msg.offset()), None)
            if status == 200:  # ALREADY_STARTED, NOT_RUNNABLE, STALE_ATTEMPT, gone: not ours
                run.attempt = body.get("attempt", run.attempt)
                run.start_token = body["start_token"]
                run.lease_ms = body.get("lease_ms", run.lease_ms)
                run.payload = body.get("payload", run.payload)
                with self._active_lock:
                    self._active[run.run_id] = run
                    self._running += 1
                pool.submit(self._execute, run)
            self._offsets.finish(msg.topic(), msg.partition(), msg.offset())

    def _execute(self, run: Run) -> None:
        self._beats.hold(run)
        try:
            try:
                result = self.handler(run)
                outcome, error, retryable = "SUCCEEDED", None, True
            except Fail as e:
                outcome, error, retryable, result = "FAILED", str(e), e.retryable, e.result
            except Exception as e:  # the handler's bug or a transient failure: retry
                outcome, error, retryable = "FAILED", f"{type(e).__name__}: {e}", True
                result = None
            finally:
                self._beats.release(run)
            with self._active_lock:
                still_ours = self._active.pop(run.run_id, None) is not None
            if still_ours:
                self._complete(run, outcome, result, error, retryable)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()  # a slot for the starter

    def _complete(
        self, run: Run, outcome: str, result: Any, error: str | None, retryable: bool
    ) -> None:
        body = {
            "run_id": run.run_id,
            "attempt": run.attempt,
            "start_token": run.start_token,
            "outcome": outcome,
        }
        if result is not None:
            body["result"] = result
        if error is not None:
            body["error"] = error
            body["retryable"] = retryable
        self._completer.submit(run, body)

    def _answered(self, run: Run, status: int) -> None:
        """The completer's callback (its one thread) for each completion answered."""
        if status == 200:
            self.completed += 1
        elif status:  # 409: the attempt was no longer ours (lease lost, drained)
            log.log(
                logging.DEBUG if status == 409 else logging.WARNING,
                "completion of %s answered %s", run.run_id, status,
            )  # fmt: skip


def _not_due_yet(status: int, body: Any, run: Run) -> bool:
    """A StartRun refusal because the run's instant has not come: NOT_RUNNABLE
    (which also answers a run that ended), saying so, or for a run whose
    instant is still ahead by this clock."""
    if status != 409 or not isinstance(body, dict) or body.get("code") != "NOT_RUNNABLE":
        return False
    return "not due" in str(body.get("detail", "")) or run.scheduled_at > time.time() * 1000


def _decode(value: bytes) -> Run | None:
    """The run a RunReady of any version announces, read as the newest version
    this SDK holds (a v1 record's traceparent and cell come out None)."""
    try:
        name, rec = default_registry().decode(value)
    except UndecodableRecord as e:
        log.error("skipping an undecodable record: %s", e.reason)
        return None
    if name != "RunReady":
        log.error("skipping a %s record on a queue topic", name)
        return None
    return Run(
        run_id=rec["run_id"], attempt=rec["attempt"], payload=json.loads(rec["payload"]),
        scheduled_at=rec["scheduled_at"], priority=rec["priority"], job_id=rec["job_id"],
        workflow_run_id=rec["workflow_run_id"], node=rec["node"], covers=rec["covers"],
        traceparent=rec.get("traceparent"), cell=rec.get("cell"),
    )  # fmt: skip
