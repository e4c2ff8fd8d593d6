"""The workflow service: consumes RunCompleted and moves workflow runs on.

For each record of a workflow node, Workflows.complete_node records the run as
processed, sets the node's state and creates the runs of the children whose
last parent just succeeded, or fails the workflow run and skips what lies below
a failed node, all in one transaction: the records of one consumed batch share
it (one commit), each in a savepoint of its own. Offsets are committed only
after that transaction, so a crash in between (kill -9 included) means the
records come again and are found already processed: exactly one effect per
completion.
Records of plain job runs are skipped without touching the database. Records
that cannot be decoded or applied go to the dead-letter topic (acknowledged
before their offset is committed) and are counted: a poison record never
stalls its partition.

A confluent-kafka loop rather than a faust-streaming agent: measured here
(bench/bench_workflows.py), faust's consumer hop took 9-10 ms at p50 and 25-34
ms at p99 against 0-1 ms and 8 ms, needed 2 s rather than 0.5 s to start
consuming, and would run the blocking database transaction on its event loop
(docs/workflows.md has the figures).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import Counter

from cronwheel import consuming, kafka, metrics
from cronwheel.core.avro import UndecodableRecord, default_registry
from cronwheel.core.clock import now_ms
from cronwheel.kafka import Topics
from cronwheel.store.db import Reconnecting
from cronwheel.store.dispatch import Processed, Pruner, retention_ms
from cronwheel.store.workflows import CONSUMER, NodeStep, Workflows

log = logging.getLogger("cronwheel.workflow")

STEPS = Counter(
    "cronwheel_workflow_steps_total",
    "RunCompleted records of workflow nodes by what they did (applied, duplicate, stale, unknown)",
    ["outcome"],
)
NODE_RUNS_CREATED = Counter(
    "cronwheel_workflow_node_runs_created_total", "Runs of workflow nodes released by a parent"
)


class Poison(Exception):
    """A record that cannot be applied; `kind` labels the dead-letter metric."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def decode_completion(value: bytes | None) -> dict:
    """The RunCompleted datum in `value`; Poison for anything else."""
    try:
        name, datum = default_registry().decode(value)
    except UndecodableRecord as exc:
        raise Poison("undecodable", exc.reason) from None
    if name != "RunCompleted":
        raise Poison("wrong_record", f"expected RunCompleted, got {name}")
    return datum


