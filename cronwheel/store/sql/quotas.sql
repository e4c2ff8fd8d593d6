-- Per-tenant token buckets on firing and dispatch rates (cronwheel/store/quotas.py).

-- name: limited
-- The tenants that have a bucket of this kind: everyone else is not limited.
SELECT tenant_id FROM tenant_quotas WHERE kind = %(kind)s;

-- name: take
-- Refill each asked-for bucket for the time since its last refill, then grant
-- what it holds (whole tokens, at most what was asked) and debit it, in one
-- statement under the rows' locks. Tenants without a bucket are not returned.
WITH want AS (
    SELECT w.tenant_id, w.n
      FROM unnest(%(tenants)b::text[], %(wants)b::int[]) AS w(tenant_id, n)
), cur AS (
    SELECT q.tenant_id, w.n, q.rate_per_s,
           LEAST(q.burst, q.tokens + q.rate_per_s
                 * GREATEST(0, EXTRACT(EPOCH FROM (%(now)s - q.refilled_at)))) AS avail
      FROM tenant_quotas q
      JOIN want w ON w.tenant_id = q.tenant_id
     WHERE q.kind = %(kind)s
       FOR UPDATE OF q
), g AS (
    SELECT tenant_id, n, rate_per_s, avail,
           LEAST(n, GREATEST(0, floor(avail)))::int AS granted
      FROM cur
)
UPDATE tenant_quotas q
   SET tokens = g.avail - g.granted,
       refilled_at = GREATEST(q.refilled_at, %(now)s),
       held_total = q.held_total + (g.n - g.granted),
       held_at = CASE WHEN g.n > g.granted THEN %(now)s ELSE q.held_at END
  FROM g
 WHERE q.tenant_id = g.tenant_id AND q.kind = %(kind)s
RETURNING q.tenant_id, g.granted, g.n - g.granted, g.avail - g.granted, g.rate_per_s;

-- name: upsert
INSERT INTO tenant_quotas (tenant_id, kind, rate_per_s, burst, tokens, refilled_at, updated_at)
VALUES (%(tenant_id)s, %(kind)s, %(rate)s, %(burst)s, %(burst)s, %(now)s, %(now)s)
ON CONFLICT (tenant_id, kind) DO UPDATE
   SET rate_per_s = EXCLUDED.rate_per_s, burst = EXCLUDED.burst,
       tokens = LEAST(tenant_quotas.tokens, EXCLUDED.burst), updated_at = EXCLUDED.updated_at;

-- name: remove
DELETE FROM tenant_quotas WHERE tenant_id = %(tenant_id)s AND kind = %(kind)s;

-- name: of_tenant
SELECT kind, rate_per_s, burst,
       LEAST(burst, tokens + rate_per_s
             * GREATEST(0, EXTRACT(EPOCH FROM (%(now)s - refilled_at)))) AS tokens,
       held_total, held_at, updated_at
  FROM tenant_quotas
 WHERE tenant_id = %(tenant_id)s
 ORDER BY kind;

-- name: set_classes
UPDATE tenants SET priority_classes = %(classes)s::text[]
 WHERE tenant_id = %(tenant_id)s
RETURNING tenant_id, name, cell, priority_classes, created_at;

-- name: jobs_using
-- Live jobs of the tenant whose class is not in `classes`.
SELECT priority, count(*) FROM jobs
 WHERE tenant_id = %(tenant_id)s AND deleted_at IS NULL
   AND NOT (priority = ANY(%(classes)s::text[]))
 GROUP BY priority
 ORDER BY priority;

-- Object quotas (migration 0017): how many live jobs, workflows and unrevoked
-- keys a tenant may hold.

-- name: lock_objects
-- Held to the end of the transaction: one creation of this kind per tenant
-- counts at a time, so two cannot both take the last slot. A statement of its
-- own, so that the count after it (a new snapshot) sees what the previous
-- holder committed.
SELECT pg_advisory_xact_lock(hashtextextended('cronwheel-quota:' || %(tenant_id)s || ':' || %(kind)s, 0));

-- name: count_jobs
SELECT (SELECT max_count FROM tenant_limits WHERE tenant_id = %(tenant_id)s AND kind = 'jobs'),
       (SELECT count(*) FROM jobs WHERE tenant_id = %(tenant_id)s AND deleted_at IS NULL);

-- name: count_workflows
SELECT (SELECT max_count FROM tenant_limits
         WHERE tenant_id = %(tenant_id)s AND kind = 'workflows'),
       (SELECT count(*) FROM workflows WHERE tenant_id = %(tenant_id)s AND deleted_at IS NULL);

-- name: count_keys
SELECT (SELECT max_count FROM tenant_limits WHERE tenant_id = %(tenant_id)s AND kind = 'keys'),
       (SELECT count(*) FROM api_keys WHERE tenant_id = %(tenant_id)s AND revoked_at IS NULL);

-- name: set_limit
INSERT INTO tenant_limits (tenant_id, kind, max_count, updated_at)
VALUES (%(tenant_id)s, %(kind)s, %(max_count)s, %(now)s)
ON CONFLICT (tenant_id, kind) DO UPDATE
   SET max_count = EXCLUDED.max_count, updated_at = EXCLUDED.updated_at;

-- name: reset_limit
DELETE FROM tenant_limits WHERE tenant_id = %(tenant_id)s AND kind = %(kind)s;
