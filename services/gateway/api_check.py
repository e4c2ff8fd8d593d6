"""`make check-api`: the `/v1` API only grows. The OpenAPI document the gateway
serves now is compared with the previous release's, kept in
docs/api/openapi-baseline.json, by `oasdiff breaking --fail-on ERR`.

oasdiff (a Go module, github.com/oasdiff/oasdiff) classifies every change of
an OpenAPI document; what it calls an error is what breaks a client written
against the baseline: a path, operation, response field or enum value removed,
a request field newly required, a type narrowed. It is installed with `go
install` at the pinned OASDIFF_VERSION into the virtualenv (.venv/go/), once
per version; Go is the one thing the machine needs (`apt-get install golang`
or the toolchain from go.dev).

    python -m services.gateway.api_check                   # the check
    python -m services.gateway.api_check --write-baseline  # at a release
    python -m services.gateway.api_check --write FILE      # the current document
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "docs" / "api" / "openapi-baseline.json"
OASDIFF_MODULE = "github.com/oasdiff/oasdiff"
OASDIFF_VERSION = "v1.37.0"
# Inside the virtualenv (`make install`'s .venv, ignored by git, dropped with
# it), so a new machine installs the pinned version again.
_TOOLS = Path(sys.prefix) if sys.prefix != sys.base_prefix else ROOT / ".venv"
OASDIFF_DIR = _TOOLS / "go" / f"oasdiff-{OASDIFF_VERSION}"

# oasdiff's levels raised where our API differs from its defaults. The
# documents mark few response fields required, yet CONTRACT.md promises each
# field a client reads: removing an optional one is an error, not news. Request
# bodies refuse unknown fields (additionalProperties: false), so a request
# field removed turns an old client's valid request into a 422.
SEVERITY = {
    "response-optional-property-removed": "ERR",
    "request-property-removed": "ERR",
}


class ApiCheckError(Exception):
    """The check could not run (no Go, oasdiff failed to install or to read)."""


def document() -> dict:
    """The OpenAPI document the gateway serves at /openapi.json, built from an
    app that is never started (its pool's connection attempts are not logged)."""
    from cronwheel.kafka import Topics
    from services.gateway.app import create_app

    pool_log = logging.getLogger("psycopg.pool")
    level = pool_log.level
    pool_log.setLevel(logging.CRITICAL)
    try:
        app = create_app("postgresql://127.0.0.1:1/none", Topics("openapi"), "127.0.0.1:1", "-")
        try:
            return app.openapi()
        finally:
            app.state.gateway.close()
    finally:
        pool_log.setLevel(level)


def write_document(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def go_binary() -> str | None:
    """`go` from PATH, else from /usr/local/go/bin, where Go's own archive
    installs (a non-login shell, as CI's, may not have it on PATH)."""
    return shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")


def oasdiff() -> Path:
    """The pinned oasdiff, installed with `go install` the first time."""
    binary = OASDIFF_DIR / "oasdiff"
    if binary.exists():
        return binary
    go = go_binary()
    if go is None:
        raise ApiCheckError(
            f"Go is needed to install oasdiff ({OASDIFF_MODULE}@{OASDIFF_VERSION}): "
            "apt-get install golang"
        )
    OASDIFF_DIR.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [go, "install", f"{OASDIFF_MODULE}@{OASDIFF_VERSION}"],
        env={**os.environ, "GOBIN": str(OASDIFF_DIR)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0 or not binary.exists():
        raise ApiCheckError(f"go install {OASDIFF_MODULE} failed: {proc.stderr.strip()}")
    return binary


def breaking(base: Path, revision: Path) -> tuple[bool, str]:
    """Compare two documents; (no error-level breaking change, oasdiff's report)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as levels:
        levels.write("".join(f"{rule} {level}\n" for rule, level in SEVERITY.items()))
        levels.flush()
        command = [str(oasdiff()), "breaking", "--fail-on", "ERR", "--color", "never"]
        command += ["--severity-levels", levels.name, str(base), str(revision)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if proc.returncode not in (0, 1):
        raise ApiCheckError(f"oasdiff failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def check(baseline: Path = BASELINE) -> tuple[bool, str]:
    """The current document against `baseline`."""
    with tempfile.TemporaryDirectory() as tmp:
        current = Path(tmp) / "openapi.json"
        write_document(document(), current)
        return breaking(baseline, current)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="api_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--write-baseline", action="store_true", help=f"write {BASELINE}")
    p.add_argument("--write", type=Path, metavar="FILE", help="write the current document")
    args = p.parse_args(argv)
    if args.write_baseline or args.write:
        path = BASELINE if args.write_baseline else args.write
        write_document(document(), path)
        print(f"wrote {path}")
        return 0
    try:
        ok, report = check()
    except ApiCheckError as e:
        print(f"check-api: {e}", file=sys.stderr)
        return 2
    if report:
        print(report)
    if not ok:
        print(
            f"check-api: FAILED: the API is not additive against {BASELINE.relative_to(ROOT)} "
            "(docs/migrations.md, The HTTP API). Add beside instead of changing; a removal "
            "needs a new version.",
            file=sys.stderr,
        )
        return 1
    print(f"check-api: additive against {BASELINE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
