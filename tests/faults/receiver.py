"""The fault harness's webhook receiver: the endpoint of the load's webhook
job, in the harness's own process, for scenarios whose layout runs the
webhook service (the replays: the webhook consumer is one of those read
again from offset 0).

Each request it gets is one execution of a run's attempt, so it appends to
the effect log what the SDK worker does (tests/faults/worker.py): a `start`
and an `effect` line with the run (`cronwheel-run-id`) and attempt
(`cronwheel-attempt`), no deduplication, and answers 200. The checker then
counts a webhook run's deliveries as it counts a worker's executions.
"""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.faults import effect_log as effect_log_file


class Receiver:
    def __init__(self, effect_log: Path):
        fd = effect_log_file.opened(effect_log)
        self._fd = fd

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("content-length", 0)))
                run = self.headers["cronwheel-run-id"]
                attempt = int(self.headers["cronwheel-attempt"])
                effect_log_file.append(
                    fd,
                    [effect_log_file.line(run, attempt, p, "webhook") for p in ("start", "effect")],
                )
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:  # one line per request is noise here
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        os.close(self._fd)
