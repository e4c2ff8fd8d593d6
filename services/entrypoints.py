"""The `cronwheel` command: the one place that wires the services in.

`cronwheel serve NAME...` and `cronwheel dev` start services; the admin verbs
(tenants, keys, jobs, runs, workflows) call the API (admin_cli.py); every other
verb (up, status, migrate, preview) is cronwheel.cli's, which knows no service.
`python -m services.entrypoints VERB ...` is the same command (the tests and
benches start services so). The services are imported here plainly, each only when it is the
one asked for, so that a reader and `lint-imports` see every arrow (the
package `cronwheel` never imports `services`: docs/architecture.md, Layers).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

SERVICES = ("gateway", "timer", "relay", "dispatcher", "workflow", "webhook", "executor")


def service_main(name: str) -> Callable[[], None]:
    """The `main()` of service `name`, importing that service alone."""
    match name:
        case "gateway":
            from services.gateway import main
        case "timer":
            from services.timer import main
        case "relay":
            from services.relay import main
        case "dispatcher":
            from services.dispatcher import main
        case "workflow":
            from services.workflow import main
        case "webhook":
            from services.webhook import main
        case "executor":
            from services.executor import main
        case _:
            raise ValueError(f"unknown service {name!r}")
    return main.main


def service_settings(name: str) -> type:
    """The settings class of service `name`: `<Name>Settings` in its main.py."""
    module = sys.modules[service_main(name).__module__]
    return getattr(module, f"{name.title()}Settings")


def cmd_serve(args) -> None:
    from cronwheel import config
    from cronwheel.cli import CliError
    from cronwheel.store.db import refuse_unsafe_role

    unknown = [s for s in args.services if s not in SERVICES]
    if unknown:
        raise CliError(f"unknown service {unknown[0]!r}; choose from {', '.join(SERVICES)}")
    for name in args.services:  # a bad value is its one line before the database is asked
        config.load(service_settings(name))
    refuse_unsafe_role()  # a login that bypasses row-level security starts nothing
    if len(args.services) == 1:
        service_main(args.services[0])()
        return
    _supervise(args.services)


def _dev_services() -> list[str]:
    """Every service; the executor only where its sandbox can run."""
    import shutil

    names = list(SERVICES)
    if not shutil.which("bwrap"):
        print("cronwheel dev: skipping the executor (bubblewrap is not installed)", file=sys.stderr)
        names.remove("executor")
    return names


def cmd_dev(args) -> None:
    if args.demo:
        from cronwheel import config
        from cronwheel.demo import demo_kafka, ensure_demo, operator_key
        from cronwheel.kafka import Topics

        gateway = config.load(service_settings("gateway"))
        topics = Topics(gateway.common.topic_prefix)
        demo = ensure_demo(gateway.common.database_url, topics)
        print(f"admin API     http://{gateway.serving.http_addr}/v1  (spec at /openapi.json)")
        print(f"console       http://{gateway.serving.http_addr}/ui/")
        print(f"operator key  {gateway.operator_key or operator_key()}")
        print(f"demo tenant   {demo['tenant_id']}  key {demo['api_key']}")
        print(f"demo queue    {topics.queue(demo['tenant_id'], 'demo')}")
        creds = demo_kafka(gateway.common.kafka_bootstrap, topics, demo["tenant_id"])
        if creds:
            print(f"demo kafka    CRONWHEEL_KAFKA_USERNAME={creds.username}"
                  f" CRONWHEEL_KAFKA_PASSWORD={creds.password}")  # fmt: skip
    _supervise(_dev_services())


def _supervise(names: list[str]) -> None:
    """Run each service as its own process under the supervisor: a service
    that dies is started again (with backoff and a line saying why) while the
    others go on; SIGINT/SIGTERM stops them all. Each service's settings are
    checked first, so a bad value is one line and exit status 1 here rather than
    a service dying at every restart."""
    from cronwheel import config
    from cronwheel.runtime import stop_on_signals
    from cronwheel.supervisor import Supervisor

    for name in names:
        config.load(service_settings(name))

    # This module by its import name (`__name__` is "__main__" under `python -m`).
    commands = {n: [sys.executable, "-m", __spec__.name, "serve", n] for n in names}
    Supervisor(commands, config.project_home()).run(stop_on_signals())


def add_verbs(sub: argparse._SubParsersAction) -> None:
    """The verbs cronwheel.cli does not know: serve, dev and the admin verbs."""
    from services import admin_cli

    sp = sub.add_parser("serve", help="run services")
    sp.add_argument("services", nargs="+", metavar="SERVICE")
    sp.set_defaults(func=cmd_serve)
    sp = sub.add_parser("dev", help="run every service in one command")
    sp.add_argument("--demo", action="store_true", help="create the demo tenant and job first")
    sp.set_defaults(func=cmd_dev)
    admin_cli.add_parsers(sub)


def main(argv: list[str] | None = None) -> int:
    try:
        from cronwheel import cli
        from services import admin_cli  # noqa: F401  (httpx: the server's packages)
    except ModuleNotFoundError as e:  # a worker's install: the SDK's packages only
        print(
            f"cronwheel: {e}: the command runs the platform; pip install 'cronwheel[server]'",
            file=sys.stderr,
        )
        return 1
    return cli.main(argv, add_verbs=add_verbs)


if __name__ == "__main__":
    sys.exit(main())
