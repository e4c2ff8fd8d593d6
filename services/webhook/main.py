"""`cronwheel serve webhook`. Settings: WebhookSettings (docs/settings.md)."""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

from cronwheel import config, metrics
from cronwheel.config import Common, Destinations, Metrics, group, setting
from cronwheel.consumer import run_restarting
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.webhook.service import Settings as Tunables
from services.webhook.service import WebhookService


@dataclass(frozen=True)
class TuningSettings:
    """CRONWHEEL_WEBHOOK_<NAME> for each field of the service's Settings, whose
    defaults (and meanings) are there."""

    per_endpoint: int = setting("CRONWHEEL_WEBHOOK_PER_ENDPOINT", Tunables.per_endpoint, minimum=1)
    max_in_flight: int = setting(
        "CRONWHEEL_WEBHOOK_MAX_IN_FLIGHT", Tunables.max_in_flight, minimum=1
    )
    tenant_slots: int = setting("CRONWHEEL_WEBHOOK_TENANT_SLOTS", Tunables.tenant_slots, minimum=1)
    breaker_failures: int = setting(
        "CRONWHEEL_WEBHOOK_BREAKER_FAILURES", Tunables.breaker_failures, minimum=1
    )
    breaker_cooldown_ms: int = setting(
        "CRONWHEEL_WEBHOOK_BREAKER_COOLDOWN_MS", Tunables.breaker_cooldown_ms, minimum=0
    )
    connect_timeout_ms: int = setting(
        "CRONWHEEL_WEBHOOK_CONNECT_TIMEOUT_MS", Tunables.connect_timeout_ms, minimum=1
    )
    default_timeout_ms: int = setting(
        "CRONWHEEL_WEBHOOK_DEFAULT_TIMEOUT_MS", Tunables.default_timeout_ms, minimum=1
    )
    max_response_bytes: int = setting(
        "CRONWHEEL_WEBHOOK_MAX_RESPONSE_BYTES", Tunables.max_response_bytes, minimum=0
    )
    retry_after_cap_ms: int = setting(
        "CRONWHEEL_WEBHOOK_RETRY_AFTER_CAP_MS", Tunables.retry_after_cap_ms, minimum=0
    )
    db_workers: int = setting("CRONWHEEL_WEBHOOK_DB_WORKERS", Tunables.db_workers, minimum=1)
    db_group: int = setting("CRONWHEEL_WEBHOOK_DB_GROUP", Tunables.db_group, minimum=1, maximum=128)
    batch: int = setting("CRONWHEEL_WEBHOOK_BATCH", Tunables.batch, minimum=1)
    max_waiting_per_partition: int = setting(
        "CRONWHEEL_WEBHOOK_MAX_WAITING_PER_PARTITION",
        Tunables.max_waiting_per_partition,
        minimum=1,
    )
    shutdown_grace_ms: int = setting(
        "CRONWHEEL_WEBHOOK_SHUTDOWN_GRACE_MS", Tunables.shutdown_grace_ms, minimum=0
    )
    keepalive_ms: int = setting("CRONWHEEL_WEBHOOK_KEEPALIVE_MS", Tunables.keepalive_ms, minimum=0)
    fetch_watch_ms: int = setting(
        "CRONWHEEL_WEBHOOK_FETCH_WATCH_MS", Tunables.fetch_watch_ms, minimum=0
    )


@dataclass(frozen=True)
class WebhookSettings:
    common: Common = group(Common)
    metrics: Metrics = group(Metrics)
    destinations: Destinations = group(Destinations)
    tuning: TuningSettings = group(TuningSettings)
    # The `webhook:<instance>` worker id; random if unset.
    instance: str | None = setting("CRONWHEEL_WEBHOOK_INSTANCE", None)


def main() -> None:
    settings = config.load(WebhookSettings)
    log = setup_logging("webhook", settings.common.log_level)
    metrics.serve("webhook", settings.metrics)
    instance = settings.instance or secrets.token_hex(4)  # one id across new clients

    def make() -> WebhookService:
        service = WebhookService(
            settings.common.database_url,
            settings.common.kafka_bootstrap,
            Topics(settings.common.topic_prefix),
            instance=instance,
            allow=settings.destinations.allow,
            settings=Tunables(**dataclasses.asdict(settings.tuning)),
        )
        log.info(
            "webhook %s starting (group %s, allowed beyond public: %s)",
            service.worker_id,
            service.group_id,
            ", ".join(map(str, service.allow)) or "nothing",
        )
        return service

    # New Kafka clients when librdkafka leaves the consumer stuck (cronwheel.fetch_watch).
    run_restarting(make, stop_on_signals())


if __name__ == "__main__":
    main()
