-- The run's state machine. Each transition is one conditional statement that
-- returns the rows it changed: no row back means the precondition did not hold.

-- name: run_state
SELECT state, attempt, scheduled_at FROM runs
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s;

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

-- The worker protocol's transitions of one run, as single statements
-- (data-modifying CTEs): one round trip each instead of one per table, and
-- atomic without a savepoint when the caller's transaction is already open.
-- Every part reads the same snapshot and sees none of the others' changes.
-- start_many and finish_many below do the same over arrays. Why both: with
-- scalar parameters PostgreSQL keeps one generic plan of a prepared statement;
-- with arrays each call is planned anew for its length (0.9-3 ms), which tripled
-- the backend's CPU of a single StartRun (bench/bench_lifecycle_batch.py).

-- name: start_attempt
-- StartRun: PENDING -> RUNNING, one caller wins a fresh start token and a lease;
-- with it the attempt's history row and its lease (and timeout) timer. `cur` is the run as the statement found it, so a
-- refusal says why without a second query, unless the run looked startable and
-- a concurrent StartRun won the row (then cur is out of date: ask again).
WITH cur AS (
    SELECT state, attempt, scheduled_at FROM runs
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s),
s AS (
    UPDATE runs
       SET state = 'RUNNING', start_token = %(token)s, worker_id = %(worker_id)s,
           started_at = %(now)s, updated_at = %(now)s,
           lease_expires_at = %(now)s + make_interval(secs => (spec->>'lease_ms')::int / 1000.0)
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
       AND state = 'PENDING' AND scheduled_at <= %(now)s + interval '1 second'
       AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s)
    RETURNING partition_id, run_id, tenant_id, attempt, lease_expires_at, spec, job_id,
              workflow_run_id, node, priority),
a AS (
    INSERT INTO run_attempts (partition_id, run_id, attempt, worker_id, started_at)
    SELECT partition_id, run_id, attempt, %(worker_id)s, %(now)s FROM s
    ON CONFLICT (partition_id, run_id, attempt) DO NOTHING),
t AS (
    INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt,
                        tenant_id)
    SELECT s.partition_id, k.kind || ':' || s.run_id, k.kind, s.run_id, k.due,
           CASE s.priority WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'low' THEN 3
                ELSE 2 END,
           s.attempt, s.tenant_id
      FROM s CROSS JOIN LATERAL (VALUES
           ('lease', s.lease_expires_at),
           ('timeout', CASE WHEN (s.spec->>'timeout_ms')::bigint > 0 THEN %(now)s
                + make_interval(secs => (s.spec->>'timeout_ms')::bigint / 1000.0) END)
           ) AS k(kind, due)
     WHERE k.due IS NOT NULL
    ON CONFLICT (partition_id, timer_id)
    DO UPDATE SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority,
                  attempt = EXCLUDED.attempt)
SELECT s.attempt, s.lease_expires_at, s.spec, s.job_id, s.workflow_run_id, s.node,
       cur.state, cur.attempt, cur.scheduled_at
  FROM cur LEFT JOIN s ON true;

-- name: finish_attempt
-- CompleteRun: RUNNING -> SUCCEEDED | RETRY_WAIT | FAILED, fenced on (attempt,
-- start_token): a duplicate finds the run no longer RUNNING (or at another
-- attempt) and changes nothing; the attempt's history row ends and its
-- lease and timeout timers go. For a terminal state, the instant an
-- overlap=buffer_one job held back is taken (take_buffered_instant) and comes
-- back in the last columns. What needs the row first (the retry timer with its
-- jittered backoff, the RunCompleted record) is the caller's next statement.
WITH cur AS (
    SELECT partition_id, run_id,
           CASE WHEN %(outcome)s = 'SUCCEEDED' THEN 'SUCCEEDED'
                WHEN %(retryable)s AND attempt < (spec->'retry'->>'max_attempts')::int
                     THEN 'RETRY_WAIT'
                ELSE 'FAILED' END::run_state AS next_state
      FROM runs
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
       AND state = 'RUNNING' AND attempt = %(attempt)s AND start_token = %(token)s
       FOR UPDATE),
