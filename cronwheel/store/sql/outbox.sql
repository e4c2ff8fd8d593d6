-- The transactional outbox.

-- name: append
-- Binary parameters: as text, every value's bytes were hex-escaped by the
-- client and parsed back by the server (~60 us a row in a storm).
INSERT INTO outbox (partition_id, topic, key, value, headers, priority, not_before)
SELECT p, t, k, v, h::jsonb, pr, nb
  FROM unnest(%(partitions)b::smallint[], %(topics)b::text[], %(keys)b::bytea[],
              %(values)b::bytea[], %(headers)b::text[], %(priorities)b::smallint[],
              %(not_before)b::timestamptz[])
       AS r(p, t, k, v, h, pr, nb);

-- name: append_one
-- One row and the relay's wake-up in one statement (append and notify are two):
-- a single CompleteRun's RunCompleted. Scalar, so its generic plan is kept.
WITH o AS (
    INSERT INTO outbox (partition_id, topic, key, value, headers, priority, not_before)
    VALUES (%(p)s, %(topic)s, %(key)s, %(value)s, %(headers)s::jsonb, %(priority)s,
            %(not_before)s::timestamptz))
SELECT pg_notify('cw_outbox', '');

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

-- name: read_small
-- The relay's first try when the last pass found no backlog: everything
-- pending (LIMIT is one more than a batch, to tell a backlog apart). With
-- fewer rows than a batch, fairness has nothing to decide, so the lane walk
-- (two more queries) is skipped.
-- `exclude`: rows held or produced and not yet deleted (a hashed NOT IN,
-- however many there are). A row to be published after `hold_until` is left
-- for a later pass (the relay holds rows only that far ahead).
SELECT id, topic, key, value, headers, priority,
       floor(extract(epoch FROM not_before) * 1000)::bigint, partition_id
  FROM outbox
 WHERE partition_id = ANY(%(partitions)b::smallint[])
   AND id NOT IN (SELECT unnest(%(exclude)b::bigint[]))
   AND (not_before IS NULL OR not_before <= %(hold_until)s)
 LIMIT %(limit)s;

-- name: lanes
-- The lanes (class, topic) with rows in the caller's partitions, by class: a
-- loose index scan of outbox_lane, one descent per lane whatever its length.
WITH RECURSIVE lane(priority, topic) AS (
    (SELECT priority, topic FROM outbox
      WHERE partition_id = ANY(%(partitions)b::smallint[])
      ORDER BY priority, topic LIMIT 1)
    UNION ALL
    SELECT n.priority, n.topic
      FROM lane l
     CROSS JOIN LATERAL (
           SELECT o.priority, o.topic FROM outbox o
            WHERE (o.priority, o.topic) > (l.priority, l.topic)
              AND o.partition_id = ANY(%(partitions)b::smallint[])
            ORDER BY o.priority, o.topic
            LIMIT 1) n
)
SELECT priority, topic FROM lane;

-- name: read_lanes
-- Up to `quota` rows of each lane, oldest first, after `after` (the last id an
-- earlier round of the same pass read from it). Still no cursor across passes:
-- a row that commits late is read by a later pass.
-- Rows to be published after `hold_until` are left for a later pass, as in
-- read_small.
SELECT o.id, o.topic, o.key, o.value, o.headers, o.priority,
       floor(extract(epoch FROM o.not_before) * 1000)::bigint, o.partition_id
  FROM unnest(%(prio)b::smallint[], %(topic)b::text[], %(quota)b::int[], %(after)b::bigint[])
       AS l(prio, topic, quota, after)
 CROSS JOIN LATERAL (
       SELECT id, topic, key, value, headers, priority, not_before, partition_id FROM outbox
        WHERE priority = l.prio AND topic = l.topic AND id > l.after
          AND partition_id = ANY(%(partitions)b::smallint[])
          AND (not_before IS NULL OR not_before <= %(hold_until)s)
        ORDER BY id
        LIMIT l.quota) o;

-- name: delete_delivered
DELETE FROM outbox WHERE id = ANY(%(ids)s);

-- name: backlog
SELECT count(*) FROM outbox;
