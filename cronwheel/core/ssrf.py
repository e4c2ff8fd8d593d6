"""Webhook destinations: only public addresses, unless the operator allows more.

A webhook URL is checked when a job is created or changed (the gateway) and
again when the webhook service connects, since DNS can change in between (and
a name can answer differently on each lookup). The connecting side should dial
one of the addresses `resolve_destination` returned, not resolve the name again.

Refused: loopback, private, link-local, multicast, reserved, unspecified and
shared (CGNAT) addresses, IPv4 addresses hidden in IPv6 (IPv4-mapped, 6to4,
Teredo, NAT64), and every address that is not globally routable, unless it
lies inside one of the CIDRs the operator allows (`CRONWHEEL_WEBHOOK_ALLOW_CIDRS`,
read once at start-up into the service's settings, cronwheel/config.py
`Destinations`, and passed in as `allow`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from cronwheel.core.errors import ValidationError

ALLOW_ENV = "CRONWHEEL_WEBHOOK_ALLOW_CIDRS"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[..., list]


class Refused(ValueError):
    """The destination is not one the platform may call."""


def allowed_networks(text: str = "") -> list[Network]:
    """The networks of an allow list `text` (comma-separated CIDRs); ValueError on
    a bad entry, so a typo fails at startup instead of silently allowing nothing."""
    nets = []
    for part in text.split(","):
        if part.strip():
            try:
                nets.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError as e:
                raise ValueError(f"{ALLOW_ENV}: {part.strip()!r} is not a CIDR") from e
    return nets


def why_refused(addr: Address, allow: Sequence[Network] = ()) -> str | None:
    """None when `addr` may be called, else the reason it may not."""
    if any(addr in net for net in allow if net.version == addr.version):
        return None
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = addr.ipv4_mapped or addr.sixtofour or (addr.teredo or (None, None))[1]
        if embedded is not None:
            return f"{addr} embeds the IPv4 address {embedded}"
    for attr, what in (
        ("is_loopback", "loopback"),
        ("is_unspecified", "unspecified"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(addr, attr):
            return f"{addr} is a {what} address"
    if not addr.is_global or any(addr in net for net in FORBIDDEN_V4 if addr.version == 4):
        # FORBIDDEN_V4 too, whatever this Python's ipaddress says of its ranges
        # (its special-purpose tables changed in 3.11.4, 3.12.4 and 3.13).
        return f"{addr} is not a public address"
    return None


def resolve_destination(
    host: str,
    port: int,
    allow: Sequence[Network] = (),
    resolve: Resolver = socket.getaddrinfo,
) -> list[str]:
    """Every address `host` resolves to, when all of them may be called; else Refused.
    (All, not any: a name that also answers with a private address is refused.)"""
    try:
        infos = resolve(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as e:
        raise Refused(f"{host!r} does not resolve") from e
    addrs: list[str] = []
    for info in infos:
        text = str(info[4][0])
        try:
            addr = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError as e:
            raise Refused(f"{host!r} resolved to {text!r}, not an address") from e
        if reason := why_refused(addr, allow):
            raise Refused(reason)
        if text not in addrs:
            addrs.append(text)
    if not addrs:
        raise Refused(f"{host!r} does not resolve")
    return addrs


def webhook_host_port(url: object, field: str = "target.url") -> tuple[str, int]:
    """The host and port a webhook URL calls; ValidationError naming `field`
    unless `url` is http(s) with a host (no lookup here)."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(field, "must be an http(s) URL with a host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise ValidationError(field, "has an invalid port") from e
    return parts.hostname, port


def check_webhook_url(
    url: object,
    *,
    field: str = "target.url",
    allow: Sequence[Network] = (),
    resolve: Resolver = socket.getaddrinfo,
) -> None:
    """ValidationError naming `field` unless `url` is http(s) to a callable host.
    `resolve` may be an answer already had (the gateway looks names up before
    the request's transaction, services/gateway/destinations.py)."""
    host, port = webhook_host_port(url, field)
    try:
        resolve_destination(host, port, allow, resolve)
    except Refused as e:
        raise ValidationError(field, f"refused destination: {e}", code="DESTINATION_REFUSED") from e


# The IPv4 ranges `why_refused` refuses, as CIDRs, for rules that work on ranges
# rather than on one address at a time (the managed executor's nftables egress
# rules, services/executor/egress.py). `why_refused` stays the definition for a
# single address; tests/unit/test_ssrf_ranges.py holds the two to the same set.
# From the IANA IPv4 special-purpose and multicast registries, as Python's
# ipaddress classifies them (not global: private, loopback, link-local, shared
# CGNAT, documentation, benchmarking, reserved, multicast, broadcast).
FORBIDDEN_V4: tuple[ipaddress.IPv4Network, ...] = tuple(
    ipaddress.IPv4Network(cidr)
    for cidr in (
        "0.0.0.0/8",  # "this network", unspecified
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (CGNAT); some clouds' metadata
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, cloud metadata (169.254.169.254)
        "172.16.0.0/12",  # private
        # IETF protocol assignments, the whole block: Python before 3.11.4
        # calls all of it private, later ones only 192.0.0.0/29 and .170/31.
        "192.0.0.0/24",
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255 (broadcast)
    )
)
