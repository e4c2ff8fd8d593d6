"""The `cronwheel` command's verbs that need no service: the local stack,
migrations and schedule previews. Each translates arguments into one call into
the stack, the store or the core; errors become one readable line and exit
code 1.

The command itself is services.entrypoints (`cronwheel`, or `python -m
services.entrypoints`), which adds `serve`, `dev` and the admin verbs (an HTTP
client, services/admin_cli.py): this package imports no service and calls no
HTTP (docs/architecture.md, Layers).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from cronwheel import config

# The entry point's verbs: called with the parser's subparsers to add its own.
AddVerbs = Callable[[argparse._SubParsersAction], None]


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def cmd_up(args) -> None:
    from cronwheel import stack
    from cronwheel.stack import cells

    st = stack.up(cells.parse_names(args.cells) if args.cells is not None else None)
    _print_json(st) if args.json else _print_status(st)


def cmd_down(args) -> None:
    from cronwheel import stack

    st = stack.down()
    _print_json(st) if args.json else _print_status(st)


def cmd_status(args) -> None:
    from cronwheel import stack

    st = stack.status()
    _print_json(st) if args.json else _print_status(st)


def masked_url(url: str) -> str:
    """A database URL for people to read: its password (in the user part or a
    `password=` parameter) replaced by `***`. `status --json` keeps the URL
    whole, for the tools that connect with it."""
    import re
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, sep, _password = user.partition(":")
        netloc = f"{name}{':***' if sep else ''}@{host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _print_status(st: dict) -> None:
    print(f"postgres  {st['postgres']:<24} {masked_url(st['database_url'])}")
    print(f"kafka     {st['kafka']:<24} {st['kafka_bootstrap']}")
    for name, cell in (st.get("cells") or {}).items():
        print(f"cell {name:<4} postgres {cell['postgres']:<24} kafka {cell['kafka']:<24}"
              f" {cell['api_url']}")  # fmt: skip
    if "directory_url" in st:
        print(f"directory {masked_url(st['directory_url'])}")
    for name, svc in sorted((st.get("services") or {}).items()):
        state = f"{svc['state']} (pid {svc['pid']})" if svc.get("pid") else svc["state"]
        line = f"{name:<9} {state:<24} restarts {svc['restarts']}"
        if svc.get("last_exit"):
            line += f", last: {svc['last_exit']}"
        print(line)


def cmd_migrate(args) -> None:
    from cronwheel.store.migrate import discover, migrate, pending

    if args.dump_schema is not None:
        from cronwheel.store import schema_snapshot

        path = Path(args.dump_schema) if args.dump_schema else schema_snapshot.SCHEMA_FILE
        try:
            schema_snapshot.write(config.database_url(), path)
        except schema_snapshot.SnapshotError as e:
            raise CliError(str(e)) from None
        print(f"wrote {path}")
        return
    url = config.database_url()
    if args.status:
        waiting = {m.version for m in pending(url)}
        for m in discover():
            kind = "contract" if m.contract else "expand"
            state = "pending" if m.version in waiting else "applied"
            print(f"{m.version:04d}_{m.name:<40} {kind:<8} {state}")
        for line in _backfill_lines(url):
            print(line)
        return
    applied = migrate(url, contract=args.contract)
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    waiting = pending(url)
    for m in waiting:
        print(f"pending {m.version:04d}_{m.name} (contract step: `cronwheel migrate --contract`)")
    # With cells: every cell's database and the directory's (stack/cells.py).
    cell_lines = _migrate_cells(args.contract)
    for line in cell_lines:
        print(line)
    if not applied and not waiting and not cell_lines:
        print("schema up to date")


def _backfill_lines(url: str) -> list[str]:
    """The backfills' progress (run_history.py), one line each."""
    import psycopg

    from cronwheel.store import runs_daily

    with psycopg.connect(url, autocommit=True) as conn:
        rows = runs_daily.backfill_rows(conn)
        dropped = bool(rows) and not runs_daily.legacy_runs_exist(conn)
    lines = []
    for r in rows:
        if r["finished_at"] is not None:
            state = f"done at {r['finished_at']:%Y-%m-%d %H:%M:%S}"
        elif dropped:
            state = "done: nothing to copy, `runs` was dropped (contract step)"
        elif r["started_at"] is None:
            state = "not started: `cronwheel backfill`"
        else:
            state = f"running, last batch at {r['updated_at']:%Y-%m-%d %H:%M:%S}"
        total = f" of ~{r['total']}" if r["total"] else ""
        lines.append(
            f"backfill {r['name']:<31} visited {r['visited']}{total}, copied {r['copied']}"
            f" runs and {r['copied_attempts']} attempts; {state}"
        )
    return lines


