"""Expand and contract steps: `cronwheel migrate` applies the expand steps
only; a contract step (`NNNN_contract_name.sql`) waits for `--contract`."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from cronwheel.store.migrate import discover, migrate, pending
from tests.integration import test_migrate

pytestmark = pytest.mark.integration


# A database of the test's own with no migration applied (test_migrate's fixture).
empty_database = test_migrate.empty_database


@pytest.fixture
def steps(tmp_path):
    """expand, contract, expand: the old column goes in 0002, while 0003 adds
    another beside it."""
    (tmp_path / "0001_runs.sql").write_text("CREATE TABLE runs (id int, legacy text);")
    (tmp_path / "0002_contract_runs_legacy.sql").write_text("ALTER TABLE runs DROP COLUMN legacy;")
    (tmp_path / "0003_runs_cell.sql").write_text("ALTER TABLE runs ADD COLUMN cell text;")
    return tmp_path


def _columns(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs'"
        ).fetchall()
    return {r[0] for r in rows}


def test_discover__contract_told_apart_by_name(steps):
    assert [m.contract for m in discover(steps)] == [False, True, False]


def test_migrate__expand_only__contract_step_stays_pending(empty_database, steps):
    applied = migrate(empty_database, steps, contract=False)

    assert [m.version for m in applied] == [1, 3]
    assert _columns(empty_database) == {"id", "legacy", "cell"}
    assert [m.name for m in pending(empty_database, steps)] == ["contract_runs_legacy"]
    assert migrate(empty_database, steps, contract=False) == []


def test_migrate__contract__applies_the_waiting_step(empty_database, steps):
    migrate(empty_database, steps, contract=False)

    applied = migrate(empty_database, steps, contract=True)

    assert [m.version for m in applied] == [2]
    assert _columns(empty_database) == {"id", "cell"}
    assert pending(empty_database, steps) == []


def test_cli_migrate__expand_by_default__contract_when_asked(empty_database):
    """The command applies the expand steps and names each contract step it
    left pending (0030-0031, run retention's); `--contract` applies those,
    leaving nothing pending."""
    command = [sys.executable, "-m", "services.entrypoints", "migrate"]
    env = {**os.environ, "DATABASE_URL": empty_database}
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    expand = [m for m in discover() if not m.contract]
    assert first.stdout.count("applied ") == len(expand)
    waiting = [f"pending {m.version:04d}_{m.name}" for m in discover() if m.contract]
    assert waiting and all(w in first.stdout for w in waiting)

    second = subprocess.run(
        [*command, "--contract"], env=env, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("applied ") == len(waiting)
    assert pending(empty_database) == []


def test_cli_migrate_status__lists_kind_and_state_applies_nothing(empty_database):
    command = [sys.executable, "-m", "services.entrypoints", "migrate", "--status"]
    env = {**os.environ, "DATABASE_URL": empty_database}

    before = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert before.returncode == 0, before.stderr
    lines = before.stdout.splitlines()
    assert len(lines) == len(discover())
    assert lines[0].startswith("0001_core ") and lines[0].split()[1:] == ["expand", "pending"]
    assert pending(empty_database) == discover()

    migrate(empty_database)
    after = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    migrations = [line for line in after.stdout.splitlines() if not line.startswith("backfill ")]
    assert len(migrations) == len(discover())
    assert all(line.endswith(" applied") for line in migrations)
    # The run-history backfill's progress (issue 25): nothing to copy in a new database.
    [backfill] = [line for line in after.stdout.splitlines() if line.startswith("backfill ")]
    assert backfill.startswith("backfill runs_daily ") and "; done at " in backfill
