"""The move API, the router's own (docs/cells.md "Moving a tenant";
CONTRACT.md "Cells"): a move spans two cells, so no cell's gateway can run
it. Operator key only (the router checked it before calling here).

- `POST /v1/tenants/{id}/move {"cell": NAME}` -> 202 `{move_id, state}`; the
  move then runs in a thread of this process (cronwheel/moves.py). Unknown
  tenant 404; unknown cell, or the tenant's own, 422 naming `cell`; a move
  already open for the tenant 409.
- `GET /v1/tenants/{id}/move` -> the tenant's latest move: `{move_id,
  tenant_id, source, target, state, started_at, finished_at, frozen_ms,
  error}`; 404 when it has none.

At start-up the router resumes every open move (a mover that died is
replaced by the next router to start): each step is idempotent. One router
advances a move at a time: the one holding the move's lease in the directory
(services/router/move_lease.py); another that resumes or is asked about the
same move waits on the lease, and takes the move over when the holder's lease
runs out (it died) or carries on when the move is final.
"""

from __future__ import annotations

import json
import logging
import re
import threading

import psycopg
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from cronwheel.directory import Directory
from cronwheel.moves import FINAL, Mover, MoveRefused
from cronwheel.store.directory import Move
from services.router.move_lease import TTL_S, LeaseLost, MoveLease, new_owner

log = logging.getLogger("cronwheel.router.moves")

MOVE_PATH = re.compile(r"^/v1/tenants/([A-Za-z0-9_-]{1,100})/move$")
MAX_BODY = 4096


class LeasedMover(Mover):
    """`base`'s protocol for one run of one move, every step (and every wait
    of the drain, and a rollback) taken only while `lease` is held: LeaseLost
    stops it at the first of those after another router took the lease."""

    PASS_THROUGH = (LeaseLost,)  # never taken for a broker's failure

    def __init__(self, base: Mover, lease: MoveLease):
        self.lease = lease
        self._wait = base.sleep
        super().__init__(base.directory_dsn, base.cell_dsns, base.settings, sleep=self._sleep)

    def advance(self, move_id: str) -> Move:
        self.lease.check()
        return super().advance(move_id)

    def rollback(self, move_id: str, why: str, *, final: str = "rolled_back") -> Move:
        self.lease.check()
        return super().rollback(move_id, why, final=final)

    def _sleep(self, seconds: float) -> None:
        self.lease.check()
        self._wait(seconds)


