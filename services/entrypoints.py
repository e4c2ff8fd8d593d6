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
# Every cell runs SERVICES; the router runs once, in front of the cells (docs/cells.md).
SERVABLE = (*SERVICES, "router")


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
        case "router":
            from services.router import main
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

    unknown = [s for s in args.services if s not in SERVABLE]
    if unknown:
        raise CliError(f"unknown service {unknown[0]!r}; choose from {', '.join(SERVABLE)}")
    if args.cell is not None:
        from cronwheel.stack import cells

        cells.become(args.cell)
    if "router" in args.services:
        _local_directory()
    config.load(config.Logs)  # a bad value is its one line before the database is asked
    for name in args.services:
        config.load(service_settings(name))
    if args.services != ["router"]:  # the router reads the directory alone
        refuse_unsafe_role()  # a login that bypasses row-level security starts nothing
    if len(args.services) == 1:
        service_main(args.services[0])()
        return
    _supervise(args.services)


def _local_directory() -> None:
    """The router's directory: CRONWHEEL_DIRECTORY_URL, else the local
    stack's when it has cells."""
    import os

    from cronwheel.stack import cells

    if not os.environ.get("CRONWHEEL_DIRECTORY_URL", "").strip() and cells.configured():
        os.environ["CRONWHEEL_DIRECTORY_URL"] = cells.directory_url()


def _dev_services() -> list[str]:
    """Every service; the executor only where its sandbox can run."""
    import shutil

    names = list(SERVICES)
    if not shutil.which("bwrap"):
        print("cronwheel dev: skipping the executor (bubblewrap is not installed)", file=sys.stderr)
        names.remove("executor")
    return names


def cmd_dev(args) -> None:
    if args.cells is not None:
        _dev_cells(args)
        return
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
    _supervise(_dev_services(), extra=dev_retention())


# How often `cronwheel dev` runs run history's retention (a deployment's
# schedule: deploy/docker-compose.yml, deploy/k8s/retention-cronjob.yaml).
DEV_RETENTION_EVERY_S = 3600


def dev_retention(cells: list[str] | None = None) -> dict[str, list[str]]:
    """`cronwheel dev`'s retention processes: `cronwheel retention --every`,
    as the local stack's owner (config.database_url), supervised with the
    services: the day partitions a week ahead, the days past the retention
    dropped (docs/migrations.md, "Worked example: run retention"). With
    `cells`, one a cell (`--cell NAME`): each cell's run history is its own."""
    me = [sys.executable, "-m", __spec__.name, "retention"]
    every = ["--every", str(DEV_RETENTION_EVERY_S)]
    if cells is None:
        return {"retention": [*me, *every]}
    return {f"{cell}/retention": [*me, "--cell", cell, *every] for cell in cells}


def _dev_cells(args) -> None:
    """Every service of every cell (`cronwheel serve --cell NAME SERVICE`, each
    gateway on its cell's port) and the router on the public address."""
    from cronwheel import config
    from cronwheel.cli import CliError
    from cronwheel.runtime import stop_on_signals
    from cronwheel.stack import cells
    from cronwheel.supervisor import Supervisor

    names = cells.parse_names(args.cells)
    have = [c.name for c in cells.configured()]
    if names != have:
        raise CliError(f"the stack's cells are {have or 'none'}: run `cronwheel up --cells "
                       f"{','.join(names)}` and `cronwheel migrate` first")  # fmt: skip
    if args.demo:
        raise CliError("--demo makes its tenant in one cell's stack: run it without --cells")
    _local_directory()
    config.load(service_settings("router"))
    me = [sys.executable, "-m", __spec__.name, "serve"]
    commands = {
        f"{cell}/{svc}": [*me, "--cell", cell, svc] for cell in names for svc in _dev_services()
    }
    commands["router"] = [*me, "router"]
    commands.update(dev_retention(names))
    for cell in cells.configured():
        print(f"cell {cell.name:<9} {cell.api_url}/v1  kafka {cell.kafka_bootstrap}")
    print(f"router        http://{config.http_addr()}/v1  (every tenant, every cell)")
    Supervisor(commands, config.project_home()).run(stop_on_signals())


def _supervise(names: list[str], extra: dict[str, list[str]] | None = None) -> None:
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
    Supervisor({**commands, **(extra or {})}, config.project_home()).run(stop_on_signals())


def add_verbs(sub: argparse._SubParsersAction) -> None:
    """The verbs cronwheel.cli does not know: serve, dev and the admin verbs."""
    from services import admin_cli

    sp = sub.add_parser("serve", help="run services")
    sp.add_argument("services", nargs="+", metavar="SERVICE")
    sp.add_argument("--cell", default=None, metavar="NAME",
                    help="as cell NAME of `cronwheel up --cells` (docs/cells.md)")  # fmt: skip
    sp.set_defaults(func=cmd_serve)
    sp = sub.add_parser("dev", help="run every service in one command")
    sp.add_argument("--demo", action="store_true", help="create the demo tenant and job first")
    sp.add_argument("--cells", default=None, metavar="NAMES",
                    help="every service per cell, and the router on the public address")  # fmt: skip
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
