"""`cronwheel serve workflow`. Settings: WorkflowSettings (docs/settings.md)."""

from __future__ import annotations

from dataclasses import dataclass

from cronwheel import config, metrics
from cronwheel.config import Common, Metrics, Processed, group, setting
from cronwheel.kafka import Topics
from cronwheel.runtime import freeze_heap, setup_logging, stop_on_signals
from services.workflow.service import WorkflowService


@dataclass(frozen=True)
class WorkflowSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    processed: Processed = group(Processed)
    # A stable id per replica (e.g. the pod name of a StatefulSet) turns on
    # Kafka static membership, so a restart resumes at once.
    instance_id: str | None = setting("CRONWHEEL_WORKFLOW_INSTANCE_ID", None)
    batch: int = setting("CRONWHEEL_WORKFLOW_BATCH", 500, minimum=1)
    # 0: commit after every batch.
    commit_interval_ms: int = setting("CRONWHEEL_WORKFLOW_COMMIT_INTERVAL_MS", 0, minimum=0)
    session_timeout_ms: int = setting("CRONWHEEL_WORKFLOW_SESSION_TIMEOUT_MS", 10_000, minimum=1)


def main() -> None:
    settings = config.load(WorkflowSettings)
    log = setup_logging("workflow", settings.common.log_level)
    metrics.serve("workflow", settings.metrics)
    service = WorkflowService(
        settings.common.database_url,
        settings.common.kafka_bootstrap,
        Topics(settings.common.topic_prefix),
        group_instance_id=settings.instance_id,
        batch=settings.batch,
        commit_interval_ms=settings.commit_interval_ms,
        session_timeout_ms=settings.session_timeout_ms,
        processed_retention_ms=settings.processed.retention_ms,
    )
    log.info(
        "workflow starting (group %s, instance %s)",
        service.group_id,
        service.group_instance_id or "dynamic",
    )
    freeze_heap()
    service.run(stop_on_signals())


if __name__ == "__main__":
    main()
