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
INSERT INTO webhook_secrets (partition_id, owner_id, secret_id, tenant_id, secret, created_at)
VALUES (%(p)s, %(owner_id)s, %(secret_id)s, %(tenant_id)s, %(secret)s, %(now)s)
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
-- The secrets that sign now, newest first (the current one, then those in overlap).
SELECT secret_id, secret, created_at, expires_at FROM webhook_secrets
 WHERE partition_id = %(p)s AND owner_id = %(owner_id)s
   AND (expires_at IS NULL OR expires_at > %(now)s)
 ORDER BY created_at DESC, secret_id;

-- name: delivery_targets
-- Per run id: the run's state and attempt (to skip stale records), its spec (the
-- target as the run was created with it) and the secrets that sign it now.
SELECT r.run_id, r.tenant_id, r.state, r.attempt, r.spec, r.job_id, r.workflow_run_id,
       r.node, r.scheduled_at, o.owner_id,
       ARRAY(SELECT s.secret FROM webhook_secrets s
              WHERE s.partition_id = r.partition_id AND s.owner_id = o.owner_id
                AND (s.expires_at IS NULL OR s.expires_at > %(now)s)
              ORDER BY s.created_at DESC, s.secret_id) AS secrets
  FROM unnest(%(p)s::smallint[], %(id)s::text[]) AS k(p, id)
  JOIN runs r ON r.partition_id = k.p AND r.run_id = k.id
 CROSS JOIN LATERAL (
       SELECT COALESCE(r.job_id, (SELECT w.workflow_id FROM workflow_runs w
                                   WHERE w.partition_id = r.partition_id
                                     AND w.workflow_run_id = r.workflow_run_id))) AS o(owner_id);

-- name: defer_retry
-- Retry-After asked for longer than the backoff: the retry timer that CompleteRun
-- just armed (`retry:<run_id>`, this attempt) fires no earlier than not_before.
UPDATE timers
   SET due_at = GREATEST(due_at, %(not_before)s)
 WHERE partition_id = %(p)s AND timer_id = 'retry:' || %(run_id)s AND kind = 'retry'
   AND attempt = %(attempt)s
RETURNING due_at;