u AS (
    UPDATE runs r
       SET state = cur.next_state,
           finished_at = CASE WHEN cur.next_state = 'RETRY_WAIT' THEN NULL ELSE %(now)s END,
           lease_expires_at = NULL, result = %(result)s, error = %(error)s, updated_at = %(now)s
      FROM cur
     WHERE r.partition_id = cur.partition_id AND r.run_id = cur.run_id
    RETURNING r.partition_id, r.run_id, r.state, r.attempt, r.spec, r.tenant_id, r.job_id,
              r.workflow_run_id, r.node, r.scheduled_at, r.priority),
a AS (
    UPDATE run_attempts ra
       SET finished_at = %(now)s, outcome = %(outcome)s, error = %(attempt_error)s
      FROM u
     WHERE ra.partition_id = u.partition_id AND ra.run_id = u.run_id
       AND ra.attempt = u.attempt AND ra.finished_at IS NULL),
ended_timers AS MATERIALIZED (
    SELECT u.partition_id, k.timer_id
      FROM u CROSS JOIN LATERAL (VALUES ('lease:' || u.run_id), ('timeout:' || u.run_id))
           AS k(timer_id)),
d AS (
    -- Each timer by its whole primary key. With `timer_id IN (two expressions)`
    -- the key was searched on partition_id alone (or the table scanned), and
    -- every timer of the partition -- all the leases of a busy job -- was read
    -- for each run; the materialized list keeps the planner from folding the
    -- ids back in as a filter.
    DELETE FROM timers t
     USING ended_timers e
     WHERE t.partition_id = e.partition_id AND t.timer_id = e.timer_id),
old AS (
    SELECT j.partition_id, j.job_id, j.buffered_at
      FROM jobs j JOIN u ON j.partition_id = u.partition_id AND j.job_id = u.job_id
     WHERE u.state <> 'RETRY_WAIT' AND j.buffered_at IS NOT NULL AND j.deleted_at IS NULL
       FOR UPDATE OF j),
b AS (
    UPDATE jobs j
       SET buffered_at = NULL
      FROM old
     WHERE j.partition_id = old.partition_id AND j.job_id = old.job_id
    RETURNING old.buffered_at, j.tenant_id, j.target, j.payload, j.retry, j.timeout_ms,
              j.lease_ms, j.priority)
SELECT u.state, u.attempt, u.spec, u.tenant_id, u.job_id, u.workflow_run_id, u.node,
       u.scheduled_at, u.priority,
       b.buffered_at, b.tenant_id, b.target, b.payload, b.retry, b.timeout_ms, b.lease_ms,
       b.priority
  FROM u LEFT JOIN b ON true;

-- name: arm_retry
-- The backoff timer of an attempt that ended in RETRY_WAIT, and the wake-up of
-- the firing loop, in one statement.
WITH t AS (
    INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt,
                        tenant_id)
    VALUES (%(p)s, %(id)s, 'retry', %(owner)s, %(due)s, %(prio)s, %(attempt)s, %(tenant_id)s)
    ON CONFLICT (partition_id, timer_id)
    DO UPDATE SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority,
                  attempt = EXCLUDED.attempt)
SELECT pg_notify('cw_timers', %(due_ms)s::text);

