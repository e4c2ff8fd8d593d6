"""The executor's egress policy without touching the host: the nftables
ruleset it installs, the addresses of a run's veth, the resolvers a run gets,
and the refusal where it cannot install anything."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from cronwheel.core.ssrf import FORBIDDEN_V4
from services.executor import egress
from services.executor.egress import Egress, EgressUnavailable, host_resolvers, ruleset

SUBNET = ipaddress.IPv4Network("10.254.0.0/16")


def rules(**kw) -> list[str]:
    kw.setdefault("allow", [ipaddress.IPv4Network("10.20.0.0/16")])
    kw.setdefault("dns", ["10.255.255.53"])
    return [line.strip() for line in ruleset(SUBNET, **kw).splitlines()]


def test_ruleset__replaces_the_table_whole__idempotent():
    text = rules()
    assert text[:2] == ["add table inet cronwheel_egress", "delete table inet cronwheel_egress"]


def test_ruleset__host_itself_refused_first__ipv6_and_other_runs_refused():
    text = rules()
    assert 'iifname "cwh*" reject with icmpx type admin-prohibited' in text  # input
    forward = text[text.index("chain forward {") :]
    order = [
        'iifname "cwh*" meta nfproto ipv6 reject with icmpx type admin-prohibited',
        'iifname "cwh*" oifname "cwh*" reject with icmpx type admin-prohibited',
        'iifname "cwh*" ip daddr @resolvers meta l4proto { tcp, udp } th dport 53 accept',
        'iifname "cwh*" ip daddr @allowed accept',
        'iifname "cwh*" ip daddr @forbidden reject with icmpx type admin-prohibited',
        'iifname "cwh*" accept',
    ]
    assert [forward.index(rule) for rule in order] == sorted(forward.index(r) for r in order)
    assert 'oifname "cwh*" drop' in forward  # nothing opens a connection into a run
    assert 'ip saddr 10.254.0.0/16 oifname != "cwh*" masquerade' in text


def test_ruleset__sets_hold_ssrfs_ranges__the_allow_list_and_resolvers():
    text = "\n".join(rules())
    for net in FORBIDDEN_V4:
        assert str(net) in text
    assert "elements = { 10.20.0.0/16 }" in text and "elements = { 10.255.255.53 }" in text


def test_ruleset__nothing_allowed__empty_sets_are_valid():
    text = rules(allow=[], dns=[])
    assert "set allowed { type ipv4_addr; flags interval; auto-merge;  }" in text


def test_addresses__a_31_per_uid_from_the_subnet():
    e = Egress(
        ip="ip", nft="nft", nsenter="nsenter", subnet=SUBNET, uid_base=200_000,
        allow=(), dns=(), lock_dir=Path("/nonexistent"),
    )  # fmt: skip
    assert e.addresses(200_000) == ("10.254.0.0", "10.254.0.1")
    assert e.addresses(209_999) == ("10.254.78.30", "10.254.78.31")


def test_host_resolvers__ipv4_not_loopback(tmp_path):
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# comment\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver fd00::1\n"
        "search corp\nnameserver 10.0.0.2\nnameserver 9.9.9.9\n"
    )
    assert host_resolvers(str(conf)) == ("10.0.0.2", "9.9.9.9")
    assert host_resolvers(str(tmp_path / "missing")) == ()


def start(**kw) -> Egress:
    args = dict(
        subnet=SUBNET, uid_base=200_000, uid_range=10_000, allow=(), dns=(),
        lock_dir=Path("/nonexistent"), uids=(),
    )  # fmt: skip
    return Egress.start(**{**args, **kw})


def test_start__not_root__unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(egress.os, "geteuid", lambda: 1000)
    with pytest.raises(EgressUnavailable, match="not root"):
        start()


def test_start__no_nft__unavailable_naming_the_package(monkeypatch):
    monkeypatch.setattr(egress.os, "geteuid", lambda: 0)
    monkeypatch.setattr(egress.shutil, "which", lambda name, **kw: None if name == "nft" else name)
    with pytest.raises(EgressUnavailable, match="nft not installed.*nftables"):
        start()


def test_start__subnet_too_small_or_overlapping_the_allow_list__unavailable(monkeypatch):
    monkeypatch.setattr(egress.os, "geteuid", lambda: 0)
    monkeypatch.setattr(egress.shutil, "which", lambda name, **kw: name)
    with pytest.raises(EgressUnavailable, match="fewer than two addresses"):
        start(subnet=ipaddress.IPv4Network("10.254.0.0/24"))
    with pytest.raises(EgressUnavailable, match="overlaps"):
        start(allow=[ipaddress.IPv4Network("10.0.0.0/8")])
