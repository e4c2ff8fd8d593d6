"""The `cronwheel` command. Each verb translates arguments into one call into the
stack, the store or the core; errors become one readable line and exit code 1."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from cronwheel import config
from cronwheel.cli_admin import add_parsers as add_admin_parsers
from cronwheel.kafka import Topics

SERVICES = ["gateway", "timer", "relay", "dispatcher", "workflow", "webhook", "executor"]


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def cmd_up(args) -> None:
    from cronwheel import stack

    st = stack.up()
    _print_json(st) if args.json else _print_status(st)


def cmd_down(args) -> None:
    from cronwheel import stack

    st = stack.down()
    _print_json(st) if args.json else _print_status(st)


def cmd_status(args) -> None:
    from cronwheel import stack

    st = stack.status()
    _print_json(st) if args.json else _print_status(st)


def _print_status(st: dict) -> None:
    print(f"postgres  {st['postgres']:<24} {st['database_url']}")
    print(f"kafka     {st['kafka']:<24} {st['kafka_bootstrap']}")
    for name, svc in sorted((st.get("services") or {}).items()):
        state = f"{svc['state']} (pid {svc['pid']})" if svc.get("pid") else svc["state"]
        line = f"{name:<9} {state:<24} restarts {svc['restarts']}"
        if svc.get("last_exit"):
            line += f", last: {svc['last_exit']}"
        print(line)


def cmd_migrate(args) -> None:
    from cronwheel.store.migrate import migrate

    applied = migrate(config.database_url())
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    if not applied:
        print("schema up to date")


def available_services() -> list[str]:
    found = []
    for name in SERVICES:
        try:
            importlib.import_module(f"services.{name}.main")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("services."):
                continue
            raise
        found.append(name)
    return found


def cmd_serve(args) -> None:
    unknown = [s for s in args.services if s not in SERVICES]
    if unknown:
        raise CliError(f"unknown service {unknown[0]!r}; choose from {', '.join(SERVICES)}")
    missing = [s for s in args.services if s not in available_services()]
    if missing:
        raise CliError(f"service {missing[0]!r} is not built yet in this version")
    if len(args.services) == 1:
        importlib.import_module(f"services.{args.services[0]}.main").main()
        return
    _supervise(args.services)


def _dev_services() -> list[str]:
    """Every built service; the executor only where its sandbox can run."""
    import shutil

    names = available_services()
    if "executor" in names and not shutil.which("bwrap"):
        print("cronwheel dev: skipping the executor (bubblewrap is not installed)", file=sys.stderr)
        names.remove("executor")
    return names


def cmd_dev(args) -> None:
    if args.demo:
        from cronwheel.demo import ensure_demo, operator_key

        demo = ensure_demo(config.database_url())
        if "gateway" in available_services():
            print(f"admin API     http://{config.http_addr()}/v1  (spec at /openapi.json)")
        print(f"operator key  {operator_key()}")
        print(f"demo tenant   {demo['tenant_id']}  key {demo['api_key']}")
        print(f"demo queue    {Topics.from_env().queue(demo['tenant_id'], 'demo')}")
    _supervise(_dev_services())


def _supervise(names: list[str]) -> None:
    """Run each service as its own process under the supervisor: a service
    that dies is started again (with backoff and a line saying why) while the
    others go on; SIGINT/SIGTERM stops them all."""
    from cronwheel.runtime import stop_on_signals
    from cronwheel.supervisor import Supervisor

    commands = {n: [sys.executable, "-m", "cronwheel.cli", "serve", n] for n in names}
    home = config.project_home()
    Supervisor(commands, home).run(stop_on_signals())


def cmd_preview(args) -> None:
    from cronwheel.core.preview import preview_json, render_table

    spec = {"cron": args.cron, "timezone": args.tz, "dst": {"gap": args.gap, "repeat": args.repeat}}
    doc = preview_json(spec, count=args.count, from_iso=args.from_)
    if args.json:
        _print_json(doc)
    else:
        print(render_table(doc))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cronwheel", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, help_ in [
        ("up", cmd_up, "start the local PostgreSQL and Kafka (idempotent)"),
        ("down", cmd_down, "stop the local stack, leaving no process behind"),
        ("status", cmd_status, "show the local stack and its addresses"),
    ]:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--json", action="store_true")
        sp.set_defaults(func=fn)
    sub.add_parser("migrate", help="apply pending migrations").set_defaults(func=cmd_migrate)
    sp = sub.add_parser("serve", help="run services")
    sp.add_argument("services", nargs="+", metavar="SERVICE")
    sp.set_defaults(func=cmd_serve)
    sp = sub.add_parser("dev", help="run every service in one command")
    sp.add_argument("--demo", action="store_true", help="create the demo tenant and job first")
    sp.set_defaults(func=cmd_dev)
    sp = sub.add_parser("preview", help="the next fire instants of a cron schedule")
    sp.add_argument("cron")
    sp.add_argument("--tz", default="UTC")
    sp.add_argument("--count", type=int, default=10)
    sp.add_argument("--from", dest="from_", default=None)
    sp.add_argument("--gap", choices=["shift", "skip"], default="shift")
    sp.add_argument("--repeat", choices=["first", "last", "both"], default="first")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_preview)
    add_admin_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one readable line for people; details with CRONWHEEL_DEBUG=1
        if os.environ.get("CRONWHEEL_DEBUG"):
            raise
        print(f"cronwheel: {_one_line(e)}", file=sys.stderr)
        return 1
    return 0


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
