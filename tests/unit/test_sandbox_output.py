"""The bounded output tail: what of a command's output reaches the run."""

from __future__ import annotations

import pytest

from services.executor.output import TAIL_BYTES, Tail, secret_values


def test_tail__short_output__kept_whole():
    tail = Tail()
    tail.feed(b"hello\n")
    tail.feed(b"world\n")
    assert (tail.text(), tail.truncated, tail.total) == ("hello\nworld\n", False, 12)


def test_tail__long_output__only_the_last_16_kib():
    tail = Tail()
    for i in range(10_000):
        tail.feed(f"line {i:05d}\n".encode())
    text = tail.text()
    assert len(text.encode()) == TAIL_BYTES == 16 * 1024
    assert text.endswith("line 09999\n")
    assert tail.truncated and tail.total == 10_000 * 11


def test_tail__cut_inside_a_utf8_character__starts_at_the_next_one():
    tail = Tail(limit=4)
    tail.feed("aé€".encode())  # 1 + 2 + 3 bytes; the last 4 start inside "é"
    assert tail.text() == "€"


def test_tail__secret_values__masked():
    tail = Tail(secrets=secret_values({"API_TOKEN": "tok-123456", "MODE": "production"}))
    tail.feed(b"using tok-123456 in production\n")
    assert tail.text() == "using *** in production\n"


@pytest.mark.parametrize("pad", range(0, 80, 7))
def test_tail__secret_split_across_chunks_and_the_cut__never_shown(pad):
    secret = "s3cr3t-" + "x" * 40
    tail = Tail(limit=64, secrets=[secret])
    for _ in range(3):
        tail.feed(b"." * pad + secret[:20].encode())
        tail.feed(secret[20:].encode() + b"\n")
    assert "x" * 12 not in tail.text()
    assert tail.text().endswith("***\n")


def test_secret_values__by_name():
    env = {"DB_PASSWORD": "hunter22", "GITHUB_TOKEN": "ghp_abc", "REGION": "eu-west-1"}
    assert sorted(secret_values(env)) == ["ghp_abc", "hunter22"]
