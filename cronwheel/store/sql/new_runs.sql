-- Run creation: runs inserted PENDING (never moved: lifecycle.sql moves them).

-- name: insert_runs
-- Deterministic run ids: a duplicate fire of the same instant inserts nothing
-- (the id fixes the instant, so the duplicate meets the same key with its
-- scheduled_at, in the same day's partition: migration 0025).
INSERT INTO runs_daily (partition_id, run_id, tenant_id, job_id, scheduled_at, covers, priority,
                        spec, created_at, updated_at)
SELECT v.p, v.id, v.t, v.j, v.s, v.c::jsonb, v.pr, v.sp::jsonb, %(now)s, %(now)s
  FROM unnest(%(p)b::smallint[], %(id)b::text[], %(t)b::text[], %(j)b::text[],
              %(s)b::timestamptz[], %(c)b::text[], %(pr)b::text[], %(sp)b::text[])
       AS v(p, id, t, j, s, c, pr, sp)
ON CONFLICT DO NOTHING
RETURNING run_id;
