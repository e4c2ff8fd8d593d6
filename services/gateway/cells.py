"""The cell a gateway serves, and the tenants homed in it (docs/cells.md).

A cell's gateway serves only the tenants the directory homes in its cell.
Given another cell's tenant (a stale route, a client with an old address) it
answers `421 Misdirected Request` with the home cell (`cell`, and that cell's
`api_url`) in the problem document, before any transaction: a request that
reached the wrong cell cannot write there. Which tenant a request is for:

- a tenant key: the key's tenant. A key issued with cells names its tenant
  (`cw_<tenant_id>.<secret>`, store/jobs.py), so a key this cell's database
  does not know still says whose it is; a key of before (`cw_<secret>`) is
  its own cell's, where its tenant's rows are;
- an operator request under `/v1/tenants/{id}`: that tenant;
- `POST /v1/tenants`: the `cell` asked for (routes/tenants.py).

Without a directory (CRONWHEEL_DIRECTORY_URL unset) there is one cell and
nothing is refused. A tenant the directory does not know (made before cells),
or a directory that is away with nothing cached, leaves the decision to the
cell's own database, which has the tenant's rows or not.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from cronwheel import config
from cronwheel.directory import Directory, DirectoryUnavailable, tenant_of_key, tenant_of_path
from cronwheel.store.directory import Placement
from services.gateway.problems import Problem

__all__ = ["Homing", "homing_of", "tenant_of_key", "tenant_of_path"]


class Homing:
    """This gateway's cell, the directory (None: one cell) and the checks."""

    def __init__(self, cell: str, bootstrap: str, directory: Directory | None):
        self.cell = cell
        self.bootstrap = bootstrap
        self.directory = directory

    # -- placement -----------------------------------------------------------
    def known_cells(self) -> list[str]:
        if self.directory is None:
            return [self.cell]
        return list(self._cells())

    def default_cell(self) -> str:
        """Where a tenant created without `cell` is homed: the directory's
        first cell; this one without a directory."""
        if self.directory is None:
            return self.cell
        return next(iter(self._cells()), self.cell)

    def _cells(self):
        try:
            return self.directory.cells()  # type: ignore[union-attr]
        except DirectoryUnavailable as e:
            raise _unavailable() from e

    def place(self, tenant_id: str, cell: str) -> Placement | None:
        """Record a new tenant's home (None without a directory). Called in
        the tenant's creating transaction, last: if it fails the cell's rows
        roll back; if the cell's commit fails after it, the directory names a
        tenant no cell has, whose requests find no key (401)."""
        if self.directory is None:
            return None
        try:
            return self.directory.place(tenant_id, cell)
        except DirectoryUnavailable as e:
            raise _unavailable() from e

    def state_of(self, tenant_id: str) -> str:
        """The tenant's state in the directory; `active` without one, or
        while the directory is away."""
        if self.directory is None:
            return "active"
        try:
            placed = self.directory.placement(tenant_id)
        except DirectoryUnavailable:
            return "active"
        return placed.state if placed is not None else "active"

    # -- the 421 -------------------------------------------------------------
    async def refuse_elsewhere(self, tenant_id: str, *, write: bool = False) -> None:
        """Problem 421 when the directory homes `tenant_id` in another cell;
        503 with Retry-After for a `write` while a move has it frozen (reads
        go on)."""
        if self.directory is None:
            return
        placed = self.directory.cached(tenant_id)
        if placed is False:
            try:
                placed = await run_in_threadpool(self.directory.placement, tenant_id)
            except DirectoryUnavailable:
                return  # the cell's own rows decide (module docstring)
        if placed is not None and placed.cell != self.cell:
            raise self.misdirected(placed.cell, f"tenant {tenant_id} is homed in cell")
        if write and placed is not None and placed.state == "frozen":
            raise Problem(
                503,
                "TENANT_MOVING",
                f"tenant {tenant_id} is being moved to another cell; retry",
                headers={"Retry-After": "1"},
            )

    def misdirected(self, home: str, what: str) -> Problem:
        extensions = {"cell": home}
        try:
            info = self.directory.cells().get(home) if self.directory else None
        except DirectoryUnavailable:
            info = None
        if info is not None:
            extensions["api_url"] = info.api_url
        return Problem(
            421,
            "MISDIRECTED",
            f"{what} {home!r}, not {self.cell!r}: send its requests to that cell's "
            "gateway, or to the router",
            extensions=extensions,
        )


def _unavailable() -> Problem:
    return Problem(
        503,
        "UNAVAILABLE",
        "the directory of cells is unavailable; retry",
        headers={"Retry-After": "1"},
    )


def homing_of(app) -> Homing:
    """The app's Homing, made on first use from the gateway's cell and broker
    and the settings (config.Cells)."""
    homing = getattr(app.state, "homing", None)
    if homing is None:
        gateway = app.state.gateway
        settings = config.load(config.Cells)
        directory = None
        if settings.directory_url:
            directory = Directory(settings.directory_url, ttl_s=settings.directory_ttl_ms / 1000)
        homing = app.state.homing = Homing(gateway.cell, gateway.bootstrap, directory)
    return homing
