-- The dispatcher's idempotency record: which (run_id, attempt) it has forwarded.
-- Rows of the `processed` table are keyed by (consumer, message_key).

-- name: seen
SELECT message_key
  FROM processed
 WHERE consumer = %(consumer)s
   AND message_key = ANY(%(keys)s::text[]);

-- name: mark_processed
-- ON CONFLICT: another instance (during a rebalance) may have recorded it first.
INSERT INTO processed (consumer, message_key)
SELECT %(consumer)s, k FROM unnest(%(keys)s::text[]) AS k
ON CONFLICT DO NOTHING;

-- name: prune
-- One bounded bite of a consumer's rows older than the redelivery window,
-- oldest first (processed_age), so a large backlog of old rows never holds
-- locks or bloats one transaction.
DELETE FROM processed p
 USING (SELECT consumer, message_key FROM processed
         WHERE consumer = %(consumer)s AND processed_at < %(before)s
         ORDER BY processed_at
         LIMIT %(limit)s) old
 WHERE p.consumer = old.consumer AND p.message_key = old.message_key;
