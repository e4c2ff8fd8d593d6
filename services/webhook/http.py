"""The webhook service's HTTP/1.1 client: one request, one response, on kept-alive
connections, and nothing else.

Why not httpx: through httpx.AsyncClient, httpcore and h11 a delivery cost
650-800 us of CPU against 80-120 us for the same exchange written on an
asyncio protocol (docs/webhooks.md has the figures), and a delivery needs
none of what those layers add: no redirects (a 3xx fails the attempt), no
cookies (the client is shared by every tenant), no proxies, no decompression
(the response cap counts bytes on the wire), no HTTP/2.

What it does:
- A pool of idle keep-alive connections per origin (scheme, host, port),
  newest reused first, closed after `keepalive_s` idle. Concurrency per
  endpoint is bounded above this layer (limits.py), so a pool holds at most
  that many connections.
- New connections are made by the SSRF guard (guard.py): it resolves the host
  once, vets every address, and dials one of those addresses; TLS verifies
  the certificate for the URL's host name (and sends it as SNI).
- The request goes in one write, with Content-Length. The response is read
  by `ResponseParser` (sans I/O, so its tests need no sockets): the status
  line, headers, then a Content-Length, chunked or close-delimited body, at
  most `max_body` bytes of it (a longer one is cut and its connection closed).
  1xx responses before the final one are skipped.
- A kept-alive connection that the server closed just as it was reused fails
  before any byte of an answer; that request goes again, once, on a new
  connection (deliveries are idempotent by webhook-id).
- Errors are HTTPError subclasses; the timeouts are also TimeoutError.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from services.webhook.guard import Guard

MAX_HEAD_BYTES = 64 * 1024  # status line and headers of one response
MAX_HEADERS = 100
MAX_CHUNK_LINE = 4096  # a chunk-size line, extensions included
NO_BODY_STATUS = frozenset({204, 304})


class HTTPError(Exception):
    """The exchange failed: no (complete) response."""


class UnsupportedURL(HTTPError):
    """Not an http(s) URL with a host, or a header that cannot be sent."""


class ConnectError(HTTPError):
    """The connection (TCP or TLS) could not be made."""


class ReadError(HTTPError):
    """The connection ended or broke before the response was complete."""


class WriteError(HTTPError):
    """The connection broke while the request was being written."""


class ProtocolError(HTTPError):
    """The server's answer is not HTTP/1.x as it may be."""


class ConnectTimeout(HTTPError, TimeoutError):
    pass


class WriteTimeout(HTTPError, TimeoutError):
    pass


class ReadTimeout(HTTPError, TimeoutError):
    pass


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header's values joined by ", "
    body: bytes
    truncated: bool  # the body went past max_body and was cut there


# -- the response parser ---------------------------------------------------------------

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _CLOSE, _DONE = range(8)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_STATUS = re.compile(r"HTTP/1\.([01]) (\d{3})(?: .*)?")


