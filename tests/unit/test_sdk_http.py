"""The SDK's HTTP client against a real local HTTP server (the standard
library's): connections kept alive and reused, a connection the server closed
while idle replaced without the caller seeing it, no answer an HttpError."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cronwheel.sdk.http import Client, HttpError


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, close_after_each: bool):
        self.close_after_each = close_after_each
        self.peers: list[int] = []  # the client's port of each request
        self.bodies: list[tuple[str, dict, str]] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.peers.append(self.client_address[1])
        self.server.bodies.append((self.path, body, self.headers["Authorization"]))
        out = json.dumps({"echo": body}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
        # Closes without saying so (no "Connection: close"), as a server does
        # with a connection that stayed idle past its keep-alive timeout.
        self.close_connection = self.server.close_after_each

    def log_message(self, *args) -> None:
        pass


@contextmanager
def _serving(close_after_each: bool = False) -> Iterator[_Server]:
    server = _Server(close_after_each)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _client(server: _Server, path: str = "") -> Client:
    host, port = server.server_address
    return Client(f"http://{host}:{port}{path}", {"Authorization": "Bearer k"}, 5.0, 2)


def test_post_json__answers_and_reuses_the_connection():
    with _serving() as server:
        client = _client(server, "/api/")
        first = client.post_json("/v1/runs/start-batch", {"runs": [1]})
        second = client.post_json("/v1/runs/complete-batch", {"runs": [2]})
        client.close()
    assert (first.status_code, first.json()) == (201, {"echo": {"runs": [1]}})
    assert second.json() == {"echo": {"runs": [2]}} and second.text.startswith('{"echo"')
    assert server.bodies == [
        ("/api/v1/runs/start-batch", {"runs": [1]}, "Bearer k"),
        ("/api/v1/runs/complete-batch", {"runs": [2]}, "Bearer k"),
    ]
    assert len(set(server.peers)) == 1  # one connection, kept alive


def test_post_json__connection_closed_while_idle__sent_again_on_a_new_one():
    with _serving(close_after_each=True) as server:
        client = _client(server)
        answers = [client.post_json("/v1/x", {"n": n}).json() for n in range(3)]
        client.close()
    assert answers == [{"echo": {"n": n}} for n in range(3)]
    assert [body for _, body, _ in server.bodies] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert len(set(server.peers)) == 3  # each request after the first on a new one


def test_post_json__nothing_listening__http_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        client = Client(f"http://127.0.0.1:{port}", {}, 2.0, 1)
        with pytest.raises(HttpError, match="POST /v1/x"):
            client.post_json("/v1/x", {})


def test_client__not_an_http_url__refused():
    with pytest.raises(ValueError, match="not an http"):
        Client("ftp://example.com", {}, 1.0, 1)