class Moves:
    def __init__(
        self,
        mover: Mover,
        directory: Directory,
        *,
        owner: str | None = None,
        lease_ttl_s: float = TTL_S,
    ):
        self.mover = mover
        self.directory = directory
        self.owner = owner or new_owner()
        self.lease_ttl_s = lease_ttl_s
        self._running: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def sweep_kept_sources(self, every_s: float | None = None) -> None:
        """Remove, on a thread of this router, the copies moves kept in the
        cells they left once past the retention: every `every_s` (a tenth of
        the retention, between 1 s and 5 minutes). Every router may sweep.
        Without a retention there is nothing to sweep: the switch removes the
        source's copy (a move back into that cell clears what a mover that
        died at the switch left, Mover._drop_kept_in)."""
        retention_s = self.mover.settings.source_retention_s
        if retention_s <= 0:
            return
        every_s = every_s or min(300.0, max(1.0, retention_s / 10))

        def sweep() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.mover.remove_kept_sources()
                except psycopg.Error as e:  # the directory away: the next round
                    log.warning("kept sources not swept: %s", e)

        threading.Thread(target=sweep, daemon=True, name="move-sweep").start()

    def resume(self) -> None:
        """Run every open move to its end (a router started after a mover died)."""
        for move_id in self.mover.open_moves():
            self._run(move_id)

    def _run(self, move_id: str) -> None:
        with self._lock:
            if move_id in self._running and self._running[move_id].is_alive():
                return
            thread = threading.Thread(
                target=self._body, args=(move_id,), daemon=True, name=f"move-{move_id}"
            )
            self._running[move_id] = thread
        thread.start()

    def _body(self, move_id: str) -> None:
        """Advance the move under its lease until it is final; while another
        router holds the lease, wait (and take over if that router dies)."""
        lease = MoveLease(self.mover.directory_dsn, move_id, self.owner, self.lease_ttl_s)
        try:
            while self._take(lease):
                try:
                    with lease.kept():
                        move = LeasedMover(self.mover, lease).run(move_id)
                    log.info("move %s ended %s", move_id, move.state)
                    return
                except LeaseLost as e:
                    log.warning("move %s: %s; it carries the move on", move_id, e)
        except Exception:
            log.exception("move %s: the mover failed; it resumes at the next start", move_id)
        finally:
            lease.release()
            moved = self.mover.get(move_id)
            if moved is not None:
                self.directory.forget(moved.tenant_id)

    def _take(self, lease: MoveLease) -> bool:
        """Wait until this router holds the move's lease (True), or the move
        is final or gone, or this router stops (False)."""
        while not self._stop.is_set():
            try:
                move = self.mover.get(lease.move_id)
                if move is None or move.state in FINAL:
                    return False
                if lease.acquire():
                    return True
            except psycopg.Error as e:  # the directory away: try again
                log.warning("move %s: the directory did not answer: %s", lease.move_id, e)
            self._stop.wait(lease.ttl_s / 3)
        return False

    def close(self, timeout: float = 30.0) -> None:
        """Stop waiting on leases and wait for the moves this router runs."""
        self._stop.set()
        with self._lock:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(timeout)

    async def handle(self, request: Request, tenant_id: str) -> Response:
        if request.method == "GET":
            move = await run_in_threadpool(self.mover.latest, tenant_id)
            if move is None:
                return _problem(404, "NOT_FOUND", f"tenant {tenant_id} has no move")
            return _json(200, describe(move))
        if request.method != "POST":
            return _problem(405, "METHOD_NOT_ALLOWED", "GET or POST")
        body = await request.body()
        if len(body) > MAX_BODY:
            return _problem(413, "PAYLOAD_TOO_LARGE", f"the body is over {MAX_BODY} bytes")
        try:
            doc = json.loads(body or b"null")
        except ValueError:
            return _problem(400, "INVALID_JSON", "the body is not JSON")
        cell = doc.get("cell") if isinstance(doc, dict) else None
        if not isinstance(cell, str) or not cell:
            return _problem(422, "INVALID_FIELD", "cell: the target cell's name", field="cell")
        try:
            move = await run_in_threadpool(self.mover.start, tenant_id, cell)
        except MoveRefused as e:
            code = {404: "NOT_FOUND", 409: "CONFLICT"}.get(e.status, "INVALID_FIELD")
            extra = {"field": e.field} if e.field else {}
            return _problem(e.status, code, str(e), **extra)
        self._run(move.move_id)
        return _json(202, {"move_id": move.move_id, "state": move.state})


def describe(move: Move) -> dict:
    return {
        "move_id": move.move_id,
        "tenant_id": move.tenant_id,
        "source": move.source,
        "target": move.target,
        "state": move.state,
        "started_at": move.started_at.isoformat(),
        "finished_at": move.finished_at.isoformat() if move.finished_at else None,
        "frozen_ms": move.frozen_ms,
        "error": move.error,
        # When the tenant's copy left in the source went (null: kept, or not done).
        "source_removed_at": (
            move.source_removed_at.isoformat() if move.source_removed_at else None
        ),
    }


def _json(status: int, doc: dict) -> Response:
    return Response(json.dumps(doc), status, media_type="application/json")


def _problem(status: int, code: str, detail: str, **extra) -> Response:
    from services.router.app import problem  # the router's problem documents

    return problem(status, code, detail, **extra)
