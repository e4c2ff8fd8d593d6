-- The transactional outbox.

-- name: append
INSERT INTO outbox (partition_id, topic, key, value, headers)
SELECT * FROM unnest(%(partitions)s::smallint[], %(topics)s::text[], %(keys)s::bytea[],
                     %(values)s::bytea[], %(headers)s::jsonb[]);

-- name: notify
SELECT pg_notify('cw_outbox', '');

-- name: read_batch
-- No cursor: whatever is here now, oldest first. A row that commits after a
-- newer one is read on the next pass, so nothing is ever skipped.
SELECT id, topic, key, value, headers
  FROM outbox
 WHERE partition_id = ANY(%(partitions)s)
 ORDER BY id
 LIMIT %(limit)s;

-- name: delete_delivered
DELETE FROM outbox WHERE id = ANY(%(ids)s);

-- name: backlog
SELECT count(*) FROM outbox;
