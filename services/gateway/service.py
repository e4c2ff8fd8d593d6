"""The gateway as a service like the others: `GatewayService(app, addr).run(stop)`
serves HTTP with uvicorn until `stop` is set.

The socket is bound in the constructor, so port 0 works (tests) and `url` is
known before the first request; `cronwheel serve gateway` runs it in the main
thread, tests in a background one (tests/support/running.py).
"""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn


class GatewayService:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"):
        self.app = app
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only
        # then, and without it every response waits ~40 ms on delayed ACKs.
        self.sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(1024)
        bound = self.sock.getsockname()
        self.host, self.port = bound[0], bound[1]
        fmt = f"[{self.host}]" if family == socket.AF_INET6 else self.host
        self.url = f"http://{fmt}:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off")
        )

    def run(self, stop: threading.Event) -> None:
        def watch() -> None:
            stop.wait()
            self.server.should_exit = True

        threading.Thread(target=watch, daemon=True, name="gateway-stop").start()
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        finally:
            stop.set()
            self.sock.close()
