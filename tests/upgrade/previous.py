"""The previous release, as make test-upgrade runs it: the last line of RELEASES
names its tag and commit, and its tree is exported with `git archive` into a
directory of its own. CI clones main without tags, but every commit of main is
in a full clone, so the commit comes first and the tag is the fallback; a
clone that has neither (a shallow one) fails in one line, never skips."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cronwheel import config

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "RELEASES"
PLUGIN_DIR = Path(__file__).resolve().parent  # old_release_plugin.py, for -p


class Unavailable(Exception):
    """The previous release cannot be had from this clone; the message says why."""


@dataclass(frozen=True)
class Release:
    tag: str
    commit: str


def releases(path: Path = RELEASES) -> list[Release]:
    """Every release RELEASES lists (`<tag> <commit>` a line, oldest first;
    blank lines and # comments skipped)."""
    entries = [
        line.split()
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for entry in entries:
        if len(entry) != 2:
            raise Unavailable(f"{path.name}: {' '.join(entry)!r} is not '<tag> <commit>'")
    return [Release(tag, commit) for tag, commit in entries]


def previous(path: Path = RELEASES) -> Release:
    """The newest release RELEASES lists."""
    listed = releases(path)
    if not listed:
        raise Unavailable(f"{path.name}: no release listed ('<tag> <commit>' a line)")
    return listed[-1]


def export(release: Release, dest: Path, repo: Path = ROOT) -> str:
    """Write the release's tree into `dest`; returns the ref it came from (the
    commit, else the tag). A tag that names another commit than RELEASES is
    refused: one of the two is wrong."""

    def _git(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, **kw)

    tagged = _git("rev-parse", "--verify", "-q", f"refs/tags/{release.tag}^{{commit}}", text=True)
    if tagged.returncode == 0 and not tagged.stdout.strip().startswith(release.commit):
        raise Unavailable(
            f"tag {release.tag} is {tagged.stdout.strip()[:12]}, RELEASES says {release.commit[:12]}"
        )
    for ref in (release.commit, f"refs/tags/{release.tag}"):
        if _git("cat-file", "-e", f"{ref}^{{commit}}").returncode == 0:
            break
    else:
        raise Unavailable(
            f"previous release {release.tag} ({release.commit[:12]}) is not in this clone"
            " (shallow? `git fetch --unshallow --tags`): make test-upgrade cannot run"
        )
    dest.mkdir(parents=True, exist_ok=True)
    archive = _git("archive", "--format=tar", ref)
    if archive.returncode != 0:
        raise Unavailable(f"git archive {ref}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return ref


def env(tree: Path, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment of a process of the previous release (`base`, else this
    one's): its tree first on the path (before this checkout's editable install,
    whose finder comes after sys.path), the local stack's state (credentials) of
    this checkout rather than beside the exported tree, and none of this pytest
    run's own variables."""
    base = os.environ if base is None else base
    out = {k: v for k, v in base.items() if not k.startswith("PYTEST_")}
    out.update(
        PYTHONPATH=os.pathsep.join([str(tree), str(PLUGIN_DIR)]),
        CRONWHEEL_HOME=str(config.project_home()),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return out


PYTHON = sys.executable
