-- Timers: every statement that reads or writes the `timers` table, and the
-- fragments of the run transitions that arm or end an attempt's timers
-- (spliced into lifecycle.sql, see timers.py). cronwheel/store/timers.py is
-- the only caller. A timer's class (`priority`, 0 critical .. 3 low) is
-- cronwheel.core.runs.PRIORITY_RANK's: computed in Python, or, where only the
-- database knows the run's class, looked up in the classes passed as
-- %(classes)b (PRIORITIES, in rank order; timers.CLASS_PARAMS).
-- The firing loop's claims.
-- Array parameters use %(x)b (binary): escaping big arrays as text cost more
-- CPU than the rest of the loop.
-- `(partition_id + 0) = ANY(owned)`: a filter on the few due rows, not an index
-- condition. As a condition on the primary key the planner weighs every one of
-- up to 1024 owned partitions against each index, 1-7 ms of planning per claim,
-- and may bitmap-AND the whole table's keys into a claim of a handful of rows.

-- Firing ahead (docs/architecture.md): `ahead` >= `now`; a job timer is due
-- by `ahead` (its run is created early and published at its instant), every
-- other kind by `now` (a lease or retry acted on early would change a run's
-- state early).

-- Neither claim takes a timer of a tenant that is not `active` in this cell
-- (migration 0022): one being moved in (`standby`: its copied timers wait
-- for the move to activate it) or out (`frozen`, `moved`: the freeze parked
-- its timers, and this holds whatever a stale writer re-armed). A probe of
-- the partial index tenants_not_active, which is almost always empty.

-- name: claim_due
-- Due timers of the caller's partitions, by priority class then due time. The
-- lateral scan per class stops as soon as LIMIT rows are found, so lower classes
-- are not even read (or locked) while higher ones fill the batch. When fewer
-- than LIMIT are due this is the whole story; a full batch means a backlog, and
-- the firing loop then claims by lanes (due_lanes, claim_lanes) as well.
SELECT t.partition_id, t.timer_id, t.kind, t.owner_id, t.due_at, t.attempt, t.tenant_id,
       t.priority
  FROM unnest('{0,1,2,3}'::smallint[]) AS c(prio)
 CROSS JOIN LATERAL (
       SELECT partition_id, timer_id, kind, owner_id, due_at, attempt, tenant_id, priority
         FROM timers
        WHERE priority = c.prio AND due_at <= %(ahead)s
          AND (due_at <= %(now)s OR kind = 'job')
          AND (partition_id + 0) = ANY(%(partitions)b::smallint[])
          AND NOT EXISTS (SELECT 1 FROM tenants h
                           WHERE h.tenant_id = timers.tenant_id AND h.state <> 'active')
        ORDER BY due_at
        LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED) t
 LIMIT %(limit)s;

