-- cronwheel: no-transaction
-- Idempotent consumers prune their `processed` rows once Kafka can no longer
-- redeliver the message (cronwheel/store/dispatch.py, Processed.prune): this
-- index finds a consumer's oldest rows without reading the table. Built
-- concurrently: on a live system the table is large and in constant use.
CREATE INDEX CONCURRENTLY IF NOT EXISTS processed_age ON processed (consumer, processed_at);
