"""Where make test-upgrade finds the previous release (tests/upgrade/previous.py):
RELEASES' last line, its commit in a full clone, the tag as the fallback, and
one clear line where a clone has neither. No servers."""

from __future__ import annotations

import subprocess

import pytest

from tests.upgrade import previous


def test_releases__the_last_line_is_the_previous_release(tmp_path):
    path = tmp_path / "RELEASES"
    path.write_text("# comment\nv0.1.0 aaaa\n\nv0.2.0 bbbb\n")
    assert previous.previous(path) == previous.Release("v0.2.0", "bbbb")
    path.write_text("# nothing released\n")
    with pytest.raises(previous.Unavailable, match="<tag> <commit>"):
        previous.previous(path)


def test_releases__every_line_oldest_first__a_malformed_one_named(tmp_path):
    path = tmp_path / "RELEASES"
    path.write_text("# comment\nv0.1.0 aaaa\n\nv0.2.0 bbbb\n")
    assert [r.tag for r in previous.releases(path)] == ["v0.1.0", "v0.2.0"]
    path.write_text("v0.1.0 aaaa\nv0.2.0\n")
    with pytest.raises(previous.Unavailable, match="'v0.2.0' is not '<tag> <commit>'"):
        previous.releases(path)


def test_releases__the_committed_file_names_a_commit_of_this_clone():
    rel = previous.previous()
    out = subprocess.run(
        ["git", "-C", str(previous.ROOT), "cat-file", "-t", rel.commit],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout.strip() == "commit", f"RELEASES names {rel.commit}: {out.stderr}"


def test_export__writes_the_release_tree(tmp_path):
    rel = previous.previous()
    assert previous.export(rel, tmp_path) == rel.commit
    assert (tmp_path / "services" / "entrypoints.py").is_file()
    assert (tmp_path / "tests" / "conftest.py").is_file()


def test_export__a_shallow_clone_without_the_release__fails_in_one_line(tmp_path):
    clone = tmp_path / "shallow.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", "--depth", "1", f"file://{previous.ROOT}", str(clone)],
        check=True, capture_output=True,
    )  # fmt: skip
    rel = previous.previous()
    with pytest.raises(previous.Unavailable) as e:
        previous.export(rel, tmp_path / "tree", repo=clone)
    message = str(e.value)
    assert "\n" not in message
    assert rel.tag in message and "not in this clone" in message
