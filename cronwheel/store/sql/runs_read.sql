-- Reading runs for the API: lists with filters and keyset pagination, one run
-- with its attempts. Every query is scoped by tenant_id (and row-level security
-- scopes it again inside the gateway's transactions).

-- name: list_runs
-- Newest first on (created_at, run_id): the order of runs_tenant_created, stable
-- while runs are added (a cursor never skips or repeats a run).
SELECT partition_id, run_id, tenant_id, job_id, workflow_run_id, node, scheduled_at, covers,
       priority, spec->'target' AS target, state, attempt, worker_id, lease_expires_at,
       result, error, created_at, started_at, finished_at, updated_at, reannounced,
       last_reannounced_at
  FROM runs
 WHERE tenant_id = %(tenant_id)s
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
  FROM runs
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s;

-- name: run_attempts
SELECT attempt, worker_id, started_at, finished_at, outcome, error
  FROM run_attempts
 WHERE partition_id = %(p)s AND run_id = %(run_id)s
 ORDER BY attempt;
