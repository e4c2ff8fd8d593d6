-- Tenants, keys and jobs.

-- name: insert_tenant
INSERT INTO tenants (tenant_id, name, cell, priority_classes)
VALUES (%(tenant_id)s, %(name)s, %(cell)s, %(classes)s)
RETURNING tenant_id, name, cell, priority_classes, created_at;

-- name: insert_api_key
INSERT INTO api_keys (key_id, tenant_id, key_hash) VALUES (%(key_id)s, %(tenant_id)s, %(hash)s);

-- name: tenant_by_key
SELECT t.tenant_id, t.name, t.cell, t.priority_classes
  FROM api_keys k JOIN tenants t USING (tenant_id)
 WHERE k.key_hash = %(hash)s AND k.revoked_at IS NULL;

-- name: get_tenant
SELECT tenant_id, name, cell, priority_classes, created_at FROM tenants WHERE tenant_id = %(tenant_id)s;

-- name: insert_job
INSERT INTO jobs (partition_id, job_id, tenant_id, name, schedule, target, payload, priority,
                  retry, timeout_ms, lease_ms, overlap, catchup, jitter_ms, anchor_at,
                  last_instant, created_at, updated_at)
VALUES (%(partition_id)s, %(job_id)s, %(tenant_id)s, %(name)s, %(schedule)s, %(target)s,
        %(payload)s, %(priority)s, %(retry)s, %(timeout_ms)s, %(lease_ms)s, %(overlap)s,
        %(catchup)s, %(jitter_ms)s, %(now)s, %(now)s, %(now)s, %(now)s);

-- name: get_job
SELECT j.*, t.due_at AS next_due_at
  FROM jobs j
  LEFT JOIN timers t ON t.partition_id = j.partition_id AND t.timer_id = 'job:' || j.job_id
 WHERE j.partition_id = %(partition_id)s AND j.job_id = %(job_id)s
   AND j.tenant_id = %(tenant_id)s AND j.deleted_at IS NULL;

-- name: lock_job_timer
-- Job operations lock the job's timer before the job row: the firing loop takes
-- them in that order (claim the timer, then advance the job), and the same order
-- everywhere is what keeps a pause during a firing from deadlocking.
SELECT 1 FROM timers
 WHERE partition_id = %(partition_id)s AND timer_id = 'job:' || %(job_id)s
   FOR UPDATE;

-- name: lock_job
SELECT * FROM jobs
 WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s
   AND tenant_id = %(tenant_id)s AND deleted_at IS NULL
   FOR UPDATE;

-- name: list_jobs
-- Keyset pagination on (created_at, job_id): stable while jobs are added.
SELECT j.*, t.due_at AS next_due_at
  FROM jobs j
  LEFT JOIN timers t ON t.partition_id = j.partition_id AND t.timer_id = 'job:' || j.job_id
 WHERE j.tenant_id = %(tenant_id)s AND j.deleted_at IS NULL
   AND (%(after_created)s::timestamptz IS NULL
        OR (j.created_at, j.job_id) > (%(after_created)s, %(after_id)s))
 ORDER BY j.created_at, j.job_id
 LIMIT %(limit)s;

-- name: update_job
UPDATE jobs
   SET name = %(name)s, schedule = %(schedule)s, target = %(target)s, payload = %(payload)s,
       priority = %(priority)s, retry = %(retry)s, timeout_ms = %(timeout_ms)s,
       lease_ms = %(lease_ms)s, overlap = %(overlap)s, catchup = %(catchup)s,
       jitter_ms = %(jitter_ms)s, anchor_at = %(anchor_at)s, version = version + 1,
       updated_at = %(now)s
 WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: set_paused
UPDATE jobs SET paused = %(paused)s, updated_at = %(now)s, version = version + 1
 WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: soft_delete_job
UPDATE jobs SET deleted_at = %(now)s, updated_at = %(now)s
 WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: restart_schedule_from
-- A changed schedule starts from now: its past instants never fire.
UPDATE jobs SET last_instant = %(now)s
 WHERE partition_id = %(partition_id)s AND job_id = %(job_id)s;

-- name: insert_jobs
-- Many new jobs of one tenant in one statement (create_many): one row per
-- element of the arrays, columns as insert_job writes them. RETURNING * is
-- what the answers are rendered from. The arrays go in binary (b placeholders): psycopg
-- quotes each element of a text array with a regular expression, which was the
-- largest cost of a batch.
INSERT INTO jobs (partition_id, job_id, tenant_id, name, schedule, target, payload, priority,
                  retry, timeout_ms, lease_ms, overlap, catchup, jitter_ms, anchor_at,
                  last_instant, created_at, updated_at)
SELECT x.partition_id, x.job_id, %(tenant_id)s, x.name, x.schedule, x.target, x.payload,
       x.priority, x.retry, x.timeout_ms, x.lease_ms, x.overlap, x.catchup, x.jitter_ms,
       %(now)s, %(now)s, %(now)s, %(now)s
  FROM unnest(%(partition_id)b::smallint[], %(job_id)b::text[], %(name)b::text[],
              %(schedule)b::jsonb[], %(target)b::jsonb[], %(payload)b::text[],
              %(priority)b::text[], %(retry)b::jsonb[], %(timeout_ms)b::integer[],
              %(lease_ms)b::integer[], %(overlap)b::text[], %(catchup)b::jsonb[],
              %(jitter_ms)b::integer[])
       AS x(partition_id, job_id, name, schedule, target, payload, priority, retry,
            timeout_ms, lease_ms, overlap, catchup, jitter_ms)
RETURNING *;

-- The `job` timer kind (jobs.JobTimers): the jobs a firing pass plans, and
-- what it records of each.

-- name: jobs_for_timers
-- JSON comes back as text (the loop parses what it needs once per distinct
-- text, and passes target and retry on into the run's spec as they are),
-- instants as epoch milliseconds: no per-row JSON decoding or datetimes.
-- has_active: an unfinished run of a job whose overlap is not `allow`
-- (finished_at IS NULL is state IN (PENDING, RUNNING, RETRY_WAIT) by the
-- finished_iff_terminal check; runs_daily_open_job serves it).
SELECT j.partition_id, j.job_id, j.tenant_id, j.schedule::text, j.target::text, j.payload,
       j.priority, j.retry::text, j.timeout_ms, j.lease_ms, j.overlap, j.catchup::text,
       j.jitter_ms, floor(extract(epoch FROM j.anchor_at) * 1000)::bigint,
       floor(extract(epoch FROM j.last_instant) * 1000)::bigint, j.version,
       (j.overlap <> 'allow' AND EXISTS (
            SELECT 1 FROM runs_daily r
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
