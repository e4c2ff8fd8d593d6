"""`make check-migrations`: squawk refuses locking or rewriting DDL in a new
migration unless the migration says why it is safe; the released baseline is
waived by name in .squawk.toml."""

from __future__ import annotations

import shutil

import pytest

from cronwheel.store.migrate import MIGRATIONS_DIR
from cronwheel.store.migration_lint import lint, main, unexplained_ignores

TIMEOUTS = "SET LOCAL lock_timeout = '2s';\nSET LOCAL statement_timeout = '60s';\n"


@pytest.fixture
def migrations(tmp_path):
    """A migrations folder (the baseline's patterns match `*/migrations/NAME`)
    whose first step makes a table for the next ones to change."""
    directory = tmp_path / "migrations"
    directory.mkdir()
    (directory / "0001_jobs.sql").write_text(
        TIMEOUTS + "CREATE TABLE jobs (job_id text PRIMARY KEY, tenant_id text NOT NULL);\n"
    )
    return directory


def test_safe_expand_step__passes(migrations):
    (migrations / "0002_jobs_note.sql").write_text(
        TIMEOUTS + "ALTER TABLE jobs ADD COLUMN note text;\n"
    )

    passed, report = lint(migrations)

    assert passed, report


def test_index_without_concurrently__fails_naming_the_rule(migrations, capsys):
    (migrations / "0002_jobs_tenant.sql").write_text(
        TIMEOUTS + "CREATE INDEX jobs_tenant ON jobs (tenant_id);\n"
    )

    passed, report = lint(migrations)

    assert not passed
    assert "require-concurrent-index-creation" in report
    assert main([str(migrations)]) == 1
    assert "squawk-ignore RULE -- <why>" in capsys.readouterr().err


def test_transactional_step_without_lock_timeout__fails(migrations):
    (migrations / "0002_jobs_note.sql").write_text("ALTER TABLE jobs ADD COLUMN note text;\n")

    passed, report = lint(migrations)

    assert not passed and "require-lock-timeout" in report


def test_no_transaction_index_concurrently__passes_without_timeouts(migrations):
    (migrations / "0002_jobs_tenant.sql").write_text(
        "-- cronwheel: no-transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_tenant ON jobs (tenant_id);\n"
    )

    passed, report = lint(migrations)

    assert passed, report


def test_ignore_with_reason__passes(migrations):
    (migrations / "0002_contract_jobs_tenant.sql").write_text(
        TIMEOUTS + "-- squawk-ignore ban-drop-column -- no running release reads tenant_id\n"
        "ALTER TABLE jobs DROP COLUMN tenant_id;\n"
    )

    passed, report = lint(migrations)

    assert passed, report


def test_ignore_without_reason__fails_naming_the_line(migrations):
    path = migrations / "0002_contract_jobs_tenant.sql"
    path.write_text(
        TIMEOUTS + "-- squawk-ignore ban-drop-column\nALTER TABLE jobs DROP COLUMN tenant_id;\n"
    )

    passed, report = lint(migrations)

    assert not passed
    assert "0002_contract_jobs_tenant.sql:3: a squawk-ignore must say why" in report
    assert unexplained_ignores(path) != []


def test_baseline__waived_by_name_only(migrations):
    """0005 builds indexes without CONCURRENTLY: passed under its released name
    (.squawk.toml's baseline), refused under any other."""
    for n in range(2, 5):
        (migrations / f"000{n}_filler.sql").write_text(TIMEOUTS + "SELECT 1;\n")
    shutil.copy(MIGRATIONS_DIR / "0005_priority.sql", migrations / "0005_priority.sql")

    assert lint(migrations) == (True, "")

    (migrations / "0005_priority.sql").rename(migrations / "0005_priority_again.sql")
    passed, report = lint(migrations)
    assert not passed and "require-concurrent-index-creation" in report
