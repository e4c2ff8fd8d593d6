"""The connect-time SSRF guard under the service's HTTP client: every address a
host resolves to is vetted before anything is dialled. No servers: refused
destinations never get as far as a connection."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest

from services.webhook import http
from services.webhook.guard import DestinationRefused, Guard
from services.webhook.http import Client

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("localhost", "loopback"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("::ffff:127.0.0.1", "embeds the IPv4 address"),
    ],
)
def test_connect__non_public_address__refused_before_dialling(host, why):
    with pytest.raises(DestinationRefused, match=why):
        asyncio.run(Guard([]).connect(host, 80, asyncio.Protocol))


def test_allow_cidrs__let_their_addresses_through_but_not_ipv4_mapped_ones():
    backend = Guard(LOOPBACK + [ipaddress.ip_network("10.0.0.0/8")])
    assert asyncio.run(backend.vetted_addresses("10.1.2.3", 80)) == ["10.1.2.3"]
    assert asyncio.run(backend.vetted_addresses("127.0.0.1", 80)) == ["127.0.0.1"]
    with pytest.raises(DestinationRefused):
        asyncio.run(backend.vetted_addresses("::ffff:127.0.0.1", 80))


def test_client__refused_host_name__raises_destination_refused():
    async def call():
        await Client(Guard([])).request("POST", "http://localhost:9/hook", {}, b"{}")

    with pytest.raises(DestinationRefused):
        asyncio.run(call())


def test_client__allowed_but_closed_port__connect_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def call():
        await Client(Guard(LOOPBACK)).request("GET", f"http://127.0.0.1:{port}/")

    with pytest.raises(http.ConnectError):
        asyncio.run(call())


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "http:///nohost", "http://127.0.0.1/a b"])
def test_client__not_an_http_url__unsupported(url):
    async def call():
        await Client(Guard(LOOPBACK)).request("GET", url)

    with pytest.raises(http.UnsupportedURL):
        asyncio.run(call())
