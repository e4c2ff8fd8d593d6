"""The webhook service's HTTP/1.1 client: the response parser on its own (framing,
caps, malformed answers), the request bytes, and the client against small
servers on loopback (keep-alive, timeouts, TLS with the URL's host name)."""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
import ssl
import subprocess

import pytest

from services.webhook import http
from services.webhook.guard import Guard
from services.webhook.http import Client, ResponseParser, encode_request, parse_url

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"


def parse(data: bytes, max_body: int = 1024, *, by: int = 0, eof: bool = False, **kw):
    """Feed `data` whole, or `by` bytes at a time; then the end of the connection if `eof`."""
    p = ResponseParser(max_body, **kw)
    parts = [data] if not by else [data[i : i + by] for i in range(0, len(data), by)]
    done = False
    for part in parts:
        done = p.feed(part)
    if eof and not done:
        p.feed_eof()
    return p


# -- the parser --------------------------------------------------------------------------


@pytest.mark.parametrize("by", [0, 1, 3])
def test_parser__content_length__complete_and_reusable(by):
    p = parse(OK, by=by)
    assert p.done and p.status == 200 and p.body() == b"ok" and p.reusable
    assert p.headers == {"content-length": "2", "content-type": "text/plain"}
    assert not p.truncated


@pytest.mark.parametrize("by", [0, 1, 5])
def test_parser__chunked__extensions_and_trailers(by):
    raw = (
        b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n"
        b"5;name=value\r\nhello\r\n"
        b"7\r\n, world\r\n"
        b"0\r\nx-trailer: 1\r\n\r\n"
    )
    p = parse(raw, by=by)
    assert p.done and p.status == 503 and p.body() == b"hello, world" and p.reusable
    assert p.headers["retry-after"] == "3"


def test_parser__close_delimited__done_at_eof__not_reusable():
    p = parse(b"HTTP/1.1 200 OK\r\n\r\nuntil the ", eof=False)
    assert not p.done
    p.feed(b"end")
    assert p.feed_eof() and p.done and p.body() == b"until the end" and not p.reusable


def test_parser__unknown_transfer_encoding__read_to_close():
    p = parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nzz", eof=True)
    assert p.done and p.body() == b"zz" and not p.reusable


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\n012345\r\n4\r\n6789\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n0123456789",
    ],
    ids=["content-length", "chunked", "close-delimited"],
)
def test_parser__oversize_body__cut_at_the_cap__truncated__connection_not_reused(raw):
    p = parse(raw, max_body=4)
    assert p.done and p.truncated and p.body() == b"0123" and not p.reusable


def test_parser__body_exactly_the_cap__not_truncated():
    p = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n0123", max_body=4)
    assert p.done and not p.truncated and p.body() == b"0123" and p.reusable


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\nHTTP/1.1 200 OK\r\n",  # more than asked
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["connection-close", "http-1.0", "bytes-after", "both-framings"],
)
def test_parser__complete_but_connection_not_reusable(raw):
    p = parse(raw)
    assert p.done and p.status == 200 and not p.reusable


def test_parser__informational_responses_skipped():
    p = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n" + OK, by=7)
    assert p.done and p.status == 200 and p.body() == b"ok"


@pytest.mark.parametrize("status", [204, 304])
def test_parser__no_body_statuses__done_at_the_head(status):
    p = parse(b"HTTP/1.1 %d X\r\ncontent-length: 10\r\n\r\n" % status)
    assert p.done and p.body() == b"" and p.reusable


def test_parser__response_to_head__no_body():
    p = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n", head_only=True)
    assert p.done and p.body() == b""


def test_parser__repeated_headers_joined__names_lower_case__values_trimmed():
    p = parse(b"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-a:2 \r\nContent-Length: 0\r\n\r\n")
    assert p.headers == {"x-a": "1, 2", "content-length": "0"}


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"ICY 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nokXX",
        b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"y" * 70_000,
        b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 101 + b"\r\n",
    ],
)
def test_parser__malformed__protocol_error(raw):
    with pytest.raises(http.ProtocolError):
        parse(raw)


