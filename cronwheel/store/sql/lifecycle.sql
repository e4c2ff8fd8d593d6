-- The run's state machine. Each transition is one conditional statement that
-- returns the rows it changed: no row back means the precondition did not hold.
-- Where an attempt ends, the next state is decided in code
-- (cronwheel.core.runs.decide) and passed in: no statement here knows the
-- retry rule. lifecycle.py is the only caller, and the only writer of
-- runs_daily.state (the firing loop and the workflow service insert runs
-- PENDING). A run is found by its key (partition_id, run_id) without its day
-- (the worker protocol names a run by id and attempt), within a window of
-- its instant, [lo, hi): the caller asks the days around now first,
-- which PostgreSQL's partition pruning turns into those days' partitions and
-- the default one, and asks every day only for the runs that found nothing
-- (store/run_days.py). The bounds are written
-- date_trunc('day', %(lo)s::timestamptz, 'UTC'), and the caller's window
-- (run_days.Days) writes the recent days into the statement's text as
-- constants: PostgreSQL prunes the other days at planning, and the generic
-- plan of the prepared statement names, and locks, only the window's
-- partitions. A window of every day stays parameters, which date_trunc (STABLE)
-- keeps from being folded at planning, so a custom plan looks no cheaper than
-- the generic one and the generic plan is kept (with plain parameters each
-- call was planned anew over every partition). Where a statement has found the run once, its scheduled_at
-- goes on with it, so the statements after touch its day only.
-- An attempt's timers are armed and ended by fragments of timers.sql, written
-- in where they stand as {{timers.<name>}} (timers.spliced, at load): the
-- statement is still one, its timer part written once.

-- name: run_state
SELECT state, attempt, scheduled_at FROM runs_daily
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC');

-- name: heartbeat
-- Fenced on (attempt, start_token) and RUNNING; the lease timer reads the new expiry.
UPDATE runs_daily
   SET lease_expires_at = %(now)s + make_interval(secs => (spec->>'lease_ms')::int / 1000.0),
       updated_at = %(now)s
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
   AND state = 'RUNNING' AND attempt = %(attempt)s AND start_token = %(token)s
RETURNING lease_expires_at;

-- name: retry_run
-- The backoff timer fired: RETRY_WAIT -> PENDING with attempt + 1, published again.
UPDATE runs_daily
   SET state = 'PENDING', attempt = attempt + 1, start_token = NULL, worker_id = NULL,
       started_at = NULL, updated_at = %(now)s
 WHERE partition_id = %(p)s AND run_id = %(run_id)s
   AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
   AND state = 'RETRY_WAIT' AND attempt = %(attempt)s
RETURNING attempt, spec, tenant_id, job_id, workflow_run_id, node, scheduled_at, priority;

-- name: run_spec
-- What a platform worker (webhook, executor) needs to execute the run: its snapshot.
SELECT spec FROM runs_daily
 WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
   AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC');

-- The worker protocol's transitions of one run, as single statements
-- (data-modifying CTEs): one round trip each instead of one per table, and
-- atomic without a savepoint when the caller's transaction is already open.
-- Every part reads the same snapshot and sees none of the others' changes.
-- start_many and end_attempts below do the same over arrays. Why both: with
-- scalar parameters PostgreSQL keeps one generic plan of a prepared statement;
-- with arrays each call is planned anew for its length (0.9-3 ms), which tripled
-- the backend's CPU of a single StartRun (bench/bench_lifecycle_batch.py), and
-- forcing the generic plan (SET LOCAL plan_cache_mode) still leaves a single
-- CompleteRun's backend ~0.3-0.5 ms of CPU dearer than the scalar statement
-- (docs/architecture.md, "One decision, one writer"). So the two calls a
-- worker makes once per run, StartRun and CompleteRun, keep a scalar shape;
-- every other transition has the array one only.

