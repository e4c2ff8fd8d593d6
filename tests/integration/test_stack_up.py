"""`cronwheel up` against a broker that is already running still grants the
platform's ACLs for the configured topic prefix: a prefix set after the broker
started (CRONWHEEL_TOPIC_PREFIX) gets them at the next `up`, not never."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from cronwheel import kafka
from tests.support.kafka import delete_topics, revoke
from tests.support.procs import PYTHON, ROOT

pytestmark = pytest.mark.integration


def relay_may_create(bootstrap: str, topic: str) -> bool:
    """Whether the relay's principal may create `topic` (the broker's answer)."""
    try:
        kafka.ensure_topics([topic], partitions=1, client=kafka.admin(bootstrap, principal="relay"))
    except RuntimeError as exc:
        assert "AUTHORIZATION" in str(exc), exc
        return False
    return True


def test_up__broker_already_running__grants_a_new_topic_prefix(kafka_bootstrap):
    if "sasl.username" not in kafka.security("admin", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")
    if os.environ.get("KAFKA_BOOTSTRAP"):
        pytest.skip("the broker is not `cronwheel up`'s (KAFKA_BOOTSTRAP names one)")
    prefix = f"up{uuid.uuid4().hex[:10]}"
    topic = f"{prefix}.runs.ten_x"
    try:
        assert not relay_may_create(kafka_bootstrap, topic), "granted before `up` ran"
        out = subprocess.run(
            [PYTHON, "-m", "services.entrypoints", "up"],
            env={**os.environ, "CRONWHEEL_TOPIC_PREFIX": prefix},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert relay_may_create(kafka_bootstrap, topic), "`up` did not grant the new prefix"
    finally:
        delete_topics(kafka_bootstrap, [prefix])
        revoke(kafka_bootstrap, [prefix])
