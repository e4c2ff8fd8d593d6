-- Fire ahead, publish on time (docs/architecture.md, "Firing ahead"). The
-- timer service creates a job's run up to CRONWHEEL_FIRE_AHEAD_MS before its
-- instant, in bigger and cheaper batches; its RunReady row says when it may be
-- published, and the relay holds it in memory until then. NULL: at once (every
-- other record, and runs whose instant has passed).
-- Nullable without a default: a change to the catalog only, no rewrite.
ALTER TABLE outbox ADD COLUMN not_before timestamptz;