def cmd_backfill(args) -> None:
    """Copy runs and run_attempts into the day-partitioned tables (migration
    0025), batched, throttled and resumable, beside the running services.
    After the contract step that drops `runs` (0031): one line, nothing done."""
    import psycopg

    from cronwheel import metrics, run_history
    from cronwheel.runtime import stop_on_signals
    from cronwheel.store import runs_daily

    url = config.database_url()
    with psycopg.connect(url, autocommit=True) as conn:
        if not runs_daily.legacy_runs_exist(conn):
            print("backfill runs_daily: done, nothing to copy (`runs` was dropped by the"
                  " contract step)")  # fmt: skip
            return
        if args.reset:
            runs_daily.backfill_reset(conn)
    if args.metrics_addr:
        metrics.serve("backfill", config.Metrics(addr=args.metrics_addr, port=None))
    retention = config.load(config.RunRetention)
    options = run_history.BackfillOptions(args.batch, args.rate, retention.days)
    p = run_history.backfill(url, options, stop_on_signals())
    print(
        f"backfill runs_daily: visited {p.visited}, copied {p.copied} runs and"
        f" {p.copied_attempts} attempts; {'done' if p.done else 'stopped, resumable'}"
    )


def cmd_retention(args) -> None:
    """Make the day partitions ahead and drop the days past the retention."""
    from cronwheel import run_history
    from cronwheel.runtime import stop_on_signals

    if args.cell is not None:
        from cronwheel.stack import cells

        cells.become(args.cell)
    retention = config.load(config.RunRetention)
    stop = stop_on_signals()
    while True:
        done = run_history.retention_pass(
            config.database_url(), retention.days, retention.ahead_days
        )
        print(
            f"retention: made {len(done.made)} days, dropped {len(done.dropped)} days,"
            f" deleted {done.default_deleted} expired runs from the default partition",
            flush=True,
        )
        if not args.every or stop.wait(args.every):
            return


def _migrate_cells(contract: bool) -> list[str]:
    if config.external_database():
        return []
    from cronwheel.stack import cells

    configured = cells.configured()
    return cells.migrate(configured, contract) if configured else []


def cmd_secrets_new_key(args) -> None:
    """A fresh key for CRONWHEEL_SECRET_KEYS, as `ID:KEY` (docs/webhooks.md)."""
    import time

    from cronwheel.core.sealing import new_key

    print(f"{args.id or time.strftime('k%Y%m%d')}:{new_key()}")


def cmd_secrets_reseal(args) -> None:
    """Seal every webhook secret and every tenant's kept Kafka credential with
    the first key of CRONWHEEL_SECRET_KEYS: rows from before migrations 0016
    and 0027, and rows of a key being rotated out."""
    import psycopg

    from cronwheel.store import tenant_credentials, webhooks

    keyring = config.secret_keyring()
    with psycopg.connect(config.database_url(), autocommit=True) as conn:
        n = webhooks.reseal(conn, batch=args.batch)
        m = tenant_credentials.reseal(conn, batch=args.batch)
    print(
        f"resealed {n} webhook secrets and {m} tenants' Kafka credentials"
        f" with key {keyring.current_id}"
    )


def cmd_kafka_grant(args) -> None:
    """The platform's principals and ACLs on a deployment's broker, run as its
    admin (CRONWHEEL_KAFKA_USERNAME / _PASSWORD in the environment). A role's
    password comes from CRONWHEEL_KAFKA_PASSWORD_<ROLE> when set, else a new
    one is made; each role's is printed once, as the line its service's
    environment needs. docs/kafka-auth.md."""
    from cronwheel import kafka, principals

    prefix = args.prefix or config.load(config.Common).topic_prefix
    passwords = {}
    for role in principals.ROLES:
        env = f"CRONWHEEL_KAFKA_PASSWORD_{role.upper()}"
        passwords[role] = os.environ.get(env) or principals.new_password()
    admin = kafka.admin(principal="admin")
    principals.grant_platform(admin, prefix, passwords if args.users else None)
    print(f"ACLs granted for topic prefix {prefix!r}")
    if args.users:
        for role, password in passwords.items():
            print(f"{role}: CRONWHEEL_KAFKA_USERNAME={principals.username(role)}"
                  f" CRONWHEEL_KAFKA_PASSWORD={password}")  # fmt: skip


def cmd_preview(args) -> None:
    from cronwheel.core.preview import preview_json, render_table

    spec = {"cron": args.cron, "timezone": args.tz, "dst": {"gap": args.gap, "repeat": args.repeat}}
    doc = preview_json(spec, count=args.count, from_iso=args.from_)
    if args.json:
        _print_json(doc)
    else:
        print(render_table(doc))