class WorkflowService:
    def __init__(
        self,
        dsn: str,
        bootstrap: str,
        topics: Topics,
        *,
        group_id: str | None = None,
        group_instance_id: str | None = None,
        batch: int = 500,
        max_wait_ms: int = 0,
        idle_ms: int = 200,
        commit_interval_ms: int = 0,
        session_timeout_ms: int = 10_000,
        lag_every_ms: int = 5_000,
        shutdown_grace_ms: int = 10_000,
        clock: Callable[[], int] = now_ms,
        processed_retention_ms: int | None = None,
    ):
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id or f"{topics.prefix}.workflow"
        # Static membership: a restarted instance with the same id takes its
        # partitions back at once instead of waiting out the session timeout.
        self.group_instance_id = group_instance_id
        self.batch = batch
        self.max_wait_ms = max_wait_ms
        self.idle_ms = idle_ms
        self.commit_interval_ms = commit_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.lag_every_ms = lag_every_ms
        self.shutdown_grace_ms = shutdown_grace_ms
        self.clock = clock
        self.store = Workflows(topics)
        self.pruner = Pruner(Processed(CONSUMER), processed_retention_ms or retention_ms())
        self.producer = kafka.producer(bootstrap)
        self.counts: dict[str, int] = {}
        self.dead_lettered_total = 0
        self._db = Reconnecting(self.dsn, log)
        self._consumer: Consumer | None = None
        self._done: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset
        self._next_commit = 0.0

    # -- the loop ---------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        kafka.ensure_topics(
            [self.topics.run_completed, self.topics.dead_letter], bootstrap=self.bootstrap
        )
        conf = {"session.timeout.ms": self.session_timeout_ms, "on_commit": consuming.on_commit}
        if self.group_instance_id:
            conf["group.instance.id"] = self.group_instance_id
        consumer = kafka.consumer(self.group_id, self.bootstrap, **conf)
        self._consumer = consumer
        consumer.subscribe([self.topics.run_completed], on_revoke=self._on_revoke)
        next_lag = 0.0
        self._next_commit = time.monotonic() + self.commit_interval_ms / 1000
        try:
            while not stop.is_set():
                msgs = self._consume(consumer)
                if msgs:
                    if not self.handle(msgs, stop):
                        break  # stopping mid-batch: uncommitted, so consumed again later
                    if time.monotonic() >= self._next_commit:
                        self._commit(asynchronous=True)
                        self._next_commit = time.monotonic() + self.commit_interval_ms / 1000
                if self.pruner.due(self.clock()):
                    self._with_db(lambda c: self.pruner.run(c, self.clock()), stop)
                if time.monotonic() >= next_lag:
                    self._report_lag(consumer)
                    next_lag = time.monotonic() + self.lag_every_ms / 1000
        finally:
            self._commit(asynchronous=False)  # only finished batches are in _done
            consumer.close()
            self._consumer = None
            self.producer.flush(self.shutdown_grace_ms / 1000)
            self.close()

    def close(self) -> None:
        """Release the database connection (`process` used outside `run` opens one)."""
        self._db.close()

    def _consume(self, consumer: Consumer) -> list[Message]:
        """Block until one record arrives, then take what else the client already
        fetched (or arrives within `max_wait_ms`, default 0: a quiet topic adds no
        wait; under load the batch fills while the previous one is applied)."""
        msgs = consumer.consume(1, timeout=self.idle_ms / 1000)
        if msgs and self.batch > 1:
            msgs += consumer.consume(self.batch - 1, timeout=self.max_wait_ms / 1000)
        return consuming.records(msgs)

    # -- one batch ----------------------------------------------------------------
    def handle(self, msgs: list[Message], stop: threading.Event) -> bool:
        """Apply a batch and dead-letter what cannot be applied; True when done (the
        offsets may be committed), False if `stop` interrupted it (then nothing of
        it is committed and it comes again)."""
        dead: list[tuple[Message, Poison]] = []
        nodes: list[tuple[Message, dict]] = []
        for m in msgs:
            try:
                datum = decode_completion(m.value())
            except Poison as p:
                dead.append((m, p))
                continue
            if datum["workflow_run_id"] is None:
                self._count(NodeStep("not_a_node"))
            else:
                nodes.append((m, datum))
        if nodes:
            failed = self._with_db(lambda conn: self._apply_batch(conn, nodes), stop)
            if failed is None:
                return False
            dead += failed
        if dead and not self._dead_letter(dead, stop):
            return False
        for m in msgs:
            self._done[(m.topic(), m.partition())] = m.offset() + 1
        return True

    def _apply_batch(
        self, conn: psycopg.Connection, nodes: list[tuple[Message, dict]]
    ) -> list[tuple[Message, Poison]]:
        """Every record's step in one transaction (one commit for the batch), each
        in a savepoint of its own so that a poison record undoes only itself. In
        workflow run order: steps lock their workflow run first, so two instances
        (during a rebalance) always take those locks in the same order."""
        ordered = sorted(nodes, key=lambda n: (n[1]["workflow_run_id"], n[1]["run_id"]))
        steps: list[NodeStep] = []
        failed: list[tuple[Message, Poison]] = []
        with conn.transaction():
            for m, datum in ordered:
                try:
                    steps.append(self._apply(conn, datum))
                except Poison as p:
                    failed.append((m, p))
        for step in steps:  # counted once committed (a retried batch is not counted twice)
            self._count(step)
        return failed

    def _apply(self, conn: psycopg.Connection, datum: dict) -> NodeStep:
        try:
            return self.store.complete_node(conn, datum, self.clock())
        except ValueError as exc:
            raise Poison("bad_record", str(exc)) from None
        except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as exc:
            log.exception("RunCompleted of run %s could not be applied", datum["run_id"])
            raise Poison("failed", f"{type(exc).__name__}: {exc}") from None

    def process(self, value: bytes | None, stop: threading.Event | None = None) -> NodeStep | None:
        """One record on its own: decode it and, for a workflow node, apply it in a
        transaction of its own. Raises Poison for a record to dead-letter; None
        only if `stop` was set while the database was away."""
        datum = decode_completion(value)
        if datum["workflow_run_id"] is None:
            return self._count(NodeStep("not_a_node"))
        step = self._with_db(lambda conn: self._apply(conn, datum), stop or threading.Event())
        return None if step is None else self._count(step)

    def _count(self, step: NodeStep) -> NodeStep:
        self.counts[step.outcome] = self.counts.get(step.outcome, 0) + 1
        if step.outcome != "not_a_node":
            STEPS.labels(step.outcome).inc()
        if step.outcome == "duplicate":
            log.info(
                "RunCompleted of %s node %s already processed: skipped",
                step.workflow_run_id,
                step.node,
            )
        if step.created:
            NODE_RUNS_CREATED.inc(len(step.created))
        return step

    def _with_db(self, fn, stop: threading.Event):
        return self._db.call(fn, stop)

    # -- dead letters ---------------------------------------------------------------
    def _dead_letter(self, dead: list[tuple[Message, Poison]], stop: threading.Event) -> bool:
        """Produce each as a DeadLetter record and wait until the broker has them
        all; records it refused are produced again. False if `stop` gave up."""
        pending = dead
        backoff = 0.1
        while pending:
            failed: list[tuple[Message, Poison]] = []
            for item in pending:
                self._produce_dead_letter(item, failed)
            if not self._flush(stop):
                return False
            if failed:
                if stop.wait(backoff):
                    return False
                backoff = min(backoff * 2, 5.0)
            pending = failed
        for m, p in dead:
            log.warning(
                "dead-lettered %s[%d]@%d: %s", m.topic(), m.partition(), m.offset(), p.reason
            )
            self.dead_lettered_total += 1
            metrics.DEAD_LETTERS.labels(CONSUMER, p.kind).inc()
        return True

    def _produce_dead_letter(self, item: tuple[Message, Poison], failed: list) -> None:
        m, p = item
        value = default_registry().encode(
            "DeadLetter",
            {
                "source_topic": m.topic(),
                "source_partition": m.partition(),
                "source_offset": m.offset(),
                "key": m.key(),
                "value": m.value(),
                "reason": p.reason,
                "consumer": CONSUMER,
                "at": now_ms(),
            },
        )

        def on_delivery(err, _msg):
            if err is not None:
                log.warning("dead letter not delivered: %s", err)
                failed.append(item)

        while True:
            try:
                self.producer.produce(
                    self.topics.dead_letter,
                    value=value,
                    key=m.key(),
                    headers=[("record", b"DeadLetter")],
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def _flush(self, stop: threading.Event) -> bool:
        give_up: float | None = None
        while len(self.producer) > 0:
            self.producer.flush(0.5)
            if stop.is_set():
                give_up = give_up or time.monotonic() + self.shutdown_grace_ms / 1000
                if time.monotonic() >= give_up:
                    self.producer.purge()
                    self.producer.flush(0)
                    return False
        return True

    # -- offsets and lag ------------------------------------------------------------
    def _commit(self, *, asynchronous: bool) -> None:
        """Commit the offsets of finished batches on partitions still assigned."""
        if self._consumer is not None:
            consuming.commit_assigned(self._consumer, self._done, asynchronous=asynchronous)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consuming.commit_revoked(consumer, self._done, partitions)

    def _report_lag(self, consumer: Consumer) -> int:
        return consuming.report_lag(consumer, CONSUMER)