-- name: due_lanes
-- The lanes (class, tenant) with a due timer in the caller's partitions, by
-- class. Two ways, whichever is cheaper, in one statement:
-- - At most `few` timers due (a crowded instant, not a backlog): the lanes
--   of those timers, read off the timers_due range of each class. Its cost is
--   the due timers', not the number of lanes: a platform of 3,000 mostly idle
--   tenants has 3,000 lanes, and the loose scan below visited every one of
--   them (15 ms a claim) for an instant of 1,000 runs of ten tenants.
-- - More due than that: a loose index scan of timers_lane, one descent per
--   lane that exists and one probe for a due row, however many timers each
--   lane holds (a backlog of 100,000 in one lane costs one probe).
-- The one-time filter on `few`'s count keeps the scan not wanted from running
-- at all (`lane` is only read when its side's filter holds).
WITH RECURSIVE few AS MATERIALIZED (
    SELECT d.priority, d.tenant_id
      FROM unnest('{0,1,2,3}'::smallint[]) AS c(prio)
     CROSS JOIN LATERAL (
           SELECT priority, tenant_id FROM timers
            WHERE priority = c.prio AND due_at <= %(ahead)s
              AND (due_at <= %(now)s OR kind = 'job')
              AND (partition_id + 0) = ANY(%(partitions)b::smallint[])
            ORDER BY due_at
            LIMIT %(few)s + 1) d
     LIMIT %(few)s + 1
), lane(priority, tenant_id) AS (
    (SELECT priority, tenant_id FROM timers ORDER BY priority, tenant_id LIMIT 1)
    UNION ALL
    SELECT n.priority, n.tenant_id
      FROM lane l
     CROSS JOIN LATERAL (
           SELECT t.priority, t.tenant_id FROM timers t
            WHERE (t.priority, t.tenant_id) > (l.priority, l.tenant_id)
            ORDER BY t.priority, t.tenant_id
            LIMIT 1) n
)
SELECT priority, tenant_id
  FROM few
 WHERE (SELECT count(*) FROM few) <= %(few)s
 GROUP BY priority, tenant_id
UNION ALL
SELECT l.priority, l.tenant_id
  FROM lane l
 CROSS JOIN LATERAL (
       -- One probe per lane (LIMIT 1 keeps it a probe: as an EXISTS, the
       -- planner may hash every due timer to answer it).
       SELECT 1 FROM timers t
        WHERE t.priority = l.priority AND t.tenant_id = l.tenant_id
          AND t.due_at <= %(ahead)s AND (t.due_at <= %(now)s OR t.kind = 'job')
          AND (t.partition_id + 0) = ANY(%(partitions)b::smallint[])
        LIMIT 1) due
 WHERE (SELECT count(*) FROM few) > %(few)s
 ORDER BY 1, 2;

-- name: claim_lanes
-- Up to `quota` due timers of each lane, oldest first; `taken` are those an
-- earlier round of the same transaction already holds.
SELECT t.partition_id, t.timer_id, t.kind, t.owner_id, t.due_at, t.attempt, t.tenant_id,
       t.priority
  FROM unnest(%(prio)b::smallint[], %(tenant)b::text[], %(quota)b::int[]) AS l(prio, tenant, quota)
 CROSS JOIN LATERAL (
       SELECT partition_id, timer_id, kind, owner_id, due_at, attempt, tenant_id, priority
         FROM timers
        WHERE priority = l.prio AND tenant_id = l.tenant AND due_at <= %(ahead)s
          AND (due_at <= %(now)s OR kind = 'job')
          AND (partition_id + 0) = ANY(%(partitions)b::smallint[])
          AND timer_id <> ALL(%(taken)b::text[])
          AND NOT EXISTS (SELECT 1 FROM tenants h
                           WHERE h.tenant_id = timers.tenant_id AND h.state <> 'active')
        ORDER BY due_at
        LIMIT l.quota
          FOR UPDATE SKIP LOCKED) t;

-- name: upcoming
-- The next due times of the caller's partitions after its last claim, to load
-- the timing wheel, up to LIMIT per class (with the class, so the caller knows
-- how far each class's answer is complete). A timer due by that claim and
-- still here is held by a quota or locked by another instance: the wheel does
-- not wake for it (the firing reports when a quota refills). Whether it is a
-- job timer: those are woken for `ahead` early.
SELECT c.prio, t.due_at, t.kind = 'job'
  FROM unnest('{0,1,2,3}'::smallint[]) AS c(prio)
 CROSS JOIN LATERAL (
       SELECT due_at, kind FROM timers
        WHERE priority = c.prio AND due_at > %(after)s AND due_at <= %(horizon)s
          AND (partition_id + 0) = ANY(%(partitions)b::smallint[])
        ORDER BY due_at
        LIMIT %(limit)s) t;

-- Moving, arming and dropping timers.

-- name: reschedule_timers
UPDATE timers t
   SET due_at = v.d
  FROM unnest(%(p)b::smallint[], %(id)b::text[], %(d)b::timestamptz[]) AS v(p, id, d)
 WHERE t.partition_id = v.p AND t.timer_id = v.id;

-- name: delete_timers
DELETE FROM timers t
 USING unnest(%(p)b::smallint[], %(id)b::text[]) AS v(p, id)
 WHERE t.partition_id = v.p AND t.timer_id = v.id;

-- name: upsert_timer
-- The tenant comes from the timer's owner: it is the timer's lane in the claim.
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
VALUES (%(p)s, %(id)s, %(kind)s, %(owner)s, %(due)s, %(prio)s, %(attempt)s,
        COALESCE(CASE %(kind)s::text
            WHEN 'job' THEN (SELECT j.tenant_id FROM jobs j
                              WHERE j.partition_id = %(p)s AND j.job_id = %(owner)s)
            WHEN 'workflow' THEN (SELECT w.tenant_id FROM workflows w
                                   WHERE w.partition_id = %(p)s AND w.workflow_id = %(owner)s)
            ELSE (SELECT r.tenant_id FROM runs_daily r
                   WHERE r.partition_id = %(p)s AND r.run_id = %(owner)s)
        END, ''))
ON CONFLICT (partition_id, timer_id)
DO UPDATE SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority, attempt = EXCLUDED.attempt;

-- name: insert_new_job_timers
-- The first timers of jobs just created (Jobs.create_many), one statement for
-- all of them; the tenant is the jobs' (upsert_timer looks it up per row).
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
SELECT x.p, x.id, 'job', x.owner, x.due, x.prio, NULL, %(tenant_id)s
  FROM unnest(%(p)b::smallint[], %(id)b::text[], %(owner)b::text[], %(due)b::timestamptz[],
              %(prio)b::smallint[]) AS x(p, id, owner, due, prio);

-- name: arm_sweeps
-- The `pending` sweep timer of each partition given (cronwheel/store/pending.py:
-- PENDING runs past their deadline are announced again), where it has none: a
-- sweep already armed keeps its due time. Owned by the partition, not a
-- tenant: every sweep shares the lane of class %(prio)s and tenant ''.
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
SELECT x.p, 'pending:' || x.p, 'pending', x.p::text, x.due, %(prio)s, NULL, ''
  FROM unnest(%(p)b::smallint[], %(due)b::timestamptz[]) AS x(p, due)
ON CONFLICT (partition_id, timer_id) DO NOTHING;

-- name: notify_timer
SELECT pg_notify('cw_timers', %(due_ms)s::text);

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

-- Batches: start_attempt and end_attempt over arrays, one row back per call
-- in the calls' order (`i`), one round trip per transition and batch. Calls
-- come sorted by (partition, run) so that two batches lock shared runs in the
-- same order; a run appears at most once per statement (the caller sends
-- repeats in a later one).

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

-- Fragments: CTEs of lifecycle.sql's transitions, written where they stand as
-- {{timers.<name>}} (timers.spliced). Each reads the CTE named in its comment.

-- name: arm_attempt_timers
-- StartRun's: the started attempt's lease timer, and its timeout timer when the
-- run has one. Reads `s`: the runs started (partition_id, run_id, tenant_id,
-- attempt, lease_expires_at, spec, priority).
t AS (
    INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt,
                        tenant_id)
    SELECT s.partition_id, k.kind || ':' || s.run_id, k.kind, s.run_id, k.due,
           coalesce(array_position(%(classes)b::text[], s.priority) - 1, %(normal_rank)s),
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

-- name: end_attempt_timers
-- The end of an attempt's: its lease and timeout timers go. Reads `u`: the runs
-- whose attempt ended (partition_id, run_id). Each timer by its whole primary
-- key. With `timer_id IN (two expressions)` the key was searched on
-- partition_id alone (or the table scanned), and every timer of the partition
-- -- all the leases of a busy job -- was read for each run; the materialized
-- list keeps the planner from folding the ids back in as a filter.
-- A timer another transaction holds is left to it (SKIP LOCKED): that is the
-- firing loop, which claimed the timer (FOR UPDATE) and will lock this run
-- next (runs_to_end), so waiting for it here, with the run locked, was a
-- deadlock (a CompleteRun answered 503 once PostgreSQL broke it after
-- deadlock_timeout). The firing loop then finds the attempt ended and drops
-- the timer (Lifecycle.on_expiry); a timer left by a claim that rolled back
-- fires later and is dropped the same way.
ended_timers AS MATERIALIZED (
    SELECT u.partition_id, k.timer_id
      FROM u CROSS JOIN LATERAL (VALUES ('lease:' || u.run_id), ('timeout:' || u.run_id))
           AS k(timer_id)),
free_timers AS MATERIALIZED (
    SELECT t.partition_id, t.timer_id
      FROM timers t JOIN ended_timers e
           ON t.partition_id = e.partition_id AND t.timer_id = e.timer_id
       FOR UPDATE OF t SKIP LOCKED),
d AS (
    DELETE FROM timers t
     USING free_timers f
     WHERE t.partition_id = f.partition_id AND t.timer_id = f.timer_id)

-- name: park_timers
-- Moving a tenant between cells (cronwheel/store/moves.py, docs/cells.md):
-- the freeze parks its timers out of the firing loop's reach, a rollback
-- brings them back (unpark_timers), and a cell the tenant left drops them
-- with its rows (drop_tenant_timers).
-- DELETE waits for a firing transaction holding one of these timers (its
-- claim is FOR UPDATE) and then deletes the timer as that transaction left
-- it (re-armed for the job's next instant, or gone); a claim that starts
-- after this commits finds none.
WITH d AS (DELETE FROM timers WHERE tenant_id = %(t)s RETURNING *)
INSERT INTO timers_parked SELECT * FROM d
ON CONFLICT (partition_id, timer_id) DO UPDATE
   SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority, attempt = EXCLUDED.attempt;

-- name: unpark_timers
-- A rollback: the parked timers back where the firing loop claims them.
WITH d AS (DELETE FROM timers_parked WHERE tenant_id = %(t)s RETURNING *)
INSERT INTO timers SELECT * FROM d
ON CONFLICT (partition_id, timer_id) DO NOTHING;

-- name: drop_tenant_timers
-- With the tenant's other rows (moves.sql delete_small), in that transaction.
WITH p AS (DELETE FROM timers_parked WHERE tenant_id = %(t)s)
DELETE FROM timers WHERE tenant_id = %(t)s;