-- name: announce
-- One outbox row (a RunCompleted) and the relay's wake-up, in one statement
-- (outbox.append's two).
WITH o AS (
    INSERT INTO outbox (partition_id, topic, key, value, priority)
    VALUES (%(p)s, %(topic)s, %(key)s, %(value)s, %(priority)s))
SELECT pg_notify('cw_outbox', '');

-- Batches: start_attempt and finish_attempt over arrays, one row back per call
-- in the calls' order (`i`), one round trip per transition and batch. Calls
-- come sorted by (partition, run) so that two batches lock shared runs in the
-- same order; a run appears at most once per statement (the caller sends
-- repeats in a later one).

-- name: start_many
WITH c AS (
    SELECT * FROM unnest(%(p)b::smallint[], %(run_id)b::text[], %(tenant_id)b::text[],
                         %(worker_id)b::text[], %(token)b::text[], %(attempt)b::int[])
           WITH ORDINALITY AS c(p, run_id, tenant_id, worker_id, token, attempt, i)),
cur AS (
    SELECT c.i, r.state, r.attempt, r.scheduled_at
      FROM c JOIN runs r
        ON r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id),
s AS (
    UPDATE runs r
       SET state = 'RUNNING', start_token = c.token, worker_id = c.worker_id,
           started_at = %(now)s, updated_at = %(now)s,
           lease_expires_at = %(now)s + make_interval(secs => (r.spec->>'lease_ms')::int / 1000.0)
      FROM c
     WHERE r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id
       AND r.state = 'PENDING' AND r.scheduled_at <= %(now)s + interval '1 second'
       AND (c.attempt IS NULL OR r.attempt = c.attempt)
    RETURNING c.i, c.worker_id, r.partition_id, r.run_id, r.tenant_id, r.attempt,
              r.lease_expires_at, r.spec, r.job_id, r.workflow_run_id, r.node, r.priority),
a AS (
    INSERT INTO run_attempts (partition_id, run_id, attempt, worker_id, started_at)
    SELECT partition_id, run_id, attempt, worker_id, %(now)s FROM s
    ON CONFLICT (partition_id, run_id, attempt) DO NOTHING),
t AS (
    INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt,
                        tenant_id)
    SELECT s.partition_id, k.kind || ':' || s.run_id, k.kind, s.run_id, k.due,
           CASE s.priority WHEN 'critical' THEN 0 WHEN 'high' THEN 1 WHEN 'low' THEN 3
                ELSE 2 END,
           s.attempt, s.tenant_id
      FROM s CROSS JOIN LATERAL (VALUES
           ('lease', s.lease_expires_at),
           ('timeout', CASE WHEN (s.spec->>'timeout_ms')::bigint > 0 THEN %(now)s
                + make_interval(secs => (s.spec->>'timeout_ms')::bigint / 1000.0) END)
           ) AS k(kind, due)
     WHERE k.due IS NOT NULL
    ON CONFLICT (partition_id, timer_id)
    DO UPDATE SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority,
                  attempt = EXCLUDED.attempt)
SELECT c.i, s.attempt, s.lease_expires_at, s.spec, s.job_id, s.workflow_run_id, s.node,
       cur.state, cur.attempt, cur.scheduled_at
  FROM c LEFT JOIN cur ON cur.i = c.i LEFT JOIN s ON s.i = c.i
 ORDER BY c.i;

-- name: finish_many
-- A job's buffered instant comes back on each of its runs that ended in the
-- batch; the caller uses it once.
WITH c AS (
    SELECT * FROM unnest(%(p)b::smallint[], %(run_id)b::text[], %(tenant_id)b::text[],
                         %(attempt)b::int[], %(token)b::text[], %(outcome)b::text[],
                         %(retryable)b::bool[], %(result)b::text[], %(error)b::text[],
                         %(attempt_error)b::text[])
           WITH ORDINALITY AS c(p, run_id, tenant_id, attempt, token, outcome, retryable,
                                result, error, attempt_error, i)),
cur AS (
    SELECT c.i, c.outcome, c.result, c.error, c.attempt_error, r.partition_id, r.run_id,
           CASE WHEN c.outcome = 'SUCCEEDED' THEN 'SUCCEEDED'
                WHEN c.retryable AND r.attempt < (r.spec->'retry'->>'max_attempts')::int
                     THEN 'RETRY_WAIT'
                ELSE 'FAILED' END::run_state AS next_state
      FROM c JOIN runs r
        ON r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id
       AND r.state = 'RUNNING' AND r.attempt = c.attempt AND r.start_token = c.token
       FOR UPDATE OF r),