class ResponseParser:
    """Bytes in, one response out. `feed` returns True once the response is
    complete (or cut at `max_body`); `feed_eof` says the connection ended.
    Malformed input raises ProtocolError, an early end ReadError.

    After completion: `status`, `headers`, `body()`, `truncated`, and
    `reusable` (the connection may carry another request: HTTP/1.1, no
    `connection: close`, a delimited body read to its end, nothing after it)."""

    __slots__ = (
        "max_body", "head_only", "state", "buf", "status", "headers", "chunks", "size",
        "remaining", "truncated", "keep_alive", "got_bytes", "reusable",
    )  # fmt: skip

    def __init__(self, max_body: int, head_only: bool = False):
        self.max_body = max_body
        self.head_only = head_only  # a response to HEAD: no body whatever the headers say
        self.state = _HEAD
        self.buf = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.remaining = 0
        self.truncated = False
        self.keep_alive = True
        self.got_bytes = False  # any byte of an answer came
        self.reusable = False

    @property
    def done(self) -> bool:
        return self.state == _DONE

    def body(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)

    def feed(self, data: bytes) -> bool:
        if data:
            self.got_bytes = True
        if self.state == _DONE:
            if data:
                self.reusable = False  # the server said more than it was asked
            return True
        buf = self.buf + data if self.buf else data
        self.buf = b""
        while True:
            state = self.state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ProtocolError("response head too long")
                    self.buf = buf
                    return False
                if end > MAX_HEAD_BYTES:
                    raise ProtocolError("response head too long")
                head, buf = buf[:end], buf[end + 4 :]
                self._head(head)
                if self.state == _DONE:  # no body
                    return self._finish(buf)
            elif state == _LENGTH:
                if not buf:
                    return False
                buf, capped = self._counted(buf)
                if capped:
                    return True
                return self._finish(buf) if self.remaining == 0 else False
            elif state == _CHUNK_SIZE:
                got = self._line(buf, MAX_CHUNK_LINE, "chunk-size line")
                if got is None:
                    return False
                line, buf = got
                text = line.split(b";", 1)[0].strip()
                if not text or len(text) > 16 or text.strip(b"0123456789abcdefABCDEF"):
                    raise ProtocolError(f"bad chunk size {line[:40]!r}")
                self.remaining = int(text, 16)
                self.state = _CHUNK_DATA if self.remaining else _TRAILERS
            elif state == _CHUNK_DATA:
                if not buf:
                    return False
                buf, capped = self._counted(buf)
                if capped:
                    return True
                if self.remaining:
                    return False
                self.state = _CHUNK_END
            elif state == _CHUNK_END:
                if len(buf) < 2:
                    self.buf = buf
                    return False
                if buf[:2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                buf = buf[2:]
                self.state = _CHUNK_SIZE
            elif state == _TRAILERS:
                got = self._line(buf, MAX_HEAD_BYTES, "trailers")
                if got is None:
                    return False
                line, buf = got
                if not line:  # trailers (ignored) end with an empty line
                    return self._finish(buf)
            elif state == _CLOSE:
                return self._keep(buf) if buf else False
            else:  # pragma: no cover - _DONE returned above
                return True

    def feed_eof(self) -> bool:
        """The connection ended: True when that completes the response."""
        if self.state == _DONE:
            return True
        if self.state == _CLOSE:
            self.state = _DONE
            return True
        if self.state == _HEAD and not self.got_bytes:
            raise ReadError("connection closed before any response")
        raise ReadError("connection closed in the middle of the response")

    def _counted(self, buf: bytes) -> tuple[bytes, bool]:
        """The next `remaining` body bytes of `buf` kept: (the rest of `buf`,
        whether the cap was passed)."""
        take = buf[: self.remaining] if len(buf) > self.remaining else buf
        self.remaining -= len(take)
        return buf[len(take) :], self._keep(take)

    def _line(self, buf: bytes, limit: int, what: str) -> tuple[bytes, bytes] | None:
        """(line, rest) at the next CRLF; None (the bytes kept for the next
        feed) when it has not come yet."""
        end = buf.find(b"\r\n")
        if end < 0:
            if len(buf) > limit:
                raise ProtocolError(f"{what} too long")
            self.buf = buf
            return None
        return buf[:end], buf[end + 2 :]

    def _keep(self, data: bytes) -> bool:
        """Add body bytes; True (and done) when the cap is passed."""
        room = self.max_body - self.size
        if len(data) > room:
            if room > 0:
                self.chunks.append(data[:room])
                self.size += room
            self.truncated = True
            self.keep_alive = False
            self.state = _DONE
            return True
        if data:
            self.chunks.append(data)
            self.size += len(data)
        return False

    def _finish(self, rest: bytes) -> bool:
        self.state = _DONE
        self.reusable = self.keep_alive and not rest
        return True

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        m = _STATUS.fullmatch(lines[0])
        if m is None:
            raise ProtocolError(f"bad status line {lines[0][:60]!r}")
        status = int(m.group(2))
        if len(lines) - 1 > MAX_HEADERS:
            raise ProtocolError("too many response headers")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not _TOKEN.fullmatch(name):
                raise ProtocolError(f"bad header line {line[:60]!r}")
            name = name.lower()
            value = value.strip(" \t")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if 100 <= status < 200 and status != 101:
            return  # informational: the final response follows (state stays _HEAD)
        self.status = status
        self.headers = headers
        conn = headers.get("connection", "").lower()
        self.keep_alive = m.group(1) == "1" and "close" not in conn and status != 101
        if self.head_only or status in NO_BODY_STATUS or status == 101:
            self.state = _DONE
            return
        te = headers.get("transfer-encoding")
        if te is not None:
            if te.lower().rsplit(",", 1)[-1].strip() == "chunked":
                self.state = _CHUNK_SIZE
                if "content-length" in headers:
                    self.keep_alive = False  # both framings: smuggling-shaped; no reuse
            else:
                self.state = _CLOSE
                self.keep_alive = False
            return
        cl = headers.get("content-length")
        if cl is not None:
            values = {v.strip() for v in cl.split(",")}
            if len(values) != 1 or not (v := values.pop()).isdigit() or len(v) > 18:
                raise ProtocolError(f"bad content-length {cl[:40]!r}")
            self.remaining = int(v)
            self.state = _LENGTH if self.remaining else _DONE
            return
        self.state = _CLOSE  # read until the server closes
        self.keep_alive = False


# -- a connection -------------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: an asyncio protocol that feeds the bytes it gets
    to the parser of the request under way."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future | None = None
        self.closed = False
        self.idle_since = 0.0
        self.writing = False  # waiting for room to write the request
        self._writable: asyncio.Future | None = None

    # asyncio's side
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:  # nothing asked: the connection is not ours to trust
            self.close()
            return
        try:
            done = parser.feed(data)
        except HTTPError as exc:
            self._wake(exc)
            return
        if done:
            self._wake(None)

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.writing and self.parser is not None and not self.parser.got_bytes:
            self._wake(WriteError(f"connection lost while writing: {exc}"))
        self._ended(exc)
        self.resume_writing()  # a writer waiting for room goes on to the answer (or error)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        w, self._writable = self._writable, None
        if w is not None and not w.done():
            w.set_result(None)

    def _ended(self, exc: Exception | None) -> None:
        parser = self.parser
        self.closed = True
        if parser is None or self.waiter is None or self.waiter.done():
            return
        if exc is not None and parser.state == _CLOSE:  # broken, not ended: the body is cut
            self._wake(ReadError(f"connection broken in the middle of the response: {exc}"))
            return
        try:
            parser.feed_eof()
        except HTTPError as e:
            if exc is not None:
                e = type(e)(f"{e}: {exc}")
            self._wake(e)
            return
        self._wake(None)

    def _wake(self, exc: BaseException | None) -> None:
        w = self.waiter
        if w is not None and not w.done():
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)

    # ours
    @property
    def usable(self) -> bool:
        """Idle, open, and nothing came from the server meanwhile (EOF included)."""
        t = self.transport
        return not self.closed and t is not None and not t.is_closing()

    async def exchange(self, request: bytes, parser: ResponseParser) -> ResponseParser:
        """Send `request`, wait for the response. The caller's timeout bounds it;
        a connection left mid-exchange (an error, a cancel) is closed."""
        loop = asyncio.get_running_loop()
        self.parser = parser
        self.waiter = loop.create_future()
        ok = False
        try:
            self.transport.write(request)
            if self._writable is not None:  # the kernel's buffer is full: wait for room
                self.writing = True
                await self._writable
                self.writing = False
            await self.waiter
            ok = True
            return parser
        finally:
            self.waiter = None
            self.parser = None
            if not (ok and parser.reusable):
                self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


