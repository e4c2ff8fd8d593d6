"""The workflow service: consumes RunCompleted and moves workflow runs on.

For each record of a workflow node, Workflows.complete_node checks it against
the run in the database, records the run as processed, sets the node's state
and creates the runs of the children whose last parent just succeeded, or fails
the workflow run and skips what lies below a failed node, all in one
transaction: the records of one consumed batch share it (one commit), each in a
savepoint of its own. Offsets are committed only after that transaction, so a
crash in between (kill -9 included) means the records come again and are found
already processed: exactly one effect per completion.
The topic is not trusted: a record whose run is not in the database as the
record says (another tenant's, another workflow run's, another attempt, not yet
in the state claimed) is refused: it changes nothing, is not recorded as
processed (the genuine completion still applies when it comes), is logged at
warning and counted in cronwheel_workflow_records_refused_total{reason}, and its
offset moves on like any other.
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

import threading
from collections.abc import Callable

import psycopg
from confluent_kafka import Consumer, Message
from prometheus_client import Counter

from cronwheel import kafka
from cronwheel.config import Processed as ProcessedSettings
from cronwheel.consumer import ConsumerService, Poison, expect
from cronwheel.core.clock import now_ms
from cronwheel.store.dispatch import Processed, Pruner
from cronwheel.store.workflows import CONSUMER, NodeStep, Workflows

STEPS = Counter(
    "cronwheel_workflow_steps_total",
    "RunCompleted records of workflow nodes by what they did (applied, duplicate, stale, refused)",
    ["outcome"],
)
REFUSED = Counter(
    "cronwheel_workflow_records_refused_total",
    "RunCompleted records of workflow nodes the database does not agree with, by the first"
    " claim found false (no_run, tenant, workflow_run, attempt, state); none changed anything",
    ["reason"],
)
NODE_RUNS_CREATED = Counter(
    "cronwheel_workflow_node_runs_created_total", "Runs of workflow nodes released by a parent"
)


def decode_completion(value: bytes | None) -> dict:
    """The RunCompleted datum in `value`; Poison for anything else."""
    return expect(value, "RunCompleted")


class WorkflowService(ConsumerService):
    """The `run-completed` topic is one for the platform, read by a consumer
    group (with an `on_revoke` that commits), not under leases."""

    name = CONSUMER

    def __init__(
        self,
        *args,  # ConsumerService's: dsn, bootstrap, topics
        group_instance_id: str | None = None,
        commit_interval_ms: int = 0,
        session_timeout_ms: int = 10_000,
        clock: Callable[[], int] = now_ms,
        processed_retention_ms: int = ProcessedSettings.retention_ms,
        **skeleton,  # ConsumerService's: group_id, batch, max_wait_ms (0), idle_ms, ...
    ):
        commit_every_s = commit_interval_ms / 1000
        super().__init__(*args, commit_every_s=commit_every_s, **skeleton)
        # Static membership: a restarted instance with the same id takes its
        # partitions back at once instead of waiting out the session timeout.
        self.group_instance_id = group_instance_id
        self.session_timeout_ms = session_timeout_ms
        self.clock = clock
        self.store = Workflows(self.topics)
        self.pruner = Pruner(Processed(CONSUMER), processed_retention_ms, clock=clock)
        self.counts: dict[str, int] = {}
        self.refused: dict[str, int] = {}  # refused records by reason

    # -- the loop ---------------------------------------------------------------
    def open(self) -> Consumer:
        kafka.ensure_topics(
            [self.topics.run_completed, self.topics.dead_letter],
            bootstrap=self.bootstrap,
            principal=self.name,
        )
        conf = {"session.timeout.ms": self.session_timeout_ms, "on_commit": self.offsets.on_commit}
        if self.group_instance_id:
            conf["group.instance.id"] = self.group_instance_id
        consumer = kafka.consumer(self.group_id, self.bootstrap, principal=self.name, **conf)
        consumer.subscribe(
            [self.topics.run_completed], on_revoke=lambda c, ps: self.offsets.give_up(c, ps)
        )
        return consumer

    def turn(self, consumer: Consumer, stop: threading.Event) -> bool:
        # Block until one record arrives, then take what else the client
        # already fetched (or arrives within `max_wait_ms`, default 0: a quiet
        # topic adds no wait; under load the batch fills while the previous
        # one is applied).
        self.pruner.start_once(self.dsn, stop, self.log)  # first pass now, the rest on its thread
        msgs = self.take(consumer)
        return not msgs or self.handle(msgs, stop)  # False: `stop` interrupted the batch

    def close(self) -> None:
        self.pruner.stop()
        super().close()

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
                self._count(NodeStep("not_a_node"), datum)
            else:
                nodes.append((m, datum))
        if nodes:
            failed = self.with_db(lambda conn: self._apply_batch(conn, nodes), stop)
            if failed is None:
                return False
            dead += failed
        grace_s = self.shutdown_grace_ms / 1000
        if dead and not self.dead_letters.send(dead, stop, grace_s):
            return False
        for m in msgs:
            self.offsets.finished(m)
        return True

    def _apply_batch(
        self, conn: psycopg.Connection, nodes: list[tuple[Message, dict]]
    ) -> list[tuple[Message, Poison]]:
        """Every record's step in one transaction (one commit for the batch), each
        in a savepoint of its own so that a poison record undoes only itself. In
        workflow run order: steps lock their workflow run first, so two instances
        (during a rebalance) always take those locks in the same order."""
        ordered = sorted(nodes, key=lambda n: (n[1]["workflow_run_id"], n[1]["run_id"]))
        steps: list[tuple[NodeStep, dict]] = []
        failed: list[tuple[Message, Poison]] = []
        with conn.transaction():
            for m, datum in ordered:
                try:
                    steps.append((self._apply(conn, datum), datum))
                except Poison as p:
                    failed.append((m, p))
        for step, datum in steps:  # counted once committed (a retried batch is not counted twice)
            self._count(step, datum)
        return failed

    def _apply(self, conn: psycopg.Connection, datum: dict) -> NodeStep:
        try:
            return self.store.complete_node(conn, datum, self.clock())
        except ValueError as exc:
            raise Poison("bad_record", str(exc)) from None
        except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as exc:
            self.log.exception("RunCompleted of run %s could not be applied", datum["run_id"])
            raise Poison("failed", f"{type(exc).__name__}: {exc}") from None

    def process(self, value: bytes | None, stop: threading.Event | None = None) -> NodeStep | None:
        """One record on its own: decode it and, for a workflow node, apply it in a
        transaction of its own. Raises Poison for a record to dead-letter; None
        only if `stop` was set while the database was away."""
        datum = decode_completion(value)
        if datum["workflow_run_id"] is None:
            return self._count(NodeStep("not_a_node"), datum)
        step = self.with_db(lambda conn: self._apply(conn, datum), stop or threading.Event())
        return None if step is None else self._count(step, datum)

    def _count(self, step: NodeStep, datum: dict) -> NodeStep:
        self.counts[step.outcome] = self.counts.get(step.outcome, 0) + 1
        if step.outcome != "not_a_node":
            STEPS.labels(step.outcome).inc()
        if step.outcome == "refused":
            self.refused[step.reason] = self.refused.get(step.reason, 0) + 1
            REFUSED.labels(step.reason).inc()
            # The record's claims are printed quoted and cut short: they are not trusted.
            self.log.warning(
                "RunCompleted refused (%s): the database does not agree with run %.80r of"
                " tenant %.80r, %.80r node %.80r, attempt %s, %.20r; nothing changed",
                step.reason,
                datum["run_id"],
                datum["tenant_id"],
                step.workflow_run_id,
                step.node,
                datum["attempt"],
                datum["state"],
            )
        if step.outcome == "duplicate":
            self.log.info(
                "RunCompleted of %s node %s already processed: skipped",
                step.workflow_run_id,
                step.node,
            )
        if step.created:
            NODE_RUNS_CREATED.inc(len(step.created))
        return step
