"""Webhook URLs looked up before the transaction (services/gateway/destinations.py),
with a resolver the test controls: verdicts per URL, one deadline for all."""

from __future__ import annotations

import socket
import threading

import pytest

from cronwheel.core.errors import ValidationError
from cronwheel.core.ssrf import allowed_networks
from services.gateway.destinations import (
    NOT_A_URL,
    DestinationCheck,
    LookupTimedOut,
    webhook_url,
)
from services.gateway.problems import Problem


def answer(addr: str, port: int = 443) -> list:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    return [(family, socket.SOCK_STREAM, 6, "", (addr, port))]


class Resolver:
    """Public addresses for `*.example`, NXDOMAIN for `*.invalid`; names under
    `slow.` wait for `release`. Records each name asked."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, host, port, *args, **kwargs):
        with self.lock:
            self.asked.append(host)
        if host.startswith("slow."):
            self.release.wait(10)
        if host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if host.startswith("private."):
            return answer("10.0.0.7", port)
        return answer(host if host[0].isdigit() or ":" in host else "93.184.215.14", port)


@pytest.fixture
def resolver():
    r = Resolver()
    yield r
    r.release.set()


@pytest.fixture
def check(resolver):
    c = DestinationCheck(timeout_s=0.2, resolve=resolver)
    yield c
    resolver.release.set()
    c.close()


def verdict(check, url):
    return check.verdicts([url]).by_url[url]


def test_verdicts__public_refused_unresolvable_malformed(check):
    assert verdict(check, "https://hooks.example/x") is None
    for url, code in (
        ("https://private.example/x", "DESTINATION_REFUSED"),
        ("https://nowhere.invalid/x", "DESTINATION_REFUSED"),
        ("ftp://hooks.example/x", "INVALID_FIELD"),
        (NOT_A_URL, "INVALID_FIELD"),
    ):
        got = verdict(check, url)
        assert isinstance(got, ValidationError) and got.field == "target.url", url
        assert not isinstance(got, LookupTimedOut), url
        assert got.code == code, url


def test_verdicts__slow_lookup__503_dns_timeout_naming_the_field__others_unaffected(
    check, resolver
):
    got = check.verdicts(["https://slow.example/a", "https://hooks.example/b"])
    late = got.by_url["https://slow.example/a"]
    assert isinstance(late, LookupTimedOut) and late.field == "target.url"
    assert got.by_url["https://hooks.example/b"] is None
    with pytest.raises(Problem) as e:
        got.raise_timeout()
    assert (e.value.status, e.value.code, e.value.field) == (503, "DNS_TIMEOUT", "target.url")
    assert e.value.headers["Retry-After"] == "1"
    got.check("https://hooks.example/b")
    with pytest.raises(LookupTimedOut):  # inside a batch: kept in its job's slot
        got.check("https://slow.example/a")


def test_verdicts__each_host_looked_up_once__literal_addresses_not_queued(check, resolver):
    urls = [f"https://hooks.example/{i}" for i in range(5)] + ["https://93.184.215.14/x"]
    got = check.verdicts([*urls, None])
    assert set(got.by_url) == set(urls)
    assert all(v is None for v in got.by_url.values())
    assert sorted(resolver.asked) == ["93.184.215.14", "hooks.example"]


def test_verdicts__allow_list_applies(resolver):
    c = DestinationCheck(allowed_networks("10.0.0.0/8"), timeout_s=1, resolve=resolver)
    try:
        assert verdict(c, "http://private.example/x") is None
    finally:
        c.close()


def test_webhook_url__only_webhook_targets():
    assert webhook_url({"type": "webhook", "url": "https://a.example"}) == "https://a.example"
    assert webhook_url({"type": "webhook", "url": 7}) is NOT_A_URL
    assert webhook_url({"type": "webhook"}) is NOT_A_URL
    assert webhook_url({"type": "queue", "queue": "q"}) is None
    assert webhook_url("nonsense") is None
