"""What `from cronwheel.sdk import Worker` loads: the SDK, the codec and the
offset tracker, nothing else of the platform (an allow-list, where pyproject's
`sdk-slim` contract can only name what it forbids)."""

from __future__ import annotations

import json
import subprocess
import sys

from cronwheel import config
from cronwheel.sdk import worker

ALLOWED = {"cronwheel", "cronwheel.sdk", "cronwheel.core", "cronwheel.core.avro",
           "cronwheel.core.offsets"}  # fmt: skip
PLATFORM_PACKAGES = {"prometheus_client", "psycopg", "psycopg_pool", "fastapi", "starlette",
                     "uvicorn", "httpx", "services"}  # fmt: skip


def test_import_sdk__loads_no_platform_module():
    code = (
        "import json, sys; from cronwheel.sdk import Worker; print(json.dumps(list(sys.modules)))"
    )
    loaded = json.loads(subprocess.check_output([sys.executable, "-c", code]))
    ours = {m for m in loaded if m.split(".")[0] == "cronwheel"}
    assert {m for m in ours if not m.startswith("cronwheel.sdk.")} <= ALLOWED
    assert {m.split(".")[0] for m in loaded} & PLATFORM_PACKAGES == set()


def test_default_bootstrap__is_the_local_stacks():
    # The SDK keeps its own copy of the address (it does not import config).
    assert worker.LOCAL_KAFKA_BOOTSTRAP == config.LOCAL_KAFKA_BOOTSTRAP


def test_worker_lost_link_settings__are_the_platforms():
    """The SDK keeps its own copy (it imports nothing of cronwheel.kafka):
    a worker must end and remake a lost link as the platform's clients do."""
    from cronwheel import kafka

    assert worker.LOST_LINK_MS == kafka.LOST_LINK_MS
