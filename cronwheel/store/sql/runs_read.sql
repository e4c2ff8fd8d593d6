-- Reading runs for the API: lists with filters and keyset pagination, one run
-- with its attempts. Every query is scoped by tenant_id (and row-level security
-- scopes it again inside the gateway's transactions).
--
-- From runs_daily and run_attempts_daily (since v0.3.0; migration 0026 holds
-- this release back until the backfill has copied every older run), cut at
-- the tenant's own retention: a finished run scheduled before
-- now - (tenants.run_retention_days, else %(default_days)s) days is not
-- shown, though its day may still be kept for a tenant with a longer one; a
-- run not yet finished is shown whatever its age (docs/migrations.md,
-- "Worked example: run retention").

-- name: list_runs
-- Newest first on (created_at, run_id): the order of runs_tenant_created, stable
-- while runs are added (a cursor never skips or repeats a run).
SELECT partition_id, run_id, tenant_id, job_id, workflow_run_id, node, scheduled_at, covers,
       priority, spec->'target' AS target, state, attempt, worker_id, lease_expires_at,
       result, error, created_at, started_at, finished_at, updated_at, reannounced,
       last_reannounced_at
  FROM runs_daily
 WHERE tenant_id = %(tenant_id)s
   AND (finished_at IS NULL OR scheduled_at >= {{runs_read.horizon}})
   AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s)
   AND (%(state)s::run_state IS NULL OR state = %(state)s::run_state)
   AND (%(workflow_run_id)s::text IS NULL OR workflow_run_id = %(workflow_run_id)s)
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, run_id) < (%(after_created)s, %(after_id)s))
 ORDER BY created_at DESC, run_id DESC
 LIMIT %(limit)s;

-- name: get_run
SELECT partition_id, run_id, tenant_id, job_id, workflow_run_id, node, scheduled_at, covers,
       priority, spec->'target' AS target, spec->>'payload' AS payload, state, attempt,
       worker_id, lease_expires_at, result, error, created_at, started_at, finished_at,
       updated_at, reannounced, last_reannounced_at
  FROM runs_daily
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND (finished_at IS NULL OR scheduled_at >= {{runs_read.horizon}});

-- name: run_attempts
-- Its run's scheduled_at, so only its day is read.
SELECT attempt, worker_id, started_at, finished_at, outcome, error
  FROM run_attempts_daily
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND scheduled_at = %(scheduled_at)s
 ORDER BY attempt;

-- name: horizon
now() - make_interval(days => coalesce(
    (SELECT t.run_retention_days FROM tenants t WHERE t.tenant_id = %(tenant_id)s),
    %(default_days)s::int))
