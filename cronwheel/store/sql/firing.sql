-- The firing loop: claim due timers, act on them, move them on.
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
        ORDER BY due_at
        LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED) t
 LIMIT %(limit)s;

-- name: due_lanes
-- The lanes (class, tenant) with a due timer in the caller's partitions, by
-- class. A loose index scan of timers_lane: one descent per lane that exists
-- and one probe for a due row, however many timers each lane holds.
WITH RECURSIVE lane(priority, tenant_id) AS (
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
 ORDER BY l.priority, l.tenant_id;

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

-- name: jobs_for_timers
-- JSON comes back as text (the loop parses what it needs once per distinct
-- text, and passes target and retry on into the run's spec as they are),
-- instants as epoch milliseconds: no per-row JSON decoding or datetimes.
-- has_active: an unfinished run of a job whose overlap is not `allow`
-- (finished_at IS NULL is state IN (PENDING, RUNNING, RETRY_WAIT) by the
-- finished_iff_terminal check; runs_open_job serves it).
SELECT j.partition_id, j.job_id, j.tenant_id, j.schedule::text, j.target::text, j.payload,
       j.priority, j.retry::text, j.timeout_ms, j.lease_ms, j.overlap, j.catchup::text,
       j.jitter_ms, floor(extract(epoch FROM j.anchor_at) * 1000)::bigint,
       floor(extract(epoch FROM j.last_instant) * 1000)::bigint, j.version,
       (j.overlap <> 'allow' AND EXISTS (
            SELECT 1 FROM runs r
             WHERE r.job_id = j.job_id AND r.finished_at IS NULL))
         AS has_active,
       j.target->>'type', j.target->>'queue'
  FROM jobs j
  JOIN unnest(%(partitions)b::smallint[], %(job_ids)b::text[]) AS k(p, id)
    ON j.partition_id = k.p AND j.job_id = k.id
 WHERE j.deleted_at IS NULL AND NOT j.paused;

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
-- The tenant comes from the timer's owner: it is the timer's lane in the claim.
INSERT INTO timers (partition_id, timer_id, kind, owner_id, due_at, priority, attempt, tenant_id)
VALUES (%(p)s, %(id)s, %(kind)s, %(owner)s, %(due)s, %(prio)s, %(attempt)s,
        COALESCE(CASE %(kind)s::text
            WHEN 'job' THEN (SELECT j.tenant_id FROM jobs j
                              WHERE j.partition_id = %(p)s AND j.job_id = %(owner)s)
            WHEN 'workflow' THEN (SELECT w.tenant_id FROM workflows w
                                   WHERE w.partition_id = %(p)s AND w.workflow_id = %(owner)s)
            ELSE (SELECT r.tenant_id FROM runs r
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

-- name: notify_timer
SELECT pg_notify('cw_timers', %(due_ms)s::text);

-- name: firing_settings
-- For the firing transaction only (set_config(..., true) is SET LOCAL): no WAL
-- flush wait at commit (see Firing.fire_due), and no JIT: a storm's batch
-- statements can look costly enough to compile, 0.7 s for one. (Turning off
-- seq scans, sorts and hash joins here as well was tried: it made the storm no
-- faster and the steady loop's p99 lateness 1.8 s instead of 0.1 s.)
SELECT set_config('synchronous_commit', 'off', true),
       set_config('jit', 'off', true);
