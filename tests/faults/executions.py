"""The managed executor's executions, as lines of the effect log
(tests/faults/harness.py), for the load's managed job in the replays.

A managed run's command runs in the executor's sandbox, which lets it write
nothing outside its own scratch and reach nothing on this host (no shared
file, no network to the harness): unlike the SDK worker's handler and the
webhook receiver, the command cannot append to the effect log itself. The
executor logs one line per command it ran, once the command ended: `run <id>
attempt <n>: <how it ended>, exit code <c>, <ms> ms`, with `run_id` and
`attempt` as fields (JSON lines: the layout sets CRONWHEEL_LOG_FORMAT=json).
Each such line is one execution, recorded by the process that started it,
with no deduplication; read into the effect log as a `start` at the
command's beginning and, when it exited 0, an `effect` at its end, they are
counted as the worker's executions are. What this cannot see: a command
started by an executor that died before it logged the end (the replays stop
the executor with SIGTERM, which waits for its commands and logs them)."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path

from tests.faults import effect_log as effect_log_file

# services/executor/service.py, `_run_and_complete`'s log line.
_ENDED = re.compile(r"^run \S+ attempt \d+: (\w+), exit code (-?\d+), (\d+) ms$")


def log_executions(log_dir: Path, effect_log: Path) -> int:
    """Append to `effect_log` a start (and an effect) for every command the
    executors whose logs are in `log_dir` (executor-N.log) ran; returns how
    many commands that was."""
    lines = []
    for path in sorted(log_dir.glob("executor-*.log")):
        for text in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(text)
            except ValueError:
                continue  # librdkafka's own lines, on stderr
            m = _ENDED.match(str(record.get("message", "")))
            if not m or "run_id" not in record:
                continue
            how, code, took = m.group(1), int(m.group(2)), int(m.group(3))
            ended = round(datetime.fromisoformat(record["time"]).timestamp() * 1000)
            run, attempt = record["run_id"], record["attempt"]
            lines.append(effect_log_file.line(run, attempt, "start", "executor", ended - took))
            if how == "exited" and code == 0:
                lines.append(effect_log_file.line(run, attempt, "effect", "executor", ended))
    fd = effect_log_file.opened(effect_log)
    try:
        effect_log_file.append(fd, lines, sync=True)
    finally:
        os.close(fd)
    return sum(1 for line in lines if line["phase"] == "start")