def test_parser__duplicate_equal_content_lengths__accepted():
    p = parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok")
    assert p.done and p.body() == b"ok"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "before any response"),
        (b"HTTP/1.1 200 OK\r\ncont", "middle"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok", "middle"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nok", "middle"),
    ],
)
def test_parser__connection_ends_early__read_error(raw, match):
    p = ResponseParser(1024)
    p.feed(raw)
    with pytest.raises(http.ReadError, match=match):
        p.feed_eof()
    assert p.got_bytes == bool(raw)


# -- the request bytes ------------------------------------------------------------------


def test_request__head_and_body_in_one_buffer_with_content_length():
    t = parse_url("http://example.com:8080/a/b?x=1#frag")
    got = encode_request("POST", t, {"content-type": "application/json"}, b'{"a":1}')
    assert got == (
        b"POST /a/b?x=1 HTTP/1.1\r\nhost: example.com:8080\r\n"
        b'content-type: application/json\r\ncontent-length: 7\r\n\r\n{"a":1}'
    )
    assert encode_request("GET", parse_url("https://example.com"), {}, b"") == (
        b"GET / HTTP/1.1\r\nhost: example.com\r\n\r\n"
    )
    assert b"content-length: 0\r\n" in encode_request("POST", t, {}, b"")


def test_request__ipv6_and_idna_hosts():
    assert parse_url("http://[::1]:81/").head.endswith("host: [::1]:81\r\n")
    t = parse_url("https://bücher.example/")
    assert t.host == "xn--bcher-kva.example" and t.port == 443


@pytest.mark.parametrize(
    "headers",
    [{"x-a": "1\r\nx-injected: 1"}, {"x-a": "1\n"}, {"bad name": "1"}, {"x:y": "1"}],
)
def test_request__header_that_would_split_the_request__refused(headers):
    with pytest.raises(http.UnsupportedURL):
        encode_request("POST", parse_url("http://example.com/"), headers, b"")


# -- the client against a server ---------------------------------------------------------


class Serving:
    """`handler` served on a port of its own; on exit the server closes and every
    handler is waited for (none outlives the test's loop)."""

    def __init__(self, handler, **kwargs):
        self.handler = handler
        self.kwargs = kwargs
        self.tasks: list[asyncio.Task] = []

    async def _handle(self, reader, writer):
        self.tasks.append(asyncio.current_task())
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0, **self.kwargs)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    size = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            size = int(line.split(b":")[1])
    return head + await reader.readexactly(size)


def _in_a_row(handler, requests: list[dict], client: Client | None = None, path: str = "/"):
    """The responses to `requests` (keyword arguments of Client.request beside the
    method and URL) sent one after another through one client to `handler`."""

    async def main():
        c = client or Client(Guard(LOOPBACK))
        async with Serving(handler) as port:
            try:
                url = f"http://127.0.0.1:{port}{path}"
                return [await c.request("POST", url, **r) for r in requests]
            finally:
                c.close()

    return asyncio.run(main())


def test_client__keep_alive__one_connection_for_several_requests():
    connections = []
    requests = []

    async def handler(reader, writer):
        connections.append(1)
        try:
            while True:
                requests.append(await _read_request(reader))
                writer.write(OK)
        except asyncio.IncompleteReadError:
            writer.close()

    got = _in_a_row(
        handler,
        [{"headers": {"x-n": str(i)}, "body": b"{}"} for i in range(3)],
        Client(Guard(LOOPBACK), headers={"user-agent": "t"}),
        "/h",
    )
    assert [r.status for r in got] == [200, 200, 200] and got[0].body == b"ok"
    assert len(connections) == 1 and len(requests) == 3
    assert b"user-agent: t\r\n" in requests[0] and b"accept-encoding: identity\r\n" in requests[0]
    assert requests[2].endswith(b"x-n: 2\r\ncontent-length: 2\r\n\r\n{}")


