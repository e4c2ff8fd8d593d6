"""core/ssrf.py's FORBIDDEN_V4 (the ranges the executor's egress rules refuse)
and `why_refused` (the webhook's per-address rule) name the same set of IPv4
addresses: every edge of every range is refused, every address just outside
one is refused only if another range holds it, and a large sample agrees."""

from __future__ import annotations

import ipaddress
import random

from cronwheel.core.ssrf import FORBIDDEN_V4, why_refused


def listed(addr: ipaddress.IPv4Address) -> bool:
    return any(addr in net for net in FORBIDDEN_V4)


def test_forbidden_v4__every_range_edge__refused_by_why_refused():
    for net in FORBIDDEN_V4:
        for addr in (net.network_address, net.broadcast_address):
            assert why_refused(addr) is not None, addr


def test_forbidden_v4__just_outside_each_range__refused_only_if_listed():
    for net in FORBIDDEN_V4:
        for edge in (int(net.network_address) - 1, int(net.broadcast_address) + 1):
            if 0 <= edge < 2**32:
                addr = ipaddress.IPv4Address(edge)
                assert (why_refused(addr) is not None) == listed(addr), addr


def test_forbidden_v4__random_addresses__the_same_verdict():
    rng = random.Random(23)
    for _ in range(200_000):
        addr = ipaddress.IPv4Address(rng.getrandbits(32))
        assert (why_refused(addr) is not None) == listed(addr), addr


def test_forbidden_v4__the_addresses_the_brief_names():
    for text in ("169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1"):
        assert listed(ipaddress.IPv4Address(text)), text
    assert not listed(ipaddress.IPv4Address("1.1.1.1"))
