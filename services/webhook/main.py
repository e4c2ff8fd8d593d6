"""`cronwheel serve webhook`.

Settings: CRONWHEEL_WEBHOOK_ALLOW_CIDRS (destinations allowed beyond public
addresses), CRONWHEEL_WEBHOOK_INSTANCE (the `webhook:<instance>` worker id;
random if unset) and CRONWHEEL_WEBHOOK_<SETTING> for each field of
services.webhook.service.Settings (PER_ENDPOINT, MAX_IN_FLIGHT,
BREAKER_FAILURES, BREAKER_COOLDOWN_MS, CONNECT_TIMEOUT_MS, ...)."""

from __future__ import annotations

import os

from cronwheel import config, metrics
from cronwheel.kafka import Topics
from cronwheel.runtime import setup_logging, stop_on_signals
from services.webhook.service import Settings, WebhookService


def main() -> None:
    log = setup_logging("webhook")
    metrics.serve("webhook")
    service = WebhookService(
        config.database_url(),
        config.kafka_bootstrap(),
        Topics.from_env(),
        instance=os.environ.get("CRONWHEEL_WEBHOOK_INSTANCE") or None,
        settings=Settings.from_env(),
    )
    log.info(
        "webhook %s starting (group %s, allowed beyond public: %s)",
        service.worker_id,
        service.group_id,
        ", ".join(map(str, service.allow)) or "nothing",
    )
    service.run(stop_on_signals())


if __name__ == "__main__":
    main()