-- name: start_attempt
-- StartRun: PENDING -> RUNNING, one caller wins a fresh start token and a lease;
-- with it the attempt's history row and its lease (and timeout) timer. `cur` is the run as the statement found it, so a
-- refusal says why without a second query, unless the run looked startable and
-- a concurrent StartRun won the row (then cur is out of date: ask again).
WITH cur AS (
    SELECT state, attempt, scheduled_at FROM runs_daily
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
       AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')),
s AS (
    UPDATE runs_daily
       SET state = 'RUNNING', start_token = %(token)s, worker_id = %(worker_id)s,
           started_at = %(now)s, updated_at = %(now)s,
           lease_expires_at = %(now)s + make_interval(secs => (spec->>'lease_ms')::int / 1000.0)
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
       AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
       AND state = 'PENDING' AND scheduled_at <= %(now)s + interval '1 second'
       AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s)
    RETURNING partition_id, run_id, tenant_id, attempt, lease_expires_at, spec, job_id,
              workflow_run_id, node, priority, scheduled_at),
a AS (
    INSERT INTO run_attempts_daily (partition_id, run_id, attempt, worker_id, started_at,
                                    scheduled_at, tenant_id)
    SELECT partition_id, run_id, attempt, %(worker_id)s, %(now)s, scheduled_at, tenant_id
      FROM s
    ON CONFLICT (partition_id, run_id, attempt, scheduled_at) DO NOTHING),
{{timers.arm_attempt_timers}}
SELECT s.attempt, s.lease_expires_at, s.spec, s.job_id, s.workflow_run_id, s.node,
       cur.state AS found_state, cur.attempt AS found_attempt,
       cur.scheduled_at AS found_scheduled_at
  FROM cur LEFT JOIN s ON true;

-- name: attempt_policies
-- The retry policy of each running attempt a CompleteRun names, fenced as
-- end_attempt is (a row's `retry` is NULL when the call is stale or the run
-- unknown): what decide() needs when a failure may be retried. Not locked: the
-- write that follows is conditional on the same fence, and the policy is a
-- snapshot that never changes.
SELECT c.i, r.spec->'retry' AS retry
  FROM unnest(%(p)b::smallint[], %(run_id)b::text[], %(tenant_id)b::text[],
              %(attempt)b::int[], %(token)b::text[])
       WITH ORDINALITY AS c(p, run_id, tenant_id, attempt, token, i)
  LEFT JOIN runs_daily r
    ON r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id
   AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
   AND r.state = 'RUNNING' AND r.attempt = c.attempt AND r.start_token = c.token
 ORDER BY c.i;

-- name: runs_to_end
-- The runs a cancel or an expiry timer would end, locked (in key order) so that
-- what decide() is told is what end_attempts finds.
SELECT partition_id AS p, run_id, state, attempt, lease_expires_at, spec->'retry' AS retry,
       tenant_id, job_id, workflow_run_id, node, priority
  FROM runs_daily
 WHERE (partition_id, run_id) IN (SELECT * FROM unnest(%(p)s::smallint[], %(run_id)s::text[]))
   AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
 ORDER BY partition_id, run_id
   FOR UPDATE;

-- name: waiting_runs_of_job
-- A deleted job's runs that no worker holds (PENDING, RETRY_WAIT), locked.
SELECT partition_id AS p, run_id, state, attempt, lease_expires_at, spec->'retry' AS retry,
       tenant_id, job_id, workflow_run_id, node, priority
  FROM runs_daily
 WHERE job_id = %(job_id)s AND partition_id = %(p)s
   AND state IN ('PENDING', 'RETRY_WAIT')
   AND finished_at IS NULL  -- implied by the states; lets runs_daily_open_job serve it
 ORDER BY run_id
   FOR UPDATE;

-- name: buffered_instant_given_up
-- A fragment, not a statement: spliced into end_attempt and end_attempts
-- (sql_loader.splice), which end runs in `u`. The job of a run that ended
-- terminally gives up the instant overlap=buffer_one held back; it comes back
-- in `b`, one row per job.
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
              j.retry, j.timeout_ms, j.lease_ms, j.priority);

