"""The webhook service: the platform as the worker for webhook targets.
See docs/webhooks.md."""
