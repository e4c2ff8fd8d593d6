"""The gateway as a service like the others: `GatewayService(app, addr).run(stop)`
serves HTTP with uvicorn until `stop` is set.

The socket is bound in the constructor, so port 0 works (tests) and `url` is
known before the first request; `cronwheel serve gateway` runs it in the main
thread, tests in a background one (tests/support/running.py). With several
worker processes (main.py), each gets the supervisor's listening socket as
`sock` and they accept from it in turn.

uvicorn uses httptools and uvloop when they are installed (its "auto"), which
halves the event loop's CPU per request against h11 and asyncio.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn

try:
    import uvloop
except ImportError:  # pragma: no cover - an optional speed-up
    uvloop = None


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only
    # then, and without it every response waits ~40 ms on delayed ACKs.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


class GatewayService:
    def __init__(
        self,
        app,
        host: str = "127.0.0.1",
        port: int = 8080,
        log_level: str = "info",
        sock: socket.socket | None = None,
    ):
        self.app = app
        self.sock = sock if sock is not None else listen(host, port)
        bound = self.sock.getsockname()
        self.host, self.port = bound[0], bound[1]
        self.url = url_of(self.sock)
        self.server = uvicorn.Server(
            # log_config=None: uvicorn's lines go through the process's one
            # handler (cronwheel/logs.py's format), not a handler of its own.
            uvicorn.Config(
                app, log_level=log_level, access_log=False, lifespan="off", log_config=None
            )
        )

    def run(self, stop: threading.Event) -> None:
        def watch() -> None:
            stop.wait()
            self.server.should_exit = True

        threading.Thread(target=watch, daemon=True, name="gateway-stop").start()
        serve = self.server.serve(sockets=[self.sock])
        try:
            if uvloop is not None:
                uvloop.run(serve)
            else:
                asyncio.run(serve)
        finally:
            stop.set()
            self.sock.close()