def test_client__chunked_then_close_delimited__second_on_a_new_connection():
    answers = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        b"HTTP/1.1 201 Created\r\n\r\nto the end",
    ]
    connections = []

    async def handler(reader, writer):
        connections.append(1)
        try:
            while answers:
                await _read_request(reader)
                answer = answers.pop(0)
                writer.write(answer)
                if b"chunked" not in answer:
                    break
        finally:
            writer.close()

    a, b = _in_a_row(handler, [{"headers": {}, "body": b"{}"}] * 2)
    assert (a.status, a.body, b.status, b.body) == (200, b"hi", 201, b"to the end")
    assert len(connections) == 1  # the close-delimited one ended its connection


def test_client__oversize_response__cut__next_request_on_a_new_connection():
    connections = []

    async def handler(reader, writer):
        connections.append(1)
        try:
            while True:
                await _read_request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n" + b"z" * 100_000)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    got = _in_a_row(handler, [{"headers": {}, "max_body": 1000}] * 2)
    assert all(r.truncated and r.body == b"z" * 1000 for r in got)
    assert len(connections) == 2


def test_client__no_answer__read_timeout__connection_not_reused():
    connections = []

    async def handler(reader, writer):
        connections.append(1)
        await _read_request(reader)
        if len(connections) == 1:
            await reader.read()  # no answer: until the client gives up and closes
        else:
            writer.write(OK)
            await writer.drain()

    async def main():
        client = Client(Guard(LOOPBACK))
        async with Serving(handler) as port:
            url = f"http://127.0.0.1:{port}/"
            try:
                with pytest.raises(http.ReadTimeout) as caught:
                    await client.request("POST", url, {}, b"{}", timeout_s=0.2)
                second = await client.request("POST", url, {}, b"{}")
                return caught.value, second
            finally:
                client.close()

    exc, second = asyncio.run(main())
    assert isinstance(exc, TimeoutError) and second.status == 200
    assert len(connections) == 2


def test_client__server_reads_nothing__write_timeout():
    done = asyncio.Event

    async def main():
        finished = done()

        async def handler(reader, writer):
            await finished.wait()  # never reads: the request's body fills the buffers

        async with Serving(handler) as port:
            client = Client(Guard(LOOPBACK))
            try:
                await client.request(
                    "POST", f"http://127.0.0.1:{port}/", {}, b"x" * (64 << 20), timeout_s=0.5
                )
            finally:
                client.close()
                finished.set()

    with pytest.raises(http.WriteTimeout):
        asyncio.run(main())


def test_client__connect_hangs__connect_timeout():
    class Hanging(Guard):
        async def connect(self, *args, **kwargs):
            await asyncio.sleep(5)

    async def main():
        await Client(Hanging(LOOPBACK)).request(
            "POST", "http://127.0.0.1:9/", {}, b"", timeout_s=5, connect_timeout_s=0.1
        )

    with pytest.raises(http.ConnectTimeout):
        asyncio.run(main())


def test_client__malformed_answer__protocol_error():
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main():
        async with Serving(handler) as port:
            await Client(Guard(LOOPBACK)).request("GET", f"http://127.0.0.1:{port}/")

    with pytest.raises(http.ProtocolError):
        asyncio.run(main())


def _self_signed(tmp_path, name: str) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_client__https__certificate_checked_for_the_url_host_name(tmp_path):
    """The guard dials the vetted address (127.0.0.1); TLS still verifies the
    certificate (and sends SNI) for the URL's host name."""
    cert, key = _self_signed(tmp_path, "localhost")
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    sni = []
    server_ctx.sni_callback = lambda _sock, name, _ctx: sni.append(name)
    trusting = ssl.create_default_context(cafile=cert)

    async def handler(reader, writer):
        try:
            await _read_request(reader)
            writer.write(OK)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main():
        async with Serving(handler, ssl=server_ctx) as port:
            client = Client(Guard(LOOPBACK), ssl_context=trusting)
            ok = await client.request("POST", f"https://localhost:{port}/", {}, b"{}")
            client.close()
            with pytest.raises(http.ConnectError, match="certificate"):
                await Client(Guard(LOOPBACK)).request("POST", f"https://localhost:{port}/")
            return ok

    assert asyncio.run(main()).status == 200
    assert sni[0] == "localhost"
