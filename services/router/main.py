"""`cronwheel serve router`: the public address (CRONWHEEL_HTTP_ADDR, default
127.0.0.1:8080) in front of the cells' gateways; `cronwheel dev --cells` runs
it there and each cell's gateway on a port of its own. Settings:
RouterSettings (docs/settings.md)."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel import config, metrics
from cronwheel.config import Cells, Common, Metrics, Serving, group, setting
from cronwheel.moves import MoveSettings
from cronwheel.runtime import freeze_heap, setup_logging, stop_on_signals


@dataclass(frozen=True)
class RouterSettings:
    common: Common = group(Common)  # its log level
    serving: Serving = group(Serving)  # its address
    cells: Cells = group(Cells)  # the directory: required here
    metrics: Metrics = group(Metrics)  # services/router/metrics.py
    # The operator's key, as every cell's gateway has it (unset: the local
    # stack's, cronwheel/demo.py); the router only compares it.
    operator_key: str | None = setting("CRONWHEEL_OPERATOR_KEY", None)
    # Each cell's database as its owner, for the move protocol
    # (services/router/moves.py): `us=postgresql://...,eu=postgresql://...`.
    # Unset: the local stack's cells (cells.json), or no moves without them.
    cell_databases: str | None = setting("CRONWHEEL_CELL_DATABASES", None, secret=True)
    # Each cell's broker and a principal that may alter it, for the move's
    # Kafka side (cronwheel/moves_kafka.py): `us=USER:PASSWORD@HOST:PORT,...`.
    # Unset: the local stack's cells' brokers when CRONWHEEL_CELL_DATABASES is
    # unset too, else none (a move leaves Kafka alone).
    cell_brokers: str | None = setting("CRONWHEEL_CELL_BROKERS", None, secret=True)
    # How long a moved tenant's copy (rows, topics, principal) stays in the
    # cell it left, frozen, before it is removed (docs/cells.md, "After the
    # switch"). 0: at the switch.
    move_source_retention_s: float = setting("CRONWHEEL_MOVE_SOURCE_RETENTION_S", 0.0, minimum=0)
    # After the switch, how long the source's topics wait for the tenant's
    # workers to read them to the end before they are removed anyway.
    move_linger_s: float = setting("CRONWHEEL_MOVE_LINGER_S", MoveSettings.linger_s, minimum=0)


def cell_databases(text: str | None) -> dict[str, str]:
    """`name=url,...` as a dict; unset: the local cells' owner URLs."""
    if text:
        pairs = (item.partition("=") for item in text.split(",") if item.strip())
        return {name.strip(): url.strip() for name, _, url in pairs}
    from cronwheel.stack import cells

    return {c.name: c.admin_database_url for c in cells.configured()}


def main() -> None:
    import asyncio
    import threading

    import uvicorn

    from cronwheel.demo import operator_key
    from cronwheel.directory import Directory
    from cronwheel.kafka import Topics
    from cronwheel.moves import Mover
    from cronwheel.moves_kafka import CellBrokers, deployment_brokers, local_brokers
    from services.router.app import create_app

    settings = config.load(RouterSettings)
    if not settings.cells.directory_url:
        raise config.SettingsError(
            "CRONWHEEL_DIRECTORY_URL", "", "the directory's database URL: the router routes by it"
        )
    log = setup_logging("router", settings.common.log_level)
    metrics.serve("router", settings.metrics)
    directory = Directory(
        settings.cells.directory_url, ttl_s=settings.cells.directory_ttl_ms / 1000
    )
    dsns = cell_databases(settings.cell_databases)
    # The cells' brokers for the move's Kafka side: the setting's, else the
    # local cells' beside the local cells' databases.
    if settings.cell_brokers:
        try:
            brokers = deployment_brokers(settings.cell_brokers)
        except ValueError as e:
            raise config.SettingsError("CRONWHEEL_CELL_BROKERS", "(secret)", str(e)) from e
        if missing := sorted(set(dsns) - set(brokers)):
            raise config.SettingsError(
                "CRONWHEEL_CELL_BROKERS",
                "(secret)",
                f"a broker for every cell of CRONWHEEL_CELL_DATABASES (none for {missing[0]!r})",
            )
    else:
        brokers = None if settings.cell_databases else local_brokers()
    kafka = CellBrokers(brokers, Topics(settings.common.topic_prefix)) if brokers else None
    ttl_s = settings.cells.directory_ttl_ms / 1000
    moving = MoveSettings(
        kafka=kafka,
        directory_ttl_s=ttl_s,
        source_retention_s=settings.move_source_retention_s,
        linger_s=settings.move_linger_s,
    )
    mover = Mover(settings.cells.directory_url, dsns, moving) if dsns else None
    app = create_app(directory, settings.operator_key or operator_key(), mover)
    if app.state.router.moves is not None:
        app.state.router.moves.resume()
        app.state.router.moves.sweep_kept_sources()
    host, _, port = settings.serving.http_addr.rpartition(":")
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host.strip("[]") or "127.0.0.1",
            port=int(port),
            log_level=settings.common.log_level.lower(),
            access_log=False,
            lifespan="off",
            log_config=None,
        )
    )
    freeze_heap()
    stop = stop_on_signals()

    def watch() -> None:
        stop.wait()
        server.should_exit = True

    threading.Thread(target=watch, daemon=True, name="router-stop").start()
    log.info("router listening on http://%s/v1", settings.serving.http_addr)
    try:
        asyncio.run(server.serve())
    finally:
        directory.close()


if __name__ == "__main__":
    main()