-- name: end_attempt
-- CompleteRun: RUNNING -> the state decide() chose (SUCCEEDED | RETRY_WAIT |
-- FAILED), fenced on (attempt, start_token): a duplicate finds the run no
-- longer RUNNING (or at another attempt) and changes nothing; the attempt's
-- history row ends and its lease and timeout timers go. For a terminal state,
-- the instant an overlap=buffer_one job held back is taken and comes back in
-- the last columns. The retry timer and the RunCompleted record are the
-- caller's next statement (arm_retry, outbox.append). The scalar shape of
-- end_attempts (see above on why both).
WITH cur AS (
    SELECT partition_id, run_id, scheduled_at FROM runs_daily
     WHERE partition_id = %(p)s AND run_id = %(run_id)s AND tenant_id = %(tenant_id)s
       AND scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
       AND state = 'RUNNING' AND attempt = %(attempt)s AND start_token = %(token)s
       FOR UPDATE),
u AS (
    UPDATE runs_daily r
       SET state = %(next_state)s::run_state,
           finished_at = CASE WHEN %(next_state)s = 'RETRY_WAIT' THEN NULL ELSE %(now)s END,
           lease_expires_at = NULL, result = %(result)s, error = %(error)s, updated_at = %(now)s
      FROM cur
     WHERE r.partition_id = cur.partition_id AND r.run_id = cur.run_id
       AND r.scheduled_at = cur.scheduled_at
       AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
    RETURNING r.partition_id, r.run_id, r.state, r.attempt, r.tenant_id, r.job_id,
              r.workflow_run_id, r.node, r.priority, r.scheduled_at),
a AS (
    UPDATE run_attempts_daily ra
       SET finished_at = %(now)s, outcome = %(outcome)s, error = %(attempt_error)s
      FROM u
     WHERE ra.partition_id = u.partition_id AND ra.run_id = u.run_id
       AND ra.scheduled_at = u.scheduled_at
       AND ra.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND ra.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
       AND ra.attempt = u.attempt AND ra.finished_at IS NULL),
{{timers.end_attempt_timers}},
{{lifecycle.buffered_instant_given_up}}
SELECT u.state, u.attempt, u.tenant_id, u.job_id, u.workflow_run_id, u.node, u.priority,
       b.buffered_at, b.tenant_id AS buffered_tenant_id, b.target, b.payload, b.retry,
       b.timeout_ms, b.lease_ms, b.priority AS buffered_priority
  FROM u LEFT JOIN b ON true;

-- name: start_many
WITH c AS (
    SELECT * FROM unnest(%(p)b::smallint[], %(run_id)b::text[], %(tenant_id)b::text[],
                         %(worker_id)b::text[], %(token)b::text[], %(attempt)b::int[])
           WITH ORDINALITY AS c(p, run_id, tenant_id, worker_id, token, attempt, i)),
