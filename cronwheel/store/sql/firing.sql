-- The firing loop: claim due timers, act on them, move them on.
-- Array parameters use %(x)b (binary): escaping big arrays as text cost more
-- CPU than the rest of the loop.

-- name: claim_due
-- Due timers of the caller's partitions, by priority class then due time. The
-- lateral scan per class stops as soon as LIMIT rows are found, so lower classes
-- are not even read (or locked) while higher ones fill the batch.
SELECT t.partition_id, t.timer_id, t.kind, t.owner_id, t.due_at, t.attempt
  FROM unnest('{0,1,2,3}'::smallint[]) AS c(prio)
 CROSS JOIN LATERAL (
       SELECT partition_id, timer_id, kind, owner_id, due_at, attempt
         FROM timers
        WHERE priority = c.prio AND due_at <= %(now)s
          AND partition_id = ANY(%(partitions)s)
        ORDER BY due_at
        LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED) t
 LIMIT %(limit)s;

-- name: upcoming
-- The next due times of the caller's partitions, to load the timing wheel.
SELECT t.due_at
  FROM unnest('{0,1,2,3}'::smallint[]) AS c(prio)
 CROSS JOIN LATERAL (
       SELECT due_at FROM timers
        WHERE priority = c.prio AND due_at <= %(horizon)s
          AND partition_id = ANY(%(partitions)s)
        ORDER BY due_at
        LIMIT %(limit)s) t;

-- name: jobs_for_timers
SELECT j.partition_id, j.job_id, j.tenant_id, j.schedule, j.target, j.payload, j.priority,
       j.retry, j.timeout_ms, j.lease_ms, j.overlap, j.catchup, j.jitter_ms,
       j.anchor_at, j.last_instant, j.version,
       (j.overlap <> 'allow' AND EXISTS (
            SELECT 1 FROM runs r
             WHERE r.job_id = j.job_id AND r.state IN ('PENDING', 'RUNNING', 'RETRY_WAIT')))
         AS has_active
  FROM jobs j
  JOIN unnest(%(partitions)b::smallint[], %(job_ids)b::text[]) AS k(p, id)
    ON j.partition_id = k.p AND j.job_id = k.id
 WHERE j.deleted_at IS NULL AND NOT j.paused;

-- name: insert_runs
-- Deterministic run ids: a duplicate fire of the same instant inserts nothing.
INSERT INTO runs (partition_id, run_id, tenant_id, job_id, scheduled_at, covers, priority,
                  spec, created_at, updated_at)
SELECT v.p, v.id, v.t, v.j, v.s, v.c::jsonb, v.pr, v.sp::jsonb, %(now)s, %(now)s
  FROM unnest(%(p)b::smallint[], %(id)b::text[], %(t)b::text[], %(j)b::text[],
              %(s)b::timestamptz[], %(c)b::text[], %(pr)b::text[], %(sp)b::text[])
       AS v(p, id, t, j, s, c, pr, sp)
ON CONFLICT DO NOTHING
RETURNING run_id;

-- name: advance_jobs
UPDATE jobs j
   SET last_instant = v.li,
       missed_count = j.missed_count + v.m,
       fired_count = j.fired_count + v.f,
       overlap_skipped = j.overlap_skipped + v.o,
       buffered_at = COALESCE(v.b, j.buffered_at)
  FROM unnest(%(p)b::smallint[], %(id)b::text[], %(li)b::timestamptz[], %(m)b::bigint[],
              %(f)b::bigint[], %(o)b::bigint[], %(b)b::timestamptz[]) AS v(p, id, li, m, f, o, b)
 WHERE j.partition_id = v.p AND j.job_id = v.id;

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
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt)
VALUES (%(p)s, %(id)s, %(kind)s, %(owner)s, %(due)s, %(prio)s, %(attempt)s)
ON CONFLICT (partition_id, timer_id)
DO UPDATE SET due_at = EXCLUDED.due_at, priority = EXCLUDED.priority, attempt = EXCLUDED.attempt;

-- name: notify_timer
SELECT pg_notify('cw_timers', %(due_ms)s::text);

-- name: relaxed_commit
SET LOCAL synchronous_commit = off;
