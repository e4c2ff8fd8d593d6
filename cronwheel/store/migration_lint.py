"""`make check-migrations`: squawk lints every migration for locking and
rewriting DDL (`python -m cronwheel.store.migration_lint [DIR]`).

squawk (PyPI squawk-cli) knows which statement takes which lock; this module
only tells it how cronwheel/store/migrate.py runs each file and holds the
project's one rule squawk lacks:

- a file migrate.py runs in a transaction is linted with
  `--assume-in-transaction` (squawk then accepts `SET LOCAL lock_timeout`);
  a `-- cronwheel: no-transaction` file holds one statement sent alone, so no
  `SET` can precede it, and what such files hold (`CREATE INDEX
  CONCURRENTLY`, `DROP INDEX CONCURRENTLY`, `VACUUM`) takes SHARE UPDATE
  EXCLUSIVE at most, which blocks neither reads nor writes: the two timeout
  rules are left out for them;
- a finding is waived only by squawk's own comment, `-- squawk-ignore RULE`
  (or `squawk-ignore-file RULE`), and the comment must say why the statement
  is safe after a second `--`: `-- squawk-ignore ban-drop-column -- no release
  since v0.3.0 reads runs.legacy`. A bare ignore is refused here.

The settings squawk reads itself (the PostgreSQL version, excluded rules, the
baseline of migrations released before the lint) are in `.squawk.toml` at the
repository's root, each with its reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from cronwheel.store.migrate import MIGRATIONS_DIR, discover

CONFIG_FILE = Path(__file__).resolve().parents[2] / ".squawk.toml"
TIMEOUT_RULES = ("require-lock-timeout", "require-statement-timeout")
_IGNORE = re.compile(r"--\s*squawk-ignore(?:-file)?\b(?P<rest>.*)$")
MIN_REASON_WORDS = 3


class LintError(Exception):
    """squawk could not be run."""


def squawk_binary() -> str:
    """squawk from this interpreter's environment (the venv), else from PATH."""
    beside = Path(sys.executable).with_name("squawk")
    if beside.exists():
        return str(beside)
    found = shutil.which("squawk")
    if not found:
        raise LintError("squawk not found: `make install` (squawk-cli is a test dependency)")
    return found


def unexplained_ignores(path: Path) -> list[str]:
    """The squawk-ignore comments of `path` that give no reason after `--`."""
    found = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        m = _IGNORE.search(line)
        if not m:
            continue
        _rules, _, reason = m.group("rest").partition("--")
        if len(reason.split()) < MIN_REASON_WORDS:
            found.append(
                f"{path.name}:{lineno}: a squawk-ignore must say why the statement is safe: "
                f"`-- squawk-ignore RULE -- <why, in a few words>`"
            )
    return found


def _excluded_rules(config: Path) -> list[str]:
    if not config.exists():
        return []
    return list(tomllib.loads(config.read_text()).get("excluded_rules", []))


def _squawk(paths: list[Path], flags: list[str], config: Path) -> subprocess.CompletedProcess:
    command = [squawk_binary(), *flags, "--no-error-on-unmatched-pattern"]
    if config.exists():
        command += ["--config", str(config)]
    return subprocess.run(
        command + [str(p) for p in paths], capture_output=True, text=True, timeout=120
    )


def lint(directory: Path = MIGRATIONS_DIR, config: Path = CONFIG_FILE) -> tuple[bool, str]:
    """Lint every migration in `directory`; returns (passed, the report)."""
    migrations = discover(directory)
    report: list[str] = []
    for mig in migrations:
        report += unexplained_ignores(mig.path)
    passed = not report
    in_tx = [m.path for m in migrations if m.transactional]
    alone = [m.path for m in migrations if not m.transactional]
    # squawk's --exclude replaces the config file's excluded_rules: name both.
    alone_excluded = ",".join([*_excluded_rules(config), *TIMEOUT_RULES])
    for paths, flags in [
        (in_tx, ["--assume-in-transaction"]),
        (alone, ["--no-assume-in-transaction", f"--exclude={alone_excluded}"]),
    ]:
        if not paths:
            continue
        proc = _squawk(paths, flags, config)
        if proc.returncode != 0:
            passed = False
            report.append(proc.stdout.strip() or proc.stderr.strip())
    return passed, "\n".join(r for r in report if r)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else MIGRATIONS_DIR
    try:
        passed, report = lint(directory)
    except LintError as e:
        print(f"check-migrations: {e}", file=sys.stderr)
        return 2
    if report:
        print(report)
    if not passed:
        print(
            "check-migrations: FAILED. Make the statement safe (docs/migrations.md, "
            "The migration lint), or say why it is in `-- squawk-ignore RULE -- <why>`.",
            file=sys.stderr,
        )
        return 1
    print(f"check-migrations: {len(discover(directory))} migrations ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
