"""The HTTP transport under the service's shared httpx.AsyncClient: SSRF checked
at connect time, and one small connection pool per endpoint.

SSRF (DNS rebinding): every new connection resolves the host once, checks
every address with cronwheel.core.ssrf (loopback, private, link-local,
multicast, reserved, unspecified, IPv4 hidden in IPv6: refused unless inside
CRONWHEEL_WEBHOOK_ALLOW_CIDRS), and dials one of those vetted addresses, never
a second lookup. TLS still verifies the certificate for the URL's host name.
A refused destination raises DestinationRefused (not retried).

Pools: httpx's default transport keeps one httpcore pool for every origin,
which scans all its connections for every queued request; at 64 concurrent
requests that cost 3-8 ms of CPU per request here, against 0.7 ms with a pool
per endpoint (docs/webhooks.md has the figures). Per-endpoint concurrency is
bounded above this layer (services/webhook/limits.py), so each pool only ever
holds that many connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.cookiejar
import importlib.util
import select
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Iterator, Sequence

import httpcore
import httpx

from cronwheel.core import ssrf

# httpcore asks sniffio which event loop it runs under every time it sets up a
# lock; where sniffio is not installed that failed import rescans sys.path on
# every request (measured: a third of the client's CPU). An "absent" entry makes
# the failure immediate, and httpcore then assumes asyncio, which is what runs.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)  # type: ignore[arg-type]

READ_LIMIT = 64 * 1024
CORK_BYTES = 64 * 1024  # written bytes held back at most until the next read


class DestinationRefused(Exception):
    """The host resolves to an address webhooks may not call."""


class AsyncioStream(httpcore.AsyncNetworkStream):
    """An asyncio stream as httpcore wants it, raising httpcore's exceptions.

    Writes are held back until the next read (or until CORK_BYTES are held):
    httpcore writes a request's head and its body separately, and one send
    instead of two is a measurable share of the client's CPU per request."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._poller: select.poll | None = None

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            await self._flush(timeout)
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as e:
            raise httpcore.ReadTimeout("read timed out") from e
        except OSError as e:
            raise httpcore.ReadError(str(e)) from e

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        if self._held_bytes >= CORK_BYTES:
            await self._flush(timeout)

    async def _flush(self, timeout: float | None) -> None:
        data = b"".join(self._held) if len(self._held) > 1 else self._held[0]
        self._held.clear()
        self._held_bytes = 0
        try:
            self._writer.write(data)
            if self._writer.transport.get_write_buffer_size() == 0:
                return  # all of it went at once: nothing to wait for
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as e:
            raise httpcore.WriteTimeout("write timed out") from e
        except OSError as e:
            raise httpcore.WriteError(str(e)) from e

    async def aclose(self) -> None:
        self._writer.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as e:
            self._writer.close()
            raise httpcore.ConnectTimeout("TLS handshake timed out") from e
        except (OSError, ssl.SSLError) as e:
            self._writer.close()
            raise httpcore.ConnectError(f"TLS handshake failed: {e}") from e
        return self

    def get_extra_info(self, info: str):
        if info == "is_readable":
            # An idle keep-alive connection is unusable once the peer closed it
            # (or sent something unasked): EOF, a closing transport, or bytes.
            if self._reader.at_eof() or self._writer.is_closing():
                return True
            if self._poller is None:
                sock = self._writer.get_extra_info("socket")
                if sock is None or sock.fileno() < 0:
                    return True
                self._poller = select.poll()
                self._poller.register(sock.fileno(), select.POLLIN)
            return bool(self._poller.poll(0))
        if info in ("ssl_object", "socket"):
            return self._writer.get_extra_info(info)
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolve once, vet every address, dial a vetted one."""

    def __init__(self, allow: Sequence[ssrf.Network] = ()):
        self.allow = list(allow)

    async def vetted_addresses(self, host: str, port: int) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise httpcore.ConnectError(f"{host} does not resolve: {e}") from e
        try:
            return ssrf.resolve_destination(host, port, self.allow, resolve=lambda *_a, **_k: infos)
        except ssrf.Refused as e:
            raise DestinationRefused(str(e)) from None

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options=None,
    ) -> httpcore.AsyncNetworkStream:
        failures: list[str] = []
        try:
            async with asyncio.timeout(timeout):
                for addr in await self.vetted_addresses(host, port):
                    try:
                        reader, writer = await asyncio.open_connection(addr, port, limit=READ_LIMIT)
                    except OSError as e:
                        failures.append(f"{addr}: {e.strerror or e}")
                        continue
                    return AsyncioStream(reader, writer)
        except TimeoutError as e:
            raise httpcore.ConnectTimeout(f"connecting to {host}:{port} timed out") from e
        raise httpcore.ConnectError(f"{host}:{port}: " + "; ".join(failures))

    async def connect_unix_socket(self, path: str, timeout=None, socket_options=None):
        raise DestinationRefused("unix sockets are not webhook destinations")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class EndpointPool:
    """Keep-alive connections to one (scheme, host, port), newest reused first."""

    def __init__(self, origin: httpcore.Origin, backend, ssl_context, keepalive_s: float):
        self.origin = origin
        self.backend = backend
        self.ssl_context = ssl_context
        self.keepalive_s = keepalive_s
        self.idle: list[httpcore.AsyncHTTPConnection] = []
        self.in_use = 0

    async def checkout(self, reuse: bool = True) -> tuple[httpcore.AsyncHTTPConnection, bool]:
        """A connection, and whether it was used before (kept alive)."""
        while reuse and self.idle:
            conn = self.idle.pop()
            if conn.is_available() and not conn.has_expired():
                self.in_use += 1
                return conn, True
            await conn.aclose()
        self.in_use += 1
        fresh = httpcore.AsyncHTTPConnection(
            self.origin,
            ssl_context=self.ssl_context,
            keepalive_expiry=self.keepalive_s,
            http1=True,
            http2=False,
            network_backend=self.backend,
        )
        return fresh, False

    async def checkin(self, conn: httpcore.AsyncHTTPConnection, reusable: bool = True) -> None:
        self.in_use -= 1
        if reusable and conn.is_idle() and conn.is_available():
            self.idle.append(conn)
        else:
            await conn.aclose()

    async def sweep(self) -> None:
        keep = []
        for conn in self.idle:
            if conn.has_expired() or not conn.is_available():
                await conn.aclose()
            else:
                keep.append(conn)
        self.idle = keep

    async def aclose(self) -> None:
        idle, self.idle = self.idle, []
        for conn in idle:
            await conn.aclose()


_MAPPED = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


# How a reused connection that the server had already closed fails.
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


@contextlib.contextmanager
def _httpx_errors(request: httpx.Request) -> Iterator[None]:
    """httpcore's exceptions as the httpx ones callers of a client expect."""
    try:
        yield
    except Exception as exc:
        for core, mapped in _MAPPED:
            if isinstance(exc, core):
                raise mapped(str(exc) or type(exc).__name__, request=request) from exc
        raise


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, inner, pool: EndpointPool, conn, request: httpx.Request):
        self._inner = inner
        self._pool = pool
        self._conn = conn
        self._request = request
        self._returned = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors(self._request):
            async for part in self._inner:
                yield part

    async def aclose(self) -> None:
        if self._returned:
            return
        self._returned = True
        try:
            with _httpx_errors(self._request):
                await self._inner.aclose()
        finally:
            await self._pool.checkin(self._conn)


class GuardedTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 to vetted addresses, with a connection pool per endpoint."""

    def __init__(
        self,
        allow: Sequence[ssrf.Network] = (),
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_s: float = 30.0,
    ):
        self.backend = GuardedBackend(allow)
        self.ssl_context = ssl_context or httpx.create_ssl_context(trust_env=False)
        self.keepalive_s = keepalive_s
        self.pools: dict[tuple[bytes, bytes, int], EndpointPool] = {}

    def _pool(self, url: httpx.URL) -> EndpointPool:
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"{url.scheme!r} is not http or https")
        port = url.port or (443 if url.scheme == "https" else 80)
        key = (url.raw_scheme, url.raw_host, port)
        pool = self.pools.get(key)
        if pool is None:
            origin = httpcore.Origin(url.raw_scheme, url.raw_host, port)
            pool = self.pools[key] = EndpointPool(
                origin, self.backend, self.ssl_context, self.keepalive_s
            )
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """One exchange. A kept-alive connection that the server closed just as it
        was reused fails before any answer; that request goes again, once, on a
        new connection (deliveries are idempotent by webhook-id)."""
        url = request.url
        pool = self._pool(url)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        reuse = True
        while True:
            conn, reused = await pool.checkout(reuse)
            try:
                with _httpx_errors(request):
                    response = await conn.handle_async_request(core_request)
                break
            except _STALE_CONNECTION:
                await pool.checkin(conn, reusable=False)
                if not reused:
                    raise
                reuse = False
            except BaseException:
                await pool.checkin(conn, reusable=False)
                raise
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream, pool, conn, request),
            extensions=response.extensions,
        )

    async def sweep(self) -> None:
        """Close idle connections past their keep-alive; forget unused endpoints."""
        for key, pool in list(self.pools.items()):
            await pool.sweep()
            if not pool.idle and pool.in_use == 0:
                del self.pools[key]

    async def aclose(self) -> None:
        pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            await pool.aclose()


class _NoCookieJar(http.cookiejar.CookieJar):
    def extract_cookies(self, response, request) -> None:
        pass

    def set_cookie(self, cookie) -> None:
        pass

    def add_cookie_header(self, request) -> None:
        pass


class _NoCookies(httpx.Cookies):
    """Never stores a cookie, and skips httpx's per-response parse for one."""

    def __init__(self) -> None:
        super().__init__(_NoCookieJar())

    def extract_cookies(self, response: httpx.Response) -> None:
        pass


class WebhookClient(httpx.AsyncClient):
    """httpx.AsyncClient without cookies. The client is shared by every tenant:
    a cookie one tenant's endpoint set must never ride along on another
    tenant's delivery to the same host."""

    _none = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._none

    @cookies.setter
    def cookies(self, value) -> None:
        pass


def webhook_client(transport: GuardedTransport, *, user_agent: str = "") -> httpx.AsyncClient:
    """The shared client over `transport`: no proxy or TLS settings from the
    environment, no redirects, no cookies, no compressed responses (the response
    cap counts the bytes on the wire)."""
    headers = {"accept-encoding": "identity"}
    if user_agent:
        headers["user-agent"] = user_agent
    return WebhookClient(
        transport=transport, trust_env=False, follow_redirects=False, headers=headers
    )
