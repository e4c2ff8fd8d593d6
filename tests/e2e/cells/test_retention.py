"""Each cell's run history has its own retention (issue 25): `cronwheel dev
--cells` supervises one `cronwheel retention --cell NAME --every` a cell,
each as that cell's owner, so every cell's days are made ahead and its
expired days dropped. Before, only the one-cell `cronwheel dev` ran it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from cronwheel.store import runs_daily
from services.entrypoints import DEV_RETENTION_EVERY_S, dev_retention


def test_dev_cells__one_retention_per_cell__with_its_cell_and_schedule():
    argv = dev_retention(["us", "eu"])
    assert sorted(argv) == ["eu/retention", "us/retention"]
    assert argv["eu/retention"][-5:] == [
        "retention", "--cell", "eu", "--every", str(DEV_RETENTION_EVERY_S)
    ]  # fmt: skip


def test_retention_cell__makes_the_days_ahead_in_that_cells_database_only(cells):
    today = datetime.now(UTC).date()
    week = {today + timedelta(days=i) for i in range(8)}

    def days(name: str) -> set:
        with psycopg.connect(cells.cell(name)["admin_database_url"], autocommit=True) as conn:
            return set(runs_daily.days(conn))

    eu_before = days("eu")
    done = cells.cli("retention", "--cell", "us", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("retention: made "), done.stdout
    assert week <= days("us"), sorted(week - days("us"))
    assert days("eu") == eu_before  # another cell's database is not touched

    done = cells.cli("retention", "--cell", "eu", timeout=120)
    assert done.returncode == 0, done.stderr
    assert week <= days("eu"), sorted(week - days("eu"))


def test_retention_cell__unknown_cell__one_line_and_nonzero(cells):
    done = cells.cli("retention", "--cell", "mars", timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--cell mars: not a cell of this stack" in lines[0], done.stderr