# -- the client ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    scheme: str
    host: str  # for the guard and SNI (IDNA-encoded)
    port: int
    head: str  # "<target> HTTP/1.1\r\nhost: <host[:port]>\r\n" (the method goes first)
    origin: tuple[str, str, int]


_TARGETS: dict[str, _Target] = {}
_BAD_VALUE = re.compile(r"[\r\n\x00]")


def parse_url(url: str) -> _Target:
    """What a request to `url` needs, kept per URL (targets repeat)."""
    got = _TARGETS.get(url)
    if got is not None:
        return got
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise UnsupportedURL(f"bad URL: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UnsupportedURL(f"{parts.scheme!r} is not http or https")
    host = parts.hostname
    if not host:
        raise UnsupportedURL("the URL has no host")
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError as e:
        raise UnsupportedURL(f"bad host name: {e}") from None
    default = 443 if scheme == "https" else 80
    port = port or default
    shown = f"[{host}]" if ":" in host else host
    if port != default:
        shown = f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if _BAD_VALUE.search(target) or " " in target:
        raise UnsupportedURL("the URL's path holds spaces or control characters")
    got = _Target(
        scheme, host, port, f" {target} HTTP/1.1\r\nhost: {shown}\r\n", (scheme, host, port)
    )
    if len(_TARGETS) >= 4096:
        _TARGETS.clear()
    _TARGETS[url] = got
    return got


def encode_request(method: str, t: _Target, headers: Mapping[str, str], body: bytes) -> bytes:
    """The request's bytes: head and body in one buffer (one write)."""
    if not _TOKEN.fullmatch(method):
        raise UnsupportedURL(f"bad method {method!r}")
    parts = [method, t.head]
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise UnsupportedURL(f"header {name!r} cannot be sent as it is")
        parts.append(f"{name}: {value}\r\n")
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        parts.append(f"content-length: {len(body)}\r\n")
    parts.append("\r\n")
    head = "".join(parts).encode("utf-8")
    return head + body if body else head


class _Pool:
    __slots__ = ("idle", "busy")

    def __init__(self) -> None:
        self.idle: list[Connection] = []
        self.busy = 0


class Client:
    """The service's shared client: per-origin keep-alive pools over the guard."""

    def __init__(
        self,
        guard: Guard,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ):
        self.guard = guard
        self.ssl_context = ssl_context or ssl.create_default_context()
        self.keepalive_s = keepalive_s
        self.headers = {"accept-encoding": "identity", **(headers or {})}
        self.pools: dict[tuple[str, str, int], _Pool] = {}

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        max_body: int = 64 * 1024,
    ) -> Response:
        """One exchange within `timeout_s` (connecting within `connect_timeout_s`
        of it). Raises an HTTPError (DestinationRefused from the guard)."""
        t = parse_url(url)
        all_headers = {**self.headers, **headers} if headers else self.headers
        data = encode_request(method, t, all_headers, body)
        pool = self.pools.get(t.origin)
        if pool is None:
            pool = self.pools[t.origin] = _Pool()
        phase = "connect"
        conn: Connection | None = None
        pool.busy += 1  # from here: `sweep` keeps the pool this request will return to
        try:
            async with asyncio.timeout(timeout_s):
                reuse = True
                while True:
                    conn = self._idle(pool) if reuse else None
                    reused = conn is not None
                    if conn is None:
                        phase = "connect"
                        conn = await self._connect(t, min(connect_timeout_s, timeout_s))
                    phase = "read"
                    parser = ResponseParser(max_body, head_only=method == "HEAD")
                    try:
                        await conn.exchange(data, parser)
                    except (ReadError, WriteError):
                        if reused and not parser.got_bytes:
                            reuse = False  # the server had closed it: once more, anew
                            continue
                        raise
                    if conn.usable:  # exchange closed it otherwise
                        conn.idle_since = time.monotonic()
                        pool.idle.append(conn)
                    return Response(parser.status, parser.headers, parser.body(), parser.truncated)
        except TimeoutError as exc:
            if isinstance(exc, HTTPError):
                raise
            if phase == "read" and conn is not None and conn.writing:
                phase = "write"
            kind = {"connect": ConnectTimeout, "write": WriteTimeout}.get(phase, ReadTimeout)
            raise kind(f"{phase} timed out after {timeout_s:g} s") from None
        finally:
            pool.busy -= 1

    def _idle(self, pool: _Pool) -> Connection | None:
        now = time.monotonic()
        while pool.idle:
            conn = pool.idle.pop()
            if conn.usable and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self, t: _Target, timeout_s: float) -> Connection:
        tls = t.scheme == "https"
        try:
            async with asyncio.timeout(timeout_s):
                _transport, conn = await self.guard.connect(
                    t.host,
                    t.port,
                    Connection,
                    ssl=self.ssl_context if tls else None,
                    server_hostname=t.host if tls else None,
                )
        except TimeoutError:
            raise ConnectTimeout(f"connecting to {t.host}:{t.port} timed out") from None
        except (OSError, ssl.SSLError) as e:
            raise ConnectError(f"{t.host}:{t.port}: {e}") from None
        return conn

    def sweep(self) -> None:
        """Close idle connections past their keep-alive; forget unused origins."""
        now = time.monotonic()
        for key, pool in list(self.pools.items()):
            keep = []
            for conn in pool.idle:
                if conn.usable and now - conn.idle_since < self.keepalive_s:
                    keep.append(conn)
                else:
                    conn.close()
            pool.idle = keep
            if not keep and not pool.busy:
                del self.pools[key]

    def close(self) -> None:
        pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            for conn in pool.idle:
                conn.close()
            pool.idle = []
