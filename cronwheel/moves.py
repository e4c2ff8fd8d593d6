"""Moving a tenant from one cell to another (issue 24; docs/cells.md,
"Moving a tenant"). A move is a row in the directory (directory_moves) that
steps through `copying` -> `freezing` -> `switching` -> `done` (or `failed` /
`rolled_back`); `advance(move_id)` performs the step the row names and
records the next, each step safe to run again, so a mover that died is
replaced by any other that calls `advance` (or `run`) on the same move.

What holds:
- The source stops firing the tenant before the target starts: the freeze
  commits (timers parked, in the transaction that locks them away from every
  firing transaction) before the directory's epoch flips, and the target is
  activated only after the flip. A job's next instant is its parked timer,
  copied with it; instants due during the freeze fire in the target through
  the job's catch-up; a run both cells could create has the same id and the
  target holds the source's runs, so an instant fires once across both.
- The directory changes only by compare-and-set on the epoch the move
  recorded: two movers of one tenant cannot both flip it, and a placement
  changed under the move fails the move instead of being overwritten.
- Until the flip, the source is whole: a rollback unparks its timers and
  deletes the target's copy.
- With the cells' brokers given (`brokers`), the tenant's Kafka side moves
  too (cronwheel/moves_kafka.py): its principal with the same credential,
  ACLs and queue topics made in the target at the copy; the source's
  dispatcher done forwarding its runs before the flip; the source's topics
  and principal removed after the flip, once its workers have read them to
  the end (docs/cells.md, "Workers follow").
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from confluent_kafka import KafkaException
from prometheus_client import Counter, Histogram

from cronwheel import moves_kafka
from cronwheel.kafka import Topics
from cronwheel.store import directory as dirstore
from cronwheel.store import moves as cells
from cronwheel.store import tenant_credentials
from cronwheel.store.directory import Move, Placement

log = logging.getLogger("cronwheel.moves")

FINAL = ("done", "failed", "rolled_back")

# Counted by the mover whose compare-and-set took the move to its final state
# (so once per move, however many movers took part), served with the router's
# metrics (docs/observability.md).
MOVES = Counter("cronwheel_moves_total", "Moves finished, by how they ended", ["outcome"])
MOVE_SECONDS = Histogram(
    "cronwheel_move_seconds",
    "A finished move's length, from its start to its final state",
    ["outcome"],
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
FROZEN_SECONDS = Histogram(
    "cronwheel_move_frozen_seconds",
    "How long a move refused its tenant's writes (503) in the source: freeze to unfreeze",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
STALLS = Counter(
    "cronwheel_move_stalls_total",
    "Move steps that stalled (a server away, the placement changed under the move)",
)
for _outcome in FINAL:
    MOVES.labels(_outcome)
    MOVE_SECONDS.labels(_outcome)


def _finished(move: Move | None) -> None:
    """Count `move` if it is final (the row the final compare-and-set returned)."""
    if move is None or move.state not in FINAL:
        return
    MOVES.labels(move.state).inc()
    # finished_at is set with every final state (directory_moves' CHECK).
    seconds = (move.finished_at - move.started_at).total_seconds()  # type: ignore[operator]
    MOVE_SECONDS.labels(move.state).observe(seconds)
    if move.frozen_ms is not None:
        FROZEN_SECONDS.observe(move.frozen_ms / 1000)


# A broker that does not answer, or refuses: the step stalls (moves_kafka).
KAFKA_ERRORS = (KafkaException, RuntimeError, TimeoutError, OSError)


class MoveRefused(Exception):
    """A move that cannot start: `status` (404, 409, 422) and the `field`."""

    def __init__(self, status: int, detail: str, field: str | None = None):
        super().__init__(detail)
        self.status = status
        self.field = field


class MoveStalled(RuntimeError):
    """A step that could not finish now (the outbox not drained in time, the
    copy not settling): the move stays in its state; advance again later, or
    roll back."""


@dataclass(frozen=True)
class MoveSettings:
    drain_timeout_s: float = 30.0  # the source's relay publishing the tenant's last records
    verify_rounds: int = 5  # copies after the freeze until the checksums agree
    # The freeze's first copy takes of the history only the rows unfinished or
    # finished since the move started, less this: a transaction that began
    # this long before and finished a run may commit after the first copy.
    catch_up_margin_s: float = 300.0
    # The source's dispatcher forwarding the tenant's last run records to its
    # queue topics, in the freeze (past it the move goes on: a record not
    # forwarded is a run PENDING in the target, announced again there by its
    # pending deadline).
    forward_timeout_s: float = 10.0
    # After the flip, how long the source's topics and principal wait for the
    # tenant's workers to read them to the end before they are removed
    # anyway (what is left is the pending deadline's, as above).
    linger_s: float = 30.0
    # How long the source keeps the tenant's copy (rows, frozen: nothing of
    # it fires or is served there; topics and principal) after the switch,
    # before remove_kept_sources removes it; 0: removed at the switch.
    source_retention_s: float = 0.0
    # The directory caches' time to live (CRONWHEEL_DIRECTORY_TTL_MS; the
    # router passes its own): the source keeps the tenant's rows, frozen, this
    # long after the flip, so a request that a cache not yet aware of the flip
    # routes to the source is refused there 503 or 421 (retried) and never
    # 401 (its key gone, which a worker takes as final). 0: no cache.
    directory_ttl_s: float = 0.0
    # Each cell's broker as its admin, and the deployment's topic names; None:
    # the move leaves Kafka alone (the tenant's workers keep the source's
    # broker until an operator provisions the target's).
    kafka: moves_kafka.CellBrokers | None = None


class Mover:
    """The move protocol over the directory's database (`directory_dsn`, a
    login that may become cronwheel_operator) and each cell's database as its
    owner (`cell_dsns`: cell name -> URL)."""

    # Exceptions that stop the mover itself (a subclass's: the router's lost
    # lease), let through where a broker's failure is caught and waited out.
    PASS_THROUGH: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        directory_dsn: str,
        cell_dsns: Mapping[str, str],
        settings: MoveSettings = MoveSettings(),
        *,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.directory_dsn = directory_dsn
        self.cell_dsns = dict(cell_dsns)
        self.settings = settings
        self.sleep = sleep
        kafka = settings.kafka
        self.brokers = dict(kafka.brokers) if kafka is not None else None
        self.topics = kafka.topics if kafka is not None else Topics()

    # -- the operator's requests ---------------------------------------------
    def start(self, tenant_id: str, target: str) -> Move:
        """Record a move of `tenant_id` to cell `target` (state `copying`);
        MoveRefused when it cannot be."""
        with self._directory() as d:
            placed = dirstore.placement(d, tenant_id)
            if placed is None:
                raise MoveRefused(404, f"no tenant {tenant_id!r} in the directory")
            known = [c.name for c in dirstore.cells(d)]
            if target not in known:
                raise MoveRefused(
                    422, f"unknown cell {target!r}; the cells: {', '.join(known)}", "cell"
                )
            if target == placed.cell:
                raise MoveRefused(422, f"tenant {tenant_id} is already in cell {target!r}", "cell")
            for cell in (placed.cell, target):
                if cell not in self.cell_dsns:
                    raise MoveRefused(422, f"this mover cannot reach cell {cell!r}", "cell")
            move = dirstore.record_move(d, "mv_" + secrets.token_hex(10), placed, target)
            if move is None:
                raise MoveRefused(409, f"tenant {tenant_id} is being moved already")
        log.info("move %s: tenant %s %s -> %s", move.move_id, tenant_id, placed.cell, target)
        return move

    def latest(self, tenant_id: str) -> Move | None:
        with self._directory() as d:
            return dirstore.latest_move(d, tenant_id)

    def get(self, move_id: str) -> Move | None:
        with self._directory() as d:
            return dirstore.move(d, move_id)

    def open_moves(self) -> list[str]:
        with self._directory() as d:
            return dirstore.open_moves(d)

    # -- the protocol --------------------------------------------------------
    def run(self, move_id: str, *, attempts: int = 3) -> Move:
        """Advance until the move is final; a step that stalls, or that a
        database error stops, is tried again (`attempts` times in all, after a
        pause of 2, 4, ... s for a database), then the move is rolled back:
        a step that keeps failing must not leave the tenant frozen."""
        stalls = 0
        while True:
            try:
                move = self.advance(move_id)
            except (MoveStalled, psycopg.Error) as e:
                stalls += 1
                STALLS.inc()
                log.warning("move %s stalled (%d/%d): %s", move_id, stalls, attempts, e)
                if stalls >= attempts:
                    return self.rollback(move_id, str(e))
                if isinstance(e, psycopg.Error):
                    self.sleep(min(2.0**stalls, 30.0))
                continue
            if move.state in FINAL:
                return move

    def advance(self, move_id: str) -> Move:
        """Perform the step the move's state names and record the next state.
        Idempotent: a step interrupted at any point and run again ends the
        same (docs/cells.md, the failure table)."""
        move = self.get(move_id)
        if move is None:
            raise KeyError(move_id)
        step = {
            "copying": self._copy,
            "freezing": self._freeze,
            "switching": self._switch,
        }.get(move.state)
        if step is None:
            return move
        return step(move)

    def rollback(self, move_id: str, why: str, *, final: str = "rolled_back") -> Move:
        """Undo a move that has not flipped: the source active with its timers
        back, the target's copy removed, the directory's placement active in
        the source; the move ends `final` (`failed` when the move could never
        succeed). A move that flipped is finished instead (`advance`)."""
        move = self.get(move_id)
        if move is None:
            raise KeyError(move_id)
        if move.state not in ("copying", "freezing"):
            return self.advance(move_id) if move.state == "switching" else move
        with self._cell(move.source) as src:
            cells.unfreeze(src, move.tenant_id)
        try:  # the target may be why the move failed: its copy may stay
            self._remove_standby(move)
        except psycopg.Error as e:
            log.warning("move %s: the tenant's standby copy stays in %s (the next copy there"
                        " replaces it): %s", move_id, move.target, e)  # fmt: skip
        with self._directory() as d:
            placed = dirstore.placement(d, move.tenant_id)
            if placed is not None and placed.epoch == move.epoch and placed.cell == move.source:
                dirstore.compare_and_set(d, move.tenant_id, move.epoch, move.source, "active")
            done = dirstore.step_move(d, move.move_id, move.state, final, error=why, unfrozen=True)
        _finished(done)
        log.warning("move %s %s: %s", move_id, final.replace("_", " "), why)
        return done or self.get(move_id)  # type: ignore[return-value]

    def _remove_standby(self, move: Move) -> None:
        """A rollback's: the target's standby copy of the tenant, and what the
        copy made on the target's broker."""
        with self._cell(move.target) as dst:
            if cells.tenant_state(dst, move.tenant_id) != "standby":
                return
            cells.remove(dst, move.tenant_id)
        if self._kafka(move):
            try:
                moves_kafka.remove(self.brokers[move.target], self.topics, move.tenant_id)
            except self.PASS_THROUGH:
                raise
            except KAFKA_ERRORS as e:
                log.warning("move %s: the tenant's principal and topics stay in %s: %s",
                            move.move_id, move.target, e)  # fmt: skip

    # -- the steps -----------------------------------------------------------
    def _copy(self, move: Move) -> Move:
        """Record the move in the placement (`moving`), check both cells run
        the same migrations, copy the tenant's rows into the target (standby
        there) while the source keeps firing."""
        placed = self._placement(move)
        if placed.state == "active":
            self._cas(move, move.source, "moving")
        with self._cell(move.source) as src, self._cell(move.target) as dst:
            mine, theirs = cells.migrations(src), cells.migrations(dst)
            if mine != theirs:
                return self._fail(
                    move, f"the cells' migrations differ: {move.source} {mine[-1:]}, "
                    f"{move.target} {theirs[-1:]}"
                )  # fmt: skip
            self._drop_kept_in(move.tenant_id, move.target)
            if cells.tenant_state(dst, move.tenant_id) not in (None, "standby"):
                return self._fail(move, f"cell {move.target} already serves the tenant")
            try:
                cells.copy(src, dst, move.tenant_id, move.target)
            except psycopg.errors.UniqueViolation as e:  # a name or key the target has
                return self._fail(move, f"cell {move.target} holds a conflicting row: {e}")
            self._carry_kafka(move, src)
        return self._step(move, "freezing")

    def _drop_kept_in(self, tenant_id: str, cell: str) -> None:
        """A move back into `cell`: the copy an earlier move kept there goes
        first, whatever its age."""
        with self._directory() as d:
            kept = dirstore.kept_sources(d, 0, tenant_id=tenant_id, cell=cell)
        for earlier in kept:
            if self._drop_kept(earlier) is None:
                raise MoveStalled(f"the tenant's earlier copy in {cell} is not removed yet")

    def _freeze(self, move: Move) -> Move:
        """Freeze the source (the placement `frozen`: writes get 503; in the
        source's database the tenant's timers parked, so nothing of it fires
        there from the freeze's commit on), wait for its relay to publish the
        tenant's records appended before, copy what can have changed since
        the first copy and compare checksums (copying whole while they
        differ)."""
        placed = self._placement(move)
        if placed.state == "moving":
            self._cas(move, move.source, "frozen")
        with self._cell(move.source) as src, self._cell(move.target) as dst:
            if not cells.freeze(src, move.tenant_id):
                return self._fail(move, f"the tenant is not active in cell {move.source}")
            with self._directory() as d:
                dirstore.mark_frozen(d, move.move_id)
            self._settle(move, src)
            self._carry_kafka(move, src)  # a queue made since the copy
            since = move.started_at - timedelta(seconds=self.settings.catch_up_margin_s)
            for round_ in range(self.settings.verify_rounds):
                if round_ == 0:  # what can have changed since the first copy
                    cells.catch_up(src, dst, move.tenant_id, move.target, since)
                else:  # the checksums found more: everything
                    cells.copy(src, dst, move.tenant_id, move.target)
                here, there = (
                    cells.checksums(src, move.tenant_id),
                    cells.checksums(dst, move.tenant_id),
                )
                if here == there:
                    break
                differ = sorted(t for t in here if here[t] != there[t])
                log.info("move %s: copy again, tables differ: %s", move.move_id, differ)
            else:
                raise MoveStalled(f"the copy does not settle: {', '.join(differ)} differ")
        return self._step(move, "switching")

    def _switch(self, move: Move) -> Move:
        """Flip the placement to the target (epoch + 1, compare-and-set),
        activate the tenant there, remove it from the source."""
        with self._directory() as d:
            placed = dirstore.placement(d, move.tenant_id)
        flipped = placed is not None and placed.cell == move.target
        if not flipped:
            self._cas(move, move.target, "active")
        with self._cell(move.target) as dst:
            cells.activate(dst, move.tenant_id, move.target)
        with self._directory() as d:
            dirstore.step_move(d, move.move_id, "switching", "switching", unfrozen=True)
        self.sleep(self.settings.directory_ttl_s)  # every cache has seen the flip
        if self.settings.source_retention_s > 0:  # kept, frozen, until remove_kept_sources
            return self._step(move, "done")
        self._remove_source(move)
        done = self._step(move, "done")
        with self._directory() as d:
            return dirstore.mark_source_removed(d, move.move_id) or done

    # -- after the switch: the source's copy ----------------------------------
    def remove_kept_sources(self) -> list[Move]:
        """Remove the source copies that moves done have kept past
        `source_retention_s` (the router calls this periodically; any number
        of routers may). Returns the moves whose copy went."""
        with self._directory() as d:
            due = dirstore.kept_sources(d, self.settings.source_retention_s)
        return [gone for move in due if (gone := self._drop_kept(move)) is not None]

    def _drop_kept(self, move: Move) -> Move | None:
        """The kept copy of `move`'s tenant in its source, gone, and recorded;
        None when it could not be removed now (the next sweep tries again).
        Under the tenant's lock in the directory, which a move back into the
        source takes too (`_drop_kept_in`), so a sweep never removes what
        such a move has begun to copy and carry there."""
        try:
            with self._directory() as d, dirstore.tenant_lock(d, move.tenant_id):
                current = dirstore.move(d, move.move_id)
                if current is None or current.source_removed_at is not None:
                    return current  # removed meanwhile (a sweep of another router)
                self._remove_source(move)
                gone = dirstore.mark_source_removed(d, move.move_id)
        except (MoveStalled, psycopg.Error) as e:
            log.warning("move %s: the tenant's copy in %s not removed: %s", move.move_id,
                        move.source, e)  # fmt: skip
            return None
        log.info("move %s: the tenant's copy in %s removed", move.move_id, move.source)
        return gone

    def _remove_source(self, move: Move) -> None:
        """The tenant's topics, principal and rows in `move.source`, where it is
        frozen (the copy the move left). Kafka first: the rows say, while they
        last, that Kafka is still to go. A tenant active or standby there
        again (moved back) is not touched."""
        with self._cell(move.source) as src:
            state = cells.tenant_state(src, move.tenant_id)
            if state not in (None, "frozen"):
                return
            if state == "frozen":
                self._remove_kafka(move)
            cells.remove(src, move.tenant_id, only_state="frozen")

    # -- the tenant's Kafka side (cronwheel/moves_kafka.py) -------------------
    def _carry_kafka(self, move: Move, src: psycopg.Connection) -> None:
        """The target's broker gets the tenant's principal (its credential as
        the source's broker has it), ACLs and queue topics."""
        if not self._kafka(move):
            return
        kept = tenant_credentials.kept(src, move.tenant_id)
        if kept is None:
            log.warning(
                "move %s: tenant %s has no kept Kafka credential (made before they were"
                " kept): its principal in %s gets none; rotate its credentials after the move",
                move.move_id, move.tenant_id, move.target,
            )  # fmt: skip
        try:
            made = moves_kafka.carry(
                self.brokers[move.source], self.brokers[move.target], self.topics,
                move.tenant_id, kept,
            )  # fmt: skip
        except KAFKA_ERRORS as e:
            raise MoveStalled(
                f"the tenant's principal and topics not made in {move.target}: {e}"
            ) from e
        log.info("move %s: principal and queue topics in %s: %s", move.move_id, move.target, made)

    def _settle(self, move: Move, src: psycopg.Connection) -> None:
        """Carry out, in the source, what the tenant's writes before the
        freeze started, so that the copy after this is final. Each round:
        the relay publishes the tenant's records; the dispatcher forwards its
        run records; the platform's own workers (webhook, executor) start
        what was forwarded to them and end the attempts they hold; what those
        ends appended is published, with the platform's run-completed topic
        (whose records do not name their tenant) while the tenant has a
        workflow run under way; and the workflow service applies them.
        Applying a completion may create runs (the next nodes, a buffered
        instant): a round in which the tenant's runs grew is followed by
        another. MoveStalled when the publishing or the workflow service
        does not finish in time, or the rounds do not end."""
        runs = cells.tenant_runs(src, move.tenant_id)
        for _ in range(self.settings.verify_rounds):
            workflows = cells.workflows_under_way(src, move.tenant_id)
            self._drain(move, src, workflows)
            self._forwarded(move)
            self._platform_runs(move, src)
            self._drain(move, src, workflows)
            if workflows:
                self._applied(move)
            runs, before = cells.tenant_runs(src, move.tenant_id), runs
            if runs == before:
                return  # nothing made more to carry out
        raise MoveStalled("the tenant's runs go on being created in the source")

    def _until_none(self, count: Callable[[], int], timeout_s: float, every_s: float) -> int:
        """Poll `count` until it is 0 or `timeout_s` passed: what it last said."""
        deadline = time.monotonic() + timeout_s
        while (left := count()) > 0 and time.monotonic() <= deadline:
            self.sleep(every_s)
        return left

    def _drain(self, move: Move, src: psycopg.Connection, completions: bool) -> None:
        """The relay has published the tenant's records appended until now,
        and with `completions` every record of the run-completed topic."""
        upto = cells.outbox_high(src)
        shared = [self.topics.run_completed] if completions else []
        left = self._until_none(
            lambda: cells.outbox_left(src, move.tenant_id, upto, shared),
            self.settings.drain_timeout_s, 0.05,
        )  # fmt: skip
        if left:
            raise MoveStalled(f"{left} outbox records of the tenant not published")

    def _platform_runs(self, move: Move, src: psycopg.Connection) -> None:
        """The source's webhook and executor services have started every run
        forwarded to them (their groups commit a record's offset once its run
        started, or was found not startable) and ended every attempt they
        hold, each within `forward_timeout_s`. Past that the move goes on:
        an attempt that ends in the source after the copy is RUNNING in the
        target until its lease runs out, then retried there (a webhook
        delivered twice, a command run twice)."""
        timeout_s = self.settings.forward_timeout_s
        started = self._source_waited(
            move,
            lambda b: moves_kafka.await_started(
                b, self.topics, move.tenant_id, timeout_s, self.sleep
            ),
        )
        held = self._until_none(
            lambda: cells.platform_attempts(src, move.tenant_id), timeout_s, 0.1
        )
        if not started or held:
            log.warning(
                "move %s: the source's webhook and executor services have %s; those runs"
                " are retried in %s when their leases run out",
                move.move_id,
                f"{held} attempts under way" if started else "records not yet started",
                move.target,
            )

    def _applied(self, move: Move) -> None:
        """The source's workflow service has applied every completion
        published so far (the tenant's last among them); MoveStalled when
        not in `forward_timeout_s`: a completion applied in the source after
        the copy would be lost to the target, its workflow run never going
        on there."""
        timeout_s = self.settings.forward_timeout_s
        if not self._source_waited(
            move, lambda b: moves_kafka.await_applied(b, self.topics, timeout_s, self.sleep)
        ):
            raise MoveStalled(
                "the source's workflow service has not applied the runs' last completions"
            )

    def _forwarded(self, move: Move) -> None:
        timeout_s = self.settings.forward_timeout_s
        forwarded = self._source_waited(
            move,
            lambda b: moves_kafka.await_forwarded(
                b, self.topics, move.tenant_id, timeout_s, self.sleep
            ),
        )
        if not forwarded:
            log.warning(
                "move %s: the source's dispatcher has not forwarded every run record of the"
                " tenant; those runs are announced again in %s by their pending deadline",
                move.move_id, move.target,
            )  # fmt: skip

    def _source_waited(self, move: Move, wait: Callable[[moves_kafka.Broker], bool]) -> bool:
        """`wait` on the source's broker: whether it ended in time (False
        too when the broker failed); True when this mover leaves Kafka alone."""
        if not self._kafka(move):
            return True
        try:
            return wait(self.brokers[move.source])
        except self.PASS_THROUGH:
            raise
        except KAFKA_ERRORS as e:
            log.warning("move %s: the source's broker: %s", move.move_id, e)
            return False

    def _remove_kafka(self, move: Move) -> None:
        """After the flip: the source's topics and principal, once the
        tenant's workers read them to the end (or `linger_s` passed)."""
        if not self._kafka(move):
            return
        source = self.brokers[move.source]
        try:
            consumed = moves_kafka.await_consumed(
                source, self.topics, move.tenant_id, self.settings.linger_s, self.sleep
            )
            gone = moves_kafka.remove(source, self.topics, move.tenant_id)
        except KAFKA_ERRORS as e:
            raise MoveStalled(
                f"the tenant's topics and principal not removed from {move.source}: {e}"
            ) from e
        log.info(
            "move %s: the tenant's topics and principal removed from %s (%s): %s",
            move.move_id, move.source,
            "read to the end" if consumed else "not all read: the pending deadline's", gone,
        )  # fmt: skip

    def _kafka(self, move: Move) -> bool:
        """Whether this mover moves the tenant's Kafka side (it reaches both
        cells' brokers)."""
        if self.brokers is None:
            return False
        missing = [c for c in (move.source, move.target) if c not in self.brokers]
        if missing:
            log.warning("move %s: no broker for cell %s: Kafka left alone", move.move_id, missing)
        return not missing

    # -- helpers -------------------------------------------------------------
    def _placement(self, move: Move) -> Placement:
        with self._directory() as d:
            placed = dirstore.placement(d, move.tenant_id)
        if placed is None or placed.epoch != move.epoch or placed.cell != move.source:
            raise MoveStalled(f"the tenant's placement changed under the move: {placed}")
        return placed

    def _cas(self, move: Move, cell: str, state: str) -> Placement:
        with self._directory() as d:
            placed = dirstore.compare_and_set(d, move.tenant_id, move.epoch, cell, state)
        if placed is None:
            raise MoveStalled("the tenant's placement changed under the move (epoch)")
        return placed

    def _step(self, move: Move, to: str, error: str | None = None) -> Move:
        with self._directory() as d:
            stepped = dirstore.step_move(d, move.move_id, move.state, to, error=error)
        if stepped is None:  # another mover took this step: carry on from where it is
            return self.get(move.move_id)  # type: ignore[return-value]
        log.info("move %s: %s -> %s", move.move_id, move.state, to)
        _finished(stepped)
        return stepped

    def _fail(self, move: Move, why: str) -> Move:
        return self.rollback(move.move_id, why, final="failed")

    def _directory(self) -> psycopg.Connection:
        return psycopg.connect(self.directory_dsn, autocommit=True, connect_timeout=10)

    def _cell(self, name: str) -> psycopg.Connection:
        return cells.connect(self.cell_dsns[name])
