"""SSRF checked at connect time: the only way the webhook client (http.py) makes
a connection.

DNS rebinding: every new connection resolves the host once, checks every
address with cronwheel.core.ssrf (loopback, private, link-local, multicast,
reserved, unspecified, IPv4 hidden in IPv6: refused unless inside
CRONWHEEL_WEBHOOK_ALLOW_CIDRS), and dials one of those vetted addresses, never
a second lookup. TLS still verifies the certificate for the URL's host name
(the caller passes it as `server_hostname`, which is also the SNI). A refused
destination raises DestinationRefused (not retried).
"""

from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
from collections.abc import Callable, Sequence

from cronwheel.core import ssrf


class DestinationRefused(Exception):
    """The host resolves to an address webhooks may not call."""


class Guard:
    """Resolve once, vet every address, dial a vetted one."""

    def __init__(self, allow: Sequence[ssrf.Network] = ()):
        self.allow = list(allow)

    async def vetted_addresses(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise OSError(f"{host} does not resolve: {e}") from e
        try:
            return ssrf.resolve_destination(host, port, self.allow, resolve=lambda *_a, **_k: infos)
        except ssrf.Refused as e:
            raise DestinationRefused(str(e)) from None

    async def connect(
        self,
        host: str,
        port: int,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        """A connection to one vetted address of `host` (tried in turn); OSError
        naming each failure when none answers. The caller bounds the time."""
        loop = asyncio.get_running_loop()
        failures: list[str] = []
        for addr in await self.vetted_addresses(host, port):
            try:
                return await loop.create_connection(
                    protocol_factory,
                    addr,
                    port,
                    ssl=ssl,
                    server_hostname=server_hostname if ssl is not None else None,
                )
            except _ssl.SSLError:
                raise  # the certificate is the host's answer: another address is no better
            except OSError as e:
                failures.append(f"{addr}: {e.strerror or e}")
        raise OSError(f"{host}:{port}: " + "; ".join(failures))