def build_parser(add_verbs: AddVerbs | None = None) -> argparse.ArgumentParser:
    """The parser; `add_verbs(subparsers)` adds the entry point's own verbs."""
    p = argparse.ArgumentParser(prog="cronwheel", description="cronwheel: a shared job scheduler")
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, help_ in [
        ("up", cmd_up, "start the local PostgreSQL and Kafka (idempotent)"),
        ("down", cmd_down, "stop the local stack and its cells, leaving no process behind"),
        ("status", cmd_status, "show the local stack and its addresses"),
    ]:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--json", action="store_true")
        sp.set_defaults(func=fn)
        if name == "up":
            sp.add_argument(
                "--cells",
                default=None,
                metavar="NAMES",
                help="comma-separated cells (e.g. us,eu), each with its own PostgreSQL and "
                "Kafka, and the directory's database; remembered until `down` (docs/cells.md)",
            )
    sp = sub.add_parser("migrate", help="apply pending migrations")
    sp.add_argument(
        "--dump-schema",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="migrate a scratch database and write its schema (default cronwheel/store/schema.sql)",
    )
    sp.add_argument(
        "--contract",
        action="store_true",
        help="also apply the contract steps (NNNN_contract_*.sql), which drop the old shape: "
        "only once no running version reads it",
    )
    sp.add_argument(
        "--status",
        action="store_true",
        help="list every migration, expand or contract, applied or pending; apply nothing",
    )
    sp.set_defaults(func=cmd_migrate)
    sp = sub.add_parser(
        "backfill", help="copy run history into its day partitions (resumable; issue 25)"
    )
    sp.add_argument("--batch", type=int, default=1000, help="runs a transaction (1000)")
    sp.add_argument("--rate", type=float, default=None, help="runs a second at most")
    sp.add_argument("--reset", action="store_true", help="start the copy over from the first run")
    sp.add_argument("--metrics-addr", default=None, metavar="HOST:PORT",
                    help="serve the progress gauges for Prometheus there")  # fmt: skip
    sp.set_defaults(func=cmd_backfill)
    sp = sub.add_parser(
        "retention", help="make run history's days ahead, drop those past the retention"
    )
    sp.add_argument("--every", type=float, default=None, metavar="SECONDS",
                    help="repeat the pass until SIGTERM")  # fmt: skip
    sp.add_argument("--cell", default=None, metavar="NAME",
                    help="cell NAME's run history (a stack of `cronwheel up --cells`)")  # fmt: skip
    sp.set_defaults(func=cmd_retention)
    if add_verbs is not None:
        add_verbs(sub)
    secrets = sub.add_parser("secrets", help="the keys that seal secrets at rest")
    verbs = secrets.add_subparsers(dest="secrets_command", required=True)
    sp = verbs.add_parser("new-key", help="print a new key for CRONWHEEL_SECRET_KEYS")
    sp.add_argument("--id", default=None, help="its key id (default kYYYYMMDD)")
    sp.set_defaults(func=cmd_secrets_new_key)
    sp = verbs.add_parser(
        "reseal", help="seal every webhook secret and tenant Kafka credential with the first key"
    )
    sp.add_argument("--batch", type=int, default=500)
    sp.set_defaults(func=cmd_secrets_reseal)
    kafka_verbs = sub.add_parser("kafka", help="the broker's principals and ACLs").add_subparsers(
        dest="kafka_command", required=True
    )
    sp = kafka_verbs.add_parser("grant", help="make the platform's principals and their ACLs")
    sp.add_argument("--prefix", default=None, help="topic prefix (default CRONWHEEL_TOPIC_PREFIX)")
    sp.add_argument("--no-users", dest="users", action="store_false",
                    help="ACLs only; the principals exist already")  # fmt: skip
    sp.set_defaults(func=cmd_kafka_grant)
    sp = sub.add_parser("preview", help="the next fire instants of a cron schedule")
    sp.add_argument("cron")
    sp.add_argument("--tz", default="UTC")
    sp.add_argument("--count", type=int, default=10)
    sp.add_argument("--from", dest="from_", default=None)
    sp.add_argument("--gap", choices=["shift", "skip"], default="shift")
    sp.add_argument("--repeat", choices=["first", "last", "both"], default="first")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_preview)
    return p


def main(argv: list[str] | None = None, add_verbs: AddVerbs | None = None) -> int:
    args = build_parser(add_verbs).parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one readable line for people; details with CRONWHEEL_DEBUG=1
        if os.environ.get("CRONWHEEL_DEBUG"):
            raise
        hint = ""
        if isinstance(e, ModuleNotFoundError):  # a worker's install: the SDK's packages only
            hint = "; the platform's commands need: pip install 'cronwheel[server]'"
        print(f"cronwheel: {_one_line(e)}{hint}", file=sys.stderr)
        return 1
    return 0


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