cur AS (
    SELECT c.i, r.state, r.attempt, r.scheduled_at
      FROM c JOIN runs_daily r
        ON r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id
       AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')),
s AS (
    UPDATE runs_daily r
       SET state = 'RUNNING', start_token = c.token, worker_id = c.worker_id,
           started_at = %(now)s, updated_at = %(now)s,
           lease_expires_at = %(now)s + make_interval(secs => (r.spec->>'lease_ms')::int / 1000.0)
      FROM c
     WHERE r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id
       AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
       AND r.state = 'PENDING' AND r.scheduled_at <= %(now)s + interval '1 second'
       AND (c.attempt IS NULL OR r.attempt = c.attempt)
    RETURNING c.i, c.worker_id, r.partition_id, r.run_id, r.tenant_id, r.attempt,
              r.lease_expires_at, r.spec, r.job_id, r.workflow_run_id, r.node, r.priority,
              r.scheduled_at),
a AS (
    INSERT INTO run_attempts_daily (partition_id, run_id, attempt, worker_id, started_at,
                                    scheduled_at, tenant_id)
    SELECT partition_id, run_id, attempt, worker_id, %(now)s, scheduled_at, tenant_id FROM s
    ON CONFLICT (partition_id, run_id, attempt, scheduled_at) DO NOTHING),
{{timers.arm_attempt_timers}}
SELECT c.i, s.attempt, s.lease_expires_at, s.spec, s.job_id, s.workflow_run_id, s.node,
       cur.state AS found_state, cur.attempt AS found_attempt,
       cur.scheduled_at AS found_scheduled_at
  FROM c LEFT JOIN cur ON cur.i = c.i LEFT JOIN s ON s.i = c.i
 ORDER BY c.i;

-- name: end_attempts
-- Every end of an attempt or of a waiting run, over arrays: CompleteRun's
-- batches, lease and timeout expiry, cancels (one run, or a deleted job's
-- waiting runs). Each element moves its run from `from_state` at `attempt`
-- (and `token`, when given: CompleteRun's fence) to `next_state`, decided in
-- code; a run found elsewhere is left alone and its row comes back with a NULL
-- state. `set_result` / `set_error`: whether the run's result and error are
-- replaced (a worker's report) or kept (an expiry keeps the result; a job's
-- deletion keeps both). The attempt's history row, if still open, ends with
-- `attempt_outcome`; the lease and timeout timers go (by whole key, as in
-- end_attempt); a terminal run's job gives up its buffered instant, which
-- comes back on each of its runs that ended here (the caller uses it once).
WITH c AS (
    SELECT * FROM unnest(%(p)b::smallint[], %(run_id)b::text[], %(tenant_id)b::text[],
                         %(from_state)b::text[], %(attempt)b::int[], %(token)b::text[],
                         %(next_state)b::text[], %(set_result)b::bool[], %(result)b::text[],
                         %(set_error)b::bool[], %(error)b::text[],
                         %(attempt_outcome)b::text[], %(attempt_error)b::text[])
           WITH ORDINALITY AS c(p, run_id, tenant_id, from_state, attempt, token, next_state,
                                set_result, result, set_error, error, attempt_outcome,
                                attempt_error, i)),
cur AS (
    SELECT c.i, c.next_state::run_state AS next_state, c.set_result, c.result, c.set_error,
           c.error, c.attempt_outcome, c.attempt_error, r.partition_id, r.run_id,
           r.scheduled_at
      FROM c JOIN runs_daily r
        ON r.partition_id = c.p AND r.run_id = c.run_id AND r.tenant_id = c.tenant_id
       AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
       AND r.state = c.from_state::run_state AND r.attempt = c.attempt
       AND (c.token IS NULL OR r.start_token = c.token)
       FOR UPDATE OF r),
u AS (
    UPDATE runs_daily r
       SET state = cur.next_state,
           finished_at = CASE WHEN cur.next_state = 'RETRY_WAIT' THEN NULL ELSE %(now)s END,
           lease_expires_at = NULL,
           result = CASE WHEN cur.set_result THEN cur.result::jsonb ELSE r.result END,
           error = CASE WHEN cur.set_error THEN cur.error ELSE r.error END,
           updated_at = %(now)s
      FROM cur
     WHERE r.partition_id = cur.partition_id AND r.run_id = cur.run_id
       AND r.scheduled_at = cur.scheduled_at
       AND r.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND r.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
    RETURNING cur.i, cur.attempt_outcome, cur.attempt_error, r.partition_id, r.run_id,
              r.state, r.attempt, r.tenant_id, r.job_id, r.workflow_run_id, r.node,
              r.priority, r.scheduled_at),
a AS (
    UPDATE run_attempts_daily ra
       SET finished_at = %(now)s, outcome = u.attempt_outcome, error = u.attempt_error
      FROM u
     WHERE ra.partition_id = u.partition_id AND ra.run_id = u.run_id
       AND ra.scheduled_at = u.scheduled_at
       AND ra.scheduled_at >= date_trunc('day', %(lo)s::timestamptz, 'UTC') AND ra.scheduled_at < date_trunc('day', %(hi)s::timestamptz, 'UTC')
       AND ra.attempt = u.attempt AND ra.finished_at IS NULL),
{{timers.end_attempt_timers}},
{{lifecycle.buffered_instant_given_up}}
SELECT c.i, u.state, u.attempt, u.tenant_id, u.job_id, u.workflow_run_id, u.node,
       u.priority, b.buffered_at, b.tenant_id AS buffered_tenant_id, b.target, b.payload,
       b.retry, b.timeout_ms, b.lease_ms, b.priority AS buffered_priority
  FROM c LEFT JOIN u ON u.i = c.i
         LEFT JOIN b ON b.partition_id = u.partition_id AND b.job_id = u.job_id
 ORDER BY c.i;

