"""The worker protocol over HTTP, as the SDK uses it: the batch routes
(start-batch, complete-batch: one request and one transaction for many runs),
the single ones (heartbeat, and the fallback), and the retries every call needs.

Each batch answer is a list of (status, body or problem) per item, in order:
what the single route would have answered for that run alone. Where the
gateway refuses a batch as a whole (a malformed or oversized item: 422, 413),
its items are sent one by one, so one bad item fails only itself; where it has
no batch routes (404, 405: an older gateway), the single routes are used from
then on.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cronwheel.sdk.http import Client, HttpError, Response

log = logging.getLogger("cronwheel.sdk")

MAX_BATCH = 100  # items per batch request (the gateway's limit)
RETRY_FOR_S = 60.0  # how long a call is retried on network errors, 429 and 5xx


class Stopping(Exception):
    """The worker is stopping: a call that would have been retried gives up."""


Answer = tuple[int, Any]  # (status, body on 200 or the problem document)


class WorkerApi:
    def __init__(self, base_url: str, api_key: str, stop: threading.Event, max_connections: int):
        self._stop = stop
        self._http = Client(
            base_url,
            {"Authorization": f"Bearer {api_key}"},
            timeout=10.0,
            max_connections=max_connections,
        )
        self.batch_routes = True  # False once the gateway showed it has none

    def close(self) -> None:
        self._http.close()

    # -- the protocol's verbs ------------------------------------------------------
    def start_many(self, worker_id: str, runs: list[tuple[str, int]]) -> list[Answer]:
        """StartRun for each (run_id, attempt); retried while not stopping."""
        items = [{"run_id": r, "attempt": a} for r, a in runs]
        return self._many(
            "start", {"worker_id": worker_id, "runs": items}, items, {"worker_id": worker_id}, True
        )

    def complete_many(self, items: list[dict]) -> list[Answer]:
        """CompleteRun for each {run_id, attempt, start_token, outcome, ...}; retried
        even while stopping (a drain hands its runs back this way)."""
        return self._many("complete", {"runs": items}, items, {}, False)

    def heartbeat(self, run_id: str, attempt: int, start_token: str) -> Response:
        body = {"attempt": attempt, "start_token": start_token}
        return self.post(f"/v1/runs/{run_id}/heartbeat", body, retry=False)

    def tenant(self) -> dict | None:
        """GET /v1/tenant: `{tenant_id, cell, kafka_bootstrap}` (the cell serving
        the tenant now, and its broker); None when there is no answer to go by
        (the worker asks again later)."""
        try:
            resp = self._http.get("/v1/tenant")
        except HttpError as e:
            log.debug("GET /v1/tenant: %s", e)
            return None
        body = _json(resp) if resp.status_code == 200 else None
        return body if isinstance(body, dict) and body.get("kafka_bootstrap") else None

    # -- underneath ------------------------------------------------------------------
    def _send(self, path: str, body: dict) -> Response:
        """One POST, no retries (tests stand in for the gateway here)."""
        return self._http.post_json(path, body)

    def _many(
        self, verb: str, batch: dict, items: list[dict], common: dict, give_up_on_stop: bool
    ) -> list[Answer]:
        if self.batch_routes:
            resp = self.post(f"/v1/runs/{verb}-batch", batch, give_up_on_stop=give_up_on_stop)
            if resp.status_code == 200:
                results = resp.json()["results"]
                if len(results) != len(items):
                    raise RuntimeError(f"{verb}-batch answered {len(results)} of {len(items)}")
                return [(r["status"], r.get("body", r.get("problem"))) for r in results]
            if resp.status_code in (404, 405):
                log.warning("the gateway has no %s-batch route: using the single routes", verb)
                self.batch_routes = False
            elif resp.status_code in (401, 403):  # the same for every item
                return [(resp.status_code, _json(resp))] * len(items)
            else:  # refused as a whole (422, 413): each item alone
                log.warning("%s-batch refused (%s): sending its items one by one", verb, resp.text)
        out = []
        for item in items:
            body = {**common, **{k: v for k, v in item.items() if k != "run_id"}}
            resp = self.post(
                f"/v1/runs/{item['run_id']}/{verb}", body, give_up_on_stop=give_up_on_stop
            )
            out.append((resp.status_code, _json(resp)))
        return out

    def post(
        self, path: str, body: dict, retry: bool = True, give_up_on_stop: bool = True
    ) -> Response:
        """POST with retries on network errors, 421, 429 and 5xx (bounded
        backoff). 421: the tenant moved to another cell since the router (or
        the gateway it reached) last read the directory; the router reads it
        again, so the retry reaches the tenant's cell."""
        delay = 0.05
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            try:
                resp = self._send(path, body)
                if resp.status_code < 500 and resp.status_code not in (421, 429):
                    return resp
                err: Exception = HttpError(f"POST {path}: HTTP {resp.status_code}: {resp.text}")
            except HttpError as e:
                err = e
            if not retry or time.monotonic() > deadline:
                raise err
            if give_up_on_stop and self._stop.is_set():
                raise Stopping()
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _json(resp: Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None
