-- Webhook targets: per-owner signing secrets and what the webhook service reads
-- to deliver a run. The owner is a job, or a workflow for its webhook nodes.

-- name: owner_exists
-- The owner is a live job or workflow of this tenant (secrets of nothing are refused).
SELECT 1 FROM jobs
 WHERE partition_id = %(p)s AND job_id = %(owner_id)s AND tenant_id = %(tenant_id)s
   AND deleted_at IS NULL
UNION ALL
SELECT 1 FROM workflows
 WHERE partition_id = %(p)s AND workflow_id = %(owner_id)s AND tenant_id = %(tenant_id)s
   AND deleted_at IS NULL
LIMIT 1;

-- name: insert_secret
-- Fails on webhook_secrets_current when the owner already has a current secret.
-- The secret is sealed (migration 0016): `secret`, the plaintext column, stays NULL.
INSERT INTO webhook_secrets
       (partition_id, owner_id, secret_id, tenant_id, sealed, key_id, created_at)
VALUES (%(p)s, %(owner_id)s, %(secret_id)s, %(tenant_id)s, %(sealed)s, %(key_id)s, %(now)s)
RETURNING secret_id, created_at;

-- name: retire_current
-- Rotation: every secret still signing stops at `until` at the latest (the end
-- of the overlap; now, for an emergency rotation). FOR UPDATE in the CTE
-- serialises two rotations of one owner.
WITH cur AS (
    SELECT partition_id, owner_id, secret_id FROM webhook_secrets
     WHERE partition_id = %(p)s AND owner_id = %(owner_id)s AND tenant_id = %(tenant_id)s
       AND (expires_at IS NULL OR expires_at > %(until)s)
       FOR UPDATE)
UPDATE webhook_secrets s
   SET expires_at = %(until)s
  FROM cur
 WHERE s.partition_id = cur.partition_id AND s.owner_id = cur.owner_id
   AND s.secret_id = cur.secret_id
RETURNING s.secret_id, s.created_at, s.expires_at;

-- name: secrets_of
-- The secrets that sign now, newest first (the current one, then those in overlap):
-- sealed (with its key id), or, for a row from before 0016, in plaintext.
SELECT secret_id, secret, created_at, expires_at, sealed, key_id FROM webhook_secrets
 WHERE partition_id = %(p)s AND owner_id = %(owner_id)s
   AND (expires_at IS NULL OR expires_at > %(now)s)
 ORDER BY created_at DESC, secret_id;

-- name: delivery_targets
-- Per run id: the run's state and attempt (to skip stale records), its spec (the
-- target as the run was created with it) and the secrets that sign it now, as
-- parallel arrays (newest first): id, plaintext (rows from before 0016), sealed
-- value and its key id. Runs whose instant is in the window [lo, hi) only
-- (store/run_days.py: the days around now first).
SELECT r.run_id, r.tenant_id, r.state, r.attempt, r.spec, r.job_id, r.workflow_run_id,
       r.node, r.scheduled_at, o.owner_id, s.ids, s.plain, s.sealed, s.key_ids
  FROM unnest(%(p)s::smallint[], %(id)s::text[]) AS k(p, id)
  JOIN runs_daily r ON r.partition_id = k.p AND r.run_id = k.id
   AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC')
   AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
 CROSS JOIN LATERAL (
       SELECT COALESCE(r.job_id, (SELECT w.workflow_id FROM workflow_runs w
                                   WHERE w.partition_id = r.partition_id
                                     AND w.workflow_run_id = r.workflow_run_id))) AS o(owner_id)
 CROSS JOIN LATERAL (
       SELECT array_agg(x.secret_id ORDER BY x.created_at DESC, x.secret_id),
              array_agg(x.secret ORDER BY x.created_at DESC, x.secret_id),
              array_agg(x.sealed ORDER BY x.created_at DESC, x.secret_id),
              array_agg(x.key_id ORDER BY x.created_at DESC, x.secret_id)
         FROM webhook_secrets x
        WHERE x.partition_id = r.partition_id AND x.owner_id = o.owner_id
          AND (x.expires_at IS NULL OR x.expires_at > %(now)s)) AS s(ids, plain, sealed, key_ids);

-- name: defer_retry
-- Retry-After asked for longer than the backoff: the retry timer that CompleteRun
-- just armed (`retry:<run_id>`, this attempt) fires no earlier than not_before.
UPDATE timers
   SET due_at = GREATEST(due_at, %(not_before)s)
 WHERE partition_id = %(p)s AND timer_id = 'retry:' || %(run_id)s AND kind = 'retry'
   AND attempt = %(attempt)s
RETURNING due_at;

-- name: to_reseal
-- A batch of secrets not sealed with the current key (plaintext rows from before
-- 0016, or sealed with an older key), after the last one seen, locked so that two
-- reseals never fight over a row.
SELECT partition_id, owner_id, secret_id, secret, sealed, key_id FROM webhook_secrets
 WHERE (key_id IS DISTINCT FROM %(current)s OR secret IS NOT NULL)
   AND secret_id > %(after)s
 ORDER BY secret_id
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: reseal
UPDATE webhook_secrets SET secret = NULL, sealed = %(sealed)s, key_id = %(key_id)s
 WHERE partition_id = %(p)s AND owner_id = %(owner_id)s AND secret_id = %(secret_id)s;
