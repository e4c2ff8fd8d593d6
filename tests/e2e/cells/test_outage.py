"""A cell's outage touches its own tenants only (issue 24; docs/cells.md,
"A cell's outage"): two real cells (the package's stack, conftest.py: each
its own PostgreSQL and Kafka, its services, the router in front),
`eu`'s PostgreSQL stopped with `pg_ctl stop` as the stack stops it.

- `us`'s tenant fires on: every instant of its 500 ms job has exactly one
  run, none missing, before, during and after (its lateness before and during
  is printed, not asserted);
- `eu`'s tenant gets 503 with Retry-After through the router, the problem
  naming the cell, while `eu`'s database refuses connections (checked beside
  every such request: the proof that the fault landed);
- when `eu`'s database is back its jobs catch up per their misfire policy:
  `all` fires every instant of the outage once, `latest` one run that covers
  them, and both fire on after.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from cronwheel import config
from cronwheel.core.clock import now_ms, to_ms
from cronwheel.stack.postgres import SERVICE_USER, LocalPostgres, ensure_installed
from cronwheel.stack.process import as_user, is_root, port_open
from tests.support.cells import ROUTER, bearer, new_tenant
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e

EVERY_MS = 500
OUTAGE_MIN_S = 8.0  # eu's database stays down at least this long


def _job(tenant: dict, name: str, catchup: dict | None = None) -> str:
    schedule: dict = {"every_ms": EVERY_MS}
    if catchup:
        schedule["catchup"] = catchup
    body = {"name": name, "schedule": schedule, "target": {"type": "queue", "queue": "q"}}
    answer = httpx.post(
        f"{ROUTER}/v1/jobs", json=body, headers=bearer(tenant["api_key"]), timeout=30
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["job_id"]


def _runs(url: str, job_id: str) -> list[tuple[int, int, list[int] | None]]:
    """(instant ms, created_at ms, covers) of the job's runs in one cell."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT scheduled_at, created_at, covers FROM runs_daily WHERE job_id = %s"
            " ORDER BY scheduled_at",
            [job_id],
        ).fetchall()
    return [(to_ms(r[0]), to_ms(r[1]), r[2]) for r in rows]


