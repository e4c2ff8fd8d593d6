"""`cronwheel serve workflow`.

Settings: CRONWHEEL_WORKFLOW_INSTANCE_ID (a stable id per replica, e.g. the pod
name of a StatefulSet, turns on Kafka static membership so a restart resumes at
once), CRONWHEEL_WORKFLOW_BATCH, CRONWHEEL_WORKFLOW_COMMIT_INTERVAL_MS (0: commit
after every batch) and CRONWHEEL_WORKFLOW_SESSION_TIMEOUT_MS.
"""

from __future__ import annotations

import os

from cronwheel import config, metrics
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.workflow.service import WorkflowService


def main() -> None:
    log = setup_logging("workflow")
    metrics.serve("workflow")
    service = WorkflowService(
        config.database_url(),
        config.kafka_bootstrap(),
        Topics.from_env(),
        group_instance_id=os.environ.get("CRONWHEEL_WORKFLOW_INSTANCE_ID") or None,
        batch=int(os.environ.get("CRONWHEEL_WORKFLOW_BATCH", "500")),
        commit_interval_ms=int(os.environ.get("CRONWHEEL_WORKFLOW_COMMIT_INTERVAL_MS", "0")),
        session_timeout_ms=int(os.environ.get("CRONWHEEL_WORKFLOW_SESSION_TIMEOUT_MS", "10000")),
    )
    log.info(
        "workflow starting (group %s, instance %s)",
        service.group_id,
        service.group_instance_id or "dynamic",
    )
    service.run(stop_on_signals())


if __name__ == "__main__":
    main()
