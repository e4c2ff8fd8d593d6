-- The run's state machine. Each transition is one conditional statement that
-- returns the rows it changed: no row back means the precondition did not hold.

-- name: start_run
-- PENDING -> RUNNING: exactly one caller wins; it gets a fresh start token and a lease.
UPDATE runs
   SET state = 'RUNNING', start_token = %(token)s, worker_id = %(worker_id)s,
       started_at = %(now)s, updated_at = %(now)s,
       lease_expires_at = %(now)s + make_interval(secs => (spec->>'lease_ms')::int / 1000.0)
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND state = 'PENDING' AND scheduled_at <= %(now)s + interval '1 second'
   AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s)
RETURNING attempt, lease_expires_at, spec, job_id, workflow_run_id, node, priority;

-- name: run_state
SELECT state, attempt, scheduled_at FROM runs
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s;

-- name: record_attempt_start
INSERT INTO run_attempts (partition_id, run_id, attempt, worker_id, started_at)
VALUES (%(p)s, %(run_id)s, %(attempt)s, %(worker_id)s, %(now)s)
ON CONFLICT (partition_id, run_id, attempt) DO NOTHING;

-- name: record_attempt_end
UPDATE run_attempts SET finished_at = %(now)s, outcome = %(outcome)s, error = %(error)s
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND attempt = %(attempt)s
   AND finished_at IS NULL;

-- name: heartbeat
-- Fenced on (attempt, start_token) and RUNNING; the lease timer reads the new expiry.
UPDATE runs
   SET lease_expires_at = %(now)s + make_interval(secs => (spec->>'lease_ms')::int / 1000.0),
       updated_at = %(now)s
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND state = 'RUNNING' AND attempt = %(attempt)s AND start_token = %(token)s
RETURNING lease_expires_at;

-- name: complete_attempt
-- RUNNING -> SUCCEEDED | RETRY_WAIT | FAILED, fenced on (attempt, start_token).
-- A duplicate finds the run no longer RUNNING (or at another attempt): no row.
WITH cur AS (
    SELECT partition_id, run_id,
           CASE WHEN %(outcome)s = 'SUCCEEDED' THEN 'SUCCEEDED'
                WHEN %(retryable)s AND attempt < (spec->'retry'->>'max_attempts')::int
                     THEN 'RETRY_WAIT'
                ELSE 'FAILED' END::run_state AS next_state
      FROM runs
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
       AND state = 'RUNNING' AND attempt = %(attempt)s AND start_token = %(token)s
       FOR UPDATE)
UPDATE runs r
   SET state = cur.next_state,
       finished_at = CASE WHEN cur.next_state = 'RETRY_WAIT' THEN NULL ELSE %(now)s END,
       lease_expires_at = NULL, result = %(result)s, error = %(error)s, updated_at = %(now)s
  FROM cur
 WHERE r.partition_id = cur.partition_id AND r.run_id = cur.run_id
RETURNING r.state, r.attempt, r.spec, r.tenant_id, r.job_id, r.workflow_run_id, r.node,
          r.scheduled_at, r.priority;

-- name: expire_attempt
-- A lease or timeout timer fired: RUNNING -> RETRY_WAIT | TIMED_OUT for the
-- attempt the timer belongs to. For a lease, only if no heartbeat extended it.
WITH cur AS (
    SELECT partition_id, run_id,
           CASE WHEN attempt < (spec->'retry'->>'max_attempts')::int THEN 'RETRY_WAIT'
                ELSE 'TIMED_OUT' END::run_state AS next_state
      FROM runs
     WHERE partition_id = %(p)s AND run_id = %(run_id)s
       AND state = 'RUNNING' AND attempt = %(attempt)s
       AND (NOT %(check_lease)s OR lease_expires_at <= %(now)s)
       FOR UPDATE)
UPDATE runs r
   SET state = cur.next_state,
       finished_at = CASE WHEN cur.next_state = 'RETRY_WAIT' THEN NULL ELSE %(now)s END,
       lease_expires_at = NULL, error = %(error)s, updated_at = %(now)s
  FROM cur
 WHERE r.partition_id = cur.partition_id AND r.run_id = cur.run_id
RETURNING r.state, r.attempt, r.spec, r.tenant_id, r.job_id, r.workflow_run_id, r.node,
          r.scheduled_at, r.priority;

-- name: lease_of
SELECT state, attempt, lease_expires_at FROM runs
 WHERE partition_id = %(p)s AND run_id = %(run_id)s;

-- name: retry_run
-- The backoff timer fired: RETRY_WAIT -> PENDING with attempt + 1, published again.
UPDATE runs
   SET state = 'PENDING', attempt = attempt + 1, start_token = NULL, worker_id = NULL,
       started_at = NULL, updated_at = %(now)s
 WHERE partition_id = %(p)s AND run_id = %(run_id)s
   AND state = 'RETRY_WAIT' AND attempt = %(attempt)s
RETURNING attempt, spec, tenant_id, job_id, workflow_run_id, node, scheduled_at, priority;

-- name: cancel_run
UPDATE runs
   SET state = 'CANCELLED', finished_at = %(now)s, lease_expires_at = NULL,
       error = %(error)s, updated_at = %(now)s
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND state IN ('PENDING', 'RUNNING', 'RETRY_WAIT')
RETURNING state, attempt, spec, tenant_id, job_id, workflow_run_id, node, scheduled_at, priority;

-- name: take_buffered_instant
-- overlap=buffer_one: the instant held back while this job's run was active.
WITH old AS (
    SELECT partition_id, job_id, buffered_at FROM jobs
     WHERE partition_id = %(p)s AND job_id = %(job_id)s AND buffered_at IS NOT NULL
       AND deleted_at IS NULL
       FOR UPDATE)
UPDATE jobs j
   SET buffered_at = NULL
  FROM old
 WHERE j.partition_id = old.partition_id AND j.job_id = old.job_id
RETURNING old.buffered_at, j.tenant_id, j.target, j.payload, j.retry, j.timeout_ms,
          j.lease_ms, j.priority;

-- name: run_spec
-- What a platform worker (webhook, executor) needs to execute the run: its snapshot.
SELECT spec FROM runs
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s;
