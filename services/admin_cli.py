"""Admin verbs of the `cronwheel` command over the HTTP API:
`cronwheel tenants|keys|jobs|runs|workflows ...`.

They read CRONWHEEL_URL and CRONWHEEL_API_KEY (a tenant key, or the operator key
for `tenants`). People get tables; `--json` prints the API's JSON for scripts.
An API error becomes one line, `cronwheel: 422 INVALID_FIELD schedule.cron: ...`,
and exit code 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import httpx


class ApiError(Exception):
    pass


class Api:
    def __init__(self) -> None:
        self.base = (os.environ.get("CRONWHEEL_URL") or "http://127.0.0.1:8080").rstrip("/")
        key = os.environ.get("CRONWHEEL_API_KEY")
        if not key:
            raise ApiError("CRONWHEEL_API_KEY is not set (a tenant key, or the operator key)")
        self.client = httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {key}"}, timeout=30.0
        )

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        try:
            resp = self.client.request(method, path, json=body, params=params)
        except httpx.HTTPError as e:
            raise ApiError(f"cannot reach {self.base}: {e}") from e
        if resp.status_code >= 400:
            raise ApiError(_problem_line(resp))
        return resp.json() if resp.content else None


def _problem_line(resp: httpx.Response) -> str:
    try:
        p = resp.json()
    except ValueError:
        return f"{resp.status_code} {resp.text.strip()[:200]}"
    parts = [str(resp.status_code), p.get("code") or ""]
    detail = p.get("detail") or p.get("title") or ""
    if p.get("field") and not str(detail).startswith(p["field"]):
        detail = f"{p['field']}: {detail}"
    return " ".join(x for x in (*parts, detail) if x)


def _table(rows: list[dict], cols: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))[:60]
    return str(v)


def _show(args, doc: Any, cols: list[str] | None = None) -> None:
    if args.json or cols is None:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return
    items = doc.get("items", doc) if isinstance(doc, dict) else doc
    if isinstance(items, dict):
        items = [items]
    print(_table(items, cols))
    if isinstance(doc, dict) and doc.get("next_cursor"):
        print(f"(more: --cursor {doc['next_cursor']})")


def _body(args) -> Any:
    if args.file == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(args.file) as f:
                text = f.read()
        except OSError as e:
            raise ApiError(f"cannot read {args.file}: {e.strerror}") from e
    try:
        return json.loads(text)
    except ValueError as e:
        raise ApiError(f"{args.file} is not JSON: {e}") from e


JOB_COLS = ["job_id", "name", "priority", "paused", "next_fire_at", "fired_count", "missed_count"]
MOVE_FINAL = ("done", "failed", "rolled_back")
RUN_COLS = ["run_id", "state", "attempt", "scheduled_at", "finished_at"]


def run_verb(args) -> None:
    api = Api()
    noun, verb = args.noun, args.verb
    q = {"cursor": getattr(args, "cursor", None), "limit": getattr(args, "limit", None)}
    q = {k: v for k, v in q.items() if v is not None}
    if noun == "tenants":
        if verb == "create":
            body: dict = {"name": args.name}
            if args.cell:
                body["cell"] = args.cell
            if args.classes:
                body["priority_classes"] = args.classes.split(",")
            _show(
                args,
                api.call("POST", "/v1/tenants", body),
                ["tenant_id", "name", "cell", "api_key"],
            )
        elif verb == "list":
            _show(
                args,
                api.call("GET", "/v1/tenants", params=q),
                ["tenant_id", "name", "cell", "priority_classes"],
            )
        elif verb == "move":
            path = f"/v1/tenants/{args.id}/move"
            move = api.call("POST", path, {"cell": args.to})
            while args.wait and move["state"] not in MOVE_FINAL:
                time.sleep(0.5)  # polling the router, which runs the move
                move = api.call("GET", path)
            _show(args, move, ["move_id", "state", "frozen_ms"])
            if args.wait and move["state"] != "done":
                raise ApiError(f"the move ended {move['state']}: {move.get('error')}")
    elif noun == "keys":
        if verb == "create":
            _show(args, api.call("POST", "/v1/keys", {}), ["key_id", "api_key"])
        elif verb == "list":
            _show(args, api.call("GET", "/v1/keys"), ["key_id", "created_at", "revoked_at"])
        elif verb == "revoke":
            api.call("DELETE", f"/v1/keys/{args.id}")
            print(f"revoked {args.id}")
    elif noun == "jobs":
        path = f"/v1/jobs/{getattr(args, 'id', '')}".rstrip("/")
        if verb == "list":
            _show(args, api.call("GET", "/v1/jobs", params=q), JOB_COLS)
        elif verb == "get":
            _show(args, api.call("GET", path))
        elif verb == "create":
            _show(args, api.call("POST", "/v1/jobs", _body(args)), JOB_COLS + ["topic"])
        elif verb == "update":
            _show(args, api.call("PATCH", path, _body(args)), JOB_COLS)
        elif verb in ("pause", "resume"):
            _show(args, api.call("POST", f"{path}/{verb}"), JOB_COLS)
        elif verb == "trigger":
            _show(args, api.call("POST", f"{path}/trigger"), ["run_id", "created"])
        elif verb == "backfill":
            body = {"from": args.from_, "to": args.to}
            _show(
                args,
                api.call("POST", f"{path}/backfill", body),
                ["instants", "created", "already_existed"],
            )
        elif verb == "delete":
            api.call("DELETE", path)
            print(f"deleted {args.id}")
    elif noun == "runs":
        if verb == "list":
            for k in ("job_id", "state", "workflow_run_id"):
                if getattr(args, k, None):
                    q[k] = getattr(args, k)
            _show(args, api.call("GET", "/v1/runs", params=q), RUN_COLS)
        elif verb == "get":
            _show(args, api.call("GET", f"/v1/runs/{args.id}"))
        elif verb == "cancel":
            _show(args, api.call("POST", f"/v1/runs/{args.id}/cancel"), ["state"])
    elif noun == "workflows":
        if verb == "create":
            _show(
                args,
                api.call("POST", "/v1/workflows", _body(args)),
                ["workflow_id", "name", "next_fire_at"],
            )
        elif verb == "get":
            _show(args, api.call("GET", f"/v1/workflows/{args.id}"))
        elif verb == "trigger":
            _show(args, api.call("POST", f"/v1/workflows/{args.id}/trigger"), ["workflow_run_id"])
        elif verb == "run":
            doc = api.call("GET", f"/v1/workflow-runs/{args.id}")
            if args.json:
                _show(args, doc)
            else:
                print(f"workflow run {doc.get('workflow_run_id')}: {doc.get('state')}")
                print(_table(doc.get("nodes", []), ["node", "state", "run_id"]))


def add_parsers(sub) -> None:
    """Register the admin nouns on the top-level `cronwheel` parser."""

    def verb(nouns, name, help_, *, ident=False, file=False, page=False):
        sp = nouns.add_parser(name, help=help_)
        if ident:
            sp.add_argument("id")
        if file:
            sp.add_argument("--file", "-f", required=True, help="JSON body, or - for stdin")
        if page:
            sp.add_argument("--cursor")
            sp.add_argument("--limit", type=int)
        sp.add_argument("--json", action="store_true", help="print the API's JSON")
        return sp

    t = sub.add_parser("tenants", help="tenants (operator key)").add_subparsers(
        dest="verb", required=True
    )
    sp = verb(t, "create", "create a tenant; prints its first API key once")
    sp.add_argument("name")
    sp.add_argument("--cell")
    sp.add_argument("--classes", help="priority classes it may use, comma-separated")
    verb(t, "list", "list tenants", page=True)
    sp = verb(t, "move", "move a tenant to another cell (through the router)", ident=True)
    sp.add_argument("--to", required=True, help="the target cell")
    sp.add_argument("--wait", action="store_true", help="until the move ends; fails unless done")

    k = sub.add_parser("keys", help="your tenant's API keys").add_subparsers(
        dest="verb", required=True
    )
    verb(k, "create", "issue another key (rotation)")
    verb(k, "list", "list keys")
    verb(k, "revoke", "revoke a key", ident=True)

    j = sub.add_parser("jobs", help="jobs").add_subparsers(dest="verb", required=True)
    verb(j, "list", "list jobs", page=True)
    verb(j, "get", "show a job", ident=True)
    verb(j, "create", "create a job from a JSON file", file=True)
    verb(j, "update", "change a job (JSON merge of the given fields)", ident=True, file=True)
    for name in ("pause", "resume", "trigger", "delete"):
        verb(j, name, f"{name} a job", ident=True)
    sp = verb(j, "backfill", "create the runs of past instants in a range", ident=True)
    sp.add_argument("--from", dest="from_", required=True)
    sp.add_argument("--to", required=True)

    r = sub.add_parser("runs", help="runs").add_subparsers(dest="verb", required=True)
    sp = verb(r, "list", "list runs", page=True)
    sp.add_argument("--job", dest="job_id")
    sp.add_argument("--state")
    sp.add_argument("--workflow-run", dest="workflow_run_id")
    verb(r, "get", "show a run and its attempts", ident=True)
    verb(r, "cancel", "cancel a run", ident=True)

    w = sub.add_parser("workflows", help="workflows").add_subparsers(dest="verb", required=True)
    verb(w, "create", "create a workflow from a JSON file", file=True)
    verb(w, "get", "show a workflow", ident=True)
    verb(w, "trigger", "start a workflow run now", ident=True)
    verb(w, "run", "show a workflow run and its nodes", ident=True)

    for noun in ("tenants", "keys", "jobs", "runs", "workflows"):
        sub.choices[noun].set_defaults(func=run_verb, noun=noun)