def _refuses(url: str) -> bool:
    """Whether the database refuses a new connection now."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=3):
            return False
    except psycopg.OperationalError:
        return True


def _stop_postgres(home: Path) -> None:
    """`pg_ctl stop` of a cell's cluster, as `cronwheel down` stops it."""
    data = LocalPostgres(home).data
    owner = SERVICE_USER if is_root() else None
    argv = [str(ensure_installed() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]
    subprocess.run(as_user(owner, argv), check=True, capture_output=True, timeout=60)


def _one_each_none_missing(instants: list[int]) -> None:
    assert len(instants) == len(set(instants)), "an instant fired twice"
    gaps = {b - a for a, b in zip(instants, instants[1:], strict=False)}
    assert gaps <= {EVERY_MS}, f"an instant is missing: gaps {sorted(gaps)}"


def _lateness(runs, lo: int, hi: int) -> str:
    late = [created - instant for instant, created, _ in runs if lo <= instant < hi]
    if not late:
        return "no runs"
    return (
        f"{len(late)} runs, p50 {statistics.median(late):.0f} ms,"
        f" max {max(late)} ms, mean {statistics.fmean(late):.0f} ms"
    )


def test_outage__eu_database_stopped__us_fires_on__eu_503_naming_the_cell__eu_catches_up(cells):
    us_db, eu_db = (cells.cell(c)["admin_database_url"] for c in ("us", "eu"))
    eu_home = Path(cells.cell("eu")["home"])
    eu_pg_port = int(eu_db.rsplit(":", 1)[1].split("/")[0])
    us_tenant, eu_tenant = new_tenant("us", "outage"), new_tenant("eu", "outage")
    window = {"window_ms": 300_000, "max_runs": 1000}
    us_job = _job(us_tenant, "tick")
    eu_all = _job(eu_tenant, "tick-all", {**window, "policy": "all"})
    eu_latest = _job(eu_tenant, "tick-latest", {**window, "policy": "latest"})
    wait_for(lambda: len(_runs(us_db, us_job)) >= 6, 60, 0.2, "us's job to fire")
    wait_for(
        lambda: min(len(_runs(eu_db, eu_all)), len(_runs(eu_db, eu_latest))) >= 4,
        60, 0.2, "eu's jobs to fire",
    )  # fmt: skip

    eu_key, us_key = bearer(eu_tenant["api_key"]), bearer(us_tenant["api_key"])
    stopped_at = now_ms()
    _stop_postgres(eu_home)
    # Nothing of eu's is made from here until its return, but the timer fires
    # up to CRONWHEEL_FIRE_AHEAD_MS ahead: instants from `unfired` on were not.
    stop_done = now_ms()
    unfired = stop_done + config.fire_ahead_ms() + EVERY_MS
    answers: list[tuple[httpx.Response, bool]] = []  # eu's answer, eu's database refusing
    try:
        assert not LocalPostgres(eu_home).running() and not port_open(eu_pg_port)
        began = time.monotonic()
        while time.monotonic() - began < OUTAGE_MIN_S or len(answers) < 2:
            got = httpx.get(f"{ROUTER}/v1/jobs", headers=eu_key, timeout=30)
            answers.append((got, _refuses(eu_db)))
            mine = httpx.get(f"{ROUTER}/v1/jobs", headers=us_key, timeout=30)
            assert mine.status_code == 200, mine.text  # us's tenant is served throughout
            time.sleep(0.2)  # a request every ~0.2 s plus the cell's own answer time
        down_until = now_ms()
    finally:
        back = cells.cli("up")  # starts what is stopped: eu's cluster
    assert back.returncode == 0, back.stderr

    # The fault landed: eu's database refused connections while eu's tenant asked.
    assert all(refused for _, refused in answers), "eu's database answered during the outage"
    for got, _ in answers:
        assert got.status_code == 503, got.text
        assert got.headers["retry-after"]
        doc = got.json()
        assert doc["cell"] == "eu", doc
        assert doc["code"] == "UNAVAILABLE", doc

    # eu is served again, and fires on past its return.
    wait_for(
        lambda: httpx.get(f"{ROUTER}/v1/jobs", headers=eu_key, timeout=30).status_code == 200,
        90, 0.5, "eu's tenant to be served again",
    )  # fmt: skip
    returned_at = now_ms()
    for job in (eu_all, eu_latest, us_job):
        db = us_db if job == us_job else eu_db
        wait_for(
            lambda j=job, d=db: any(i > returned_at + 2 * EVERY_MS for i, _, _ in _runs(d, j)),
            90, 0.5, f"{job} to fire after eu's return",
        )  # fmt: skip

    # us: every instant once, none missing, through eu's outage.
    us_runs = _runs(us_db, us_job)
    _one_each_none_missing([i for i, _, _ in us_runs])
    during = [i for i, _, _ in us_runs if stopped_at <= i < down_until]
    assert len(during) >= (down_until - stopped_at) // EVERY_MS - 1
    # created_at - instant: negative while the timer fires ahead (up to
    # CRONWHEEL_FIRE_AHEAD_MS), as it should; what matters is that it does not move.
    print(
        f"\nus lateness before eu's outage: {_lateness(us_runs, 0, stopped_at)}"
        f"\nus lateness during eu's outage ({(down_until - stopped_at) / 1000:.1f} s):"
        f" {_lateness(us_runs, stopped_at, down_until)}"
        f"\nus lateness after: {_lateness(us_runs, down_until, 2**62)}",
        flush=True,
    )

    # eu, policy all: every instant of the outage fired once, after the return.
    all_runs = _runs(eu_db, eu_all)
    _one_each_none_missing([i for i, _, _ in all_runs])
    caught = [(i, c) for i, c, _ in all_runs if unfired <= i < down_until]
    assert len(caught) >= (down_until - unfired) // EVERY_MS - 1
    assert all(c >= down_until for _, c in caught), "a run was made while eu's database was down"

    # eu, policy latest: every instant stands in exactly one run (its own, or
    # the one whose `covers` lists it), and the outage's instants in one run
    # made after the return.
    latest = _runs(eu_db, eu_latest)
    stands: dict[int, int] = {}  # instant -> the instant of the run it stands in
    for instant, _, covers in latest:
        for x in covers or [instant]:
            assert x not in stands, f"instant {x} stands in two runs"
            stands[x] = instant
    _one_each_none_missing(sorted(stands))
    outage = [x for x in stands if unfired <= x < down_until]
    assert len(outage) >= (down_until - unfired) // EVERY_MS - 1
    holders = {stands[x] for x in outage}
    assert len(holders) == 1, f"the outage's instants are in {len(holders)} runs"
    folded = next(r for r in latest if r[0] in holders)
    instant, created, covers = folded
    assert covers and instant == max(covers) and created >= down_until, folded