u AS (
    UPDATE runs r
       SET state = cur.next_state,
           finished_at = CASE WHEN cur.next_state = 'RETRY_WAIT' THEN NULL ELSE %(now)s END,
           lease_expires_at = NULL, result = cur.result::jsonb, error = cur.error,
           updated_at = %(now)s
      FROM cur
     WHERE r.partition_id = cur.partition_id AND r.run_id = cur.run_id
    RETURNING cur.i, cur.outcome, cur.attempt_error, r.partition_id, r.run_id, r.state,
              r.attempt, r.spec, r.tenant_id, r.job_id, r.workflow_run_id, r.node,
              r.scheduled_at, r.priority),
a AS (
    UPDATE run_attempts ra
       SET finished_at = %(now)s, outcome = u.outcome, error = u.attempt_error
      FROM u
     WHERE ra.partition_id = u.partition_id AND ra.run_id = u.run_id
       AND ra.attempt = u.attempt AND ra.finished_at IS NULL),
ended_timers AS MATERIALIZED (
    SELECT u.partition_id, k.timer_id
      FROM u CROSS JOIN LATERAL (VALUES ('lease:' || u.run_id), ('timeout:' || u.run_id))
           AS k(timer_id)),
d AS (
    -- Each timer by its whole primary key. With `timer_id IN (two expressions)`
    -- the key was searched on partition_id alone (or the table scanned), and
    -- every timer of the partition -- all the leases of a busy job -- was read
    -- for each run; the materialized list keeps the planner from folding the
    -- ids back in as a filter.
    DELETE FROM timers t
     USING ended_timers e
     WHERE t.partition_id = e.partition_id AND t.timer_id = e.timer_id),
old AS (
    SELECT j.partition_id, j.job_id, j.buffered_at
      FROM jobs j
     WHERE (j.partition_id, j.job_id) IN (SELECT u.partition_id, u.job_id FROM u
                                           WHERE u.state <> 'RETRY_WAIT')
       AND j.buffered_at IS NOT NULL AND j.deleted_at IS NULL
       FOR UPDATE OF j),
b AS (
    UPDATE jobs j
       SET buffered_at = NULL
      FROM old
     WHERE j.partition_id = old.partition_id AND j.job_id = old.job_id
    RETURNING j.partition_id, j.job_id, old.buffered_at, j.tenant_id, j.target, j.payload,
              j.retry, j.timeout_ms, j.lease_ms, j.priority)
SELECT c.i, u.state, u.attempt, u.spec, u.tenant_id, u.job_id, u.workflow_run_id, u.node,
       u.scheduled_at, u.priority,
       b.buffered_at, b.tenant_id, b.target, b.payload, b.retry, b.timeout_ms, b.lease_ms,
       b.priority
  FROM c LEFT JOIN u ON u.i = c.i
         LEFT JOIN b ON b.partition_id = u.partition_id AND b.job_id = u.job_id
 ORDER BY c.i;

-- name: arm_retries
-- arm_retry over arrays: the backoff timers of attempts that ended in RETRY_WAIT.
WITH t AS (
    INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt,
                        tenant_id)
    SELECT p, 'retry:' || owner, 'retry', owner, due, prio, attempt, tenant_id
      FROM unnest(%(p)s::smallint[], %(owner)s::text[], %(due)s::timestamptz[],
                  %(prio)s::smallint[], %(attempt)s::int[], %(tenant_id)s::text[])
           AS x(p, owner, due, prio, attempt, tenant_id)
    ON CONFLICT (partition_id, timer_id)
    DO UPDATE SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority,
                  attempt = EXCLUDED.attempt)
SELECT pg_notify('cw_timers', %(due_ms)s::text);
