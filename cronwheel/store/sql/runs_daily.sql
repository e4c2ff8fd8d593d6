-- Run history by day (migration 0025; docs/migrations.md, "Worked example:
-- run retention"): the day partitions of runs_daily and run_attempts_daily,
-- made ahead and dropped past the retention horizon, and the backfill that
-- copies the rows older than the mirror triggers (while `runs` exists: the
-- contract steps 0030-0031 drop it and the mirror). Run as the tables' owner
-- (DDL). {runs_part}, {attempts_part}, {lo} and {hi} are filled in by
-- psycopg.sql (the day's two tables, the runs one's name as a literal, the day's
-- bounds): the two tables
-- always have the same days, so a day's runs and their attempts go together.

-- name: day_partitions
-- The day partitions of runs_daily (not the default), oldest first.
SELECT c.relname AS name
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = 'runs_daily'::regclass AND c.relname ~ '^runs_daily_p[0-9]{8}$'
 ORDER BY c.relname;

-- name: create_day
-- A day's two tables, outside the parents first: the rows the default
-- partitions hold for the day (a stack that ran before its day was made) move
-- into them, then they are attached; a plain CREATE ... PARTITION OF would
-- fail on such rows. The defaults are locked against writes meanwhile, so no
-- row of the day reaches them between the move and the attach.
CREATE TABLE {runs_part} (LIKE runs_daily INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 80);
CREATE TABLE {attempts_part} (LIKE run_attempts_daily INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
LOCK TABLE runs_daily_default, run_attempts_daily_default IN SHARE ROW EXCLUSIVE MODE;
WITH moved AS (
    DELETE FROM runs_daily_default WHERE scheduled_at >= {lo} AND scheduled_at < {hi}
    RETURNING *)
INSERT INTO {runs_part} SELECT * FROM moved;
WITH moved AS (
    DELETE FROM run_attempts_daily_default WHERE scheduled_at >= {lo} AND scheduled_at < {hi}
    RETURNING *)
INSERT INTO {attempts_part} SELECT * FROM moved;
ALTER TABLE runs_daily ATTACH PARTITION {runs_part} FOR VALUES FROM ({lo}) TO ({hi});
ALTER TABLE run_attempts_daily ATTACH PARTITION {attempts_part} FOR VALUES FROM ({lo}) TO ({hi});
GRANT SELECT, INSERT, UPDATE, DELETE ON {runs_part}, {attempts_part} TO cronwheel_platform;

-- name: detached_days
-- Day tables no parent has (a retention pass that died after a detach and
-- before its drop): their unfinished runs were kept in the detach's
-- transaction, so they are dropped as they are.
SELECT c.relname AS name
  FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
   AND c.relname ~ '^runs_daily_p[0-9]{8}$' AND NOT c.relispartition
 ORDER BY c.relname;

-- name: detach_day
-- A day past the horizon, out of the parents. DETACH takes the parents'
-- ACCESS EXCLUSIVE lock until the transaction ends: the caller's
-- lock_timeout bounds the wait, and what follows under the lock reads the
-- day's unfinished runs only, by its partial index. The DROP comes after the
-- commit (drop_day), on tables no longer partitions, so it locks them alone.
ALTER TABLE runs_daily DETACH PARTITION {runs_part};
ALTER TABLE run_attempts_daily DETACH PARTITION {attempts_part};

-- name: keep_unfinished
-- A non-terminal run of a dropped day stays: it and its attempts go back
-- through the parents, whose day is gone, into the default partitions, where
-- it finishes; terminal rows there go by keep_default_expired.
WITH kept AS (
    INSERT INTO runs_daily SELECT * FROM {runs_part} WHERE finished_at IS NULL
    RETURNING partition_id, run_id, scheduled_at),
kept_attempts AS (
    INSERT INTO run_attempts_daily
    SELECT a.* FROM {attempts_part} a
      JOIN kept k ON k.partition_id = a.partition_id AND k.run_id = a.run_id
                 AND k.scheduled_at = a.scheduled_at
    RETURNING 1)
SELECT (SELECT count(*) FROM kept) AS runs, (SELECT count(*) FROM kept_attempts) AS attempts;

-- name: drop_day
DROP TABLE {runs_part}, {attempts_part};

-- name: day_size
-- The planner's row estimate of a day (what a drop removes, without counting).
SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c
 WHERE c.relname = {runs_name} AND c.relnamespace = 'public'::regnamespace;

-- name: longest_retention
-- Days run history is kept physically: the longest any tenant has. A day's
-- partition holds every tenant's runs, so it goes once the longest has
-- passed; each tenant's reads stop at its own horizon (runs_read.sql).
SELECT greatest(%(default_days)s::int, coalesce(max(run_retention_days), 0))
  FROM tenants;

-- name: delete_default_expired
-- The default partitions are small by construction (days made a week ahead):
-- their terminal rows past their tenant's own horizon go in bounded batches.
WITH gone AS (
    DELETE FROM runs_daily_default d
     WHERE (d.partition_id, d.run_id, d.scheduled_at) IN (
           SELECT r.partition_id, r.run_id, r.scheduled_at
             FROM runs_daily_default r
             JOIN tenants t ON t.tenant_id = r.tenant_id
            WHERE r.finished_at IS NOT NULL
              AND r.scheduled_at < %(now)s
                  - make_interval(days => coalesce(t.run_retention_days, %(default_days)s))
            LIMIT %(limit)s)
    RETURNING partition_id, run_id, scheduled_at),
gone_attempts AS (
    DELETE FROM run_attempts_daily_default a USING gone g
     WHERE a.partition_id = g.partition_id AND a.run_id = g.run_id
       AND a.scheduled_at = g.scheduled_at)
SELECT count(*) FROM gone;

-- name: legacy_runs_exist
-- Whether `runs`, the backfill's source, is still there: contract step 0031
-- drops it, and after it there is nothing to copy.
SELECT to_regclass('runs') IS NOT NULL;

-- name: backfill_claim
-- The backfill's row, locked for the batch's transaction: a second backfill
-- finds it taken and waits its turn; the cursor read here is the last
-- committed batch's.
SELECT after_partition_id, after_run_id, visited, copied, finished_at
  FROM backfills
 WHERE name = 'runs_daily'
   FOR UPDATE SKIP LOCKED;

-- name: backfill_start
UPDATE backfills
   SET started_at = coalesce(started_at, %(now)s),
       total = coalesce(total,
                        (SELECT greatest(reltuples, 0)::bigint FROM pg_class
                          WHERE oid = 'runs'::regclass)),
       updated_at = %(now)s
 WHERE name = 'runs_daily';

-- name: backfill_days
-- The days of the next batch, so their partitions exist before it is copied.
SELECT DISTINCT date_trunc('day', b.scheduled_at, 'UTC') AS day
  FROM (SELECT scheduled_at FROM runs
         WHERE (partition_id, run_id) > (%(p)s, %(id)s)
         ORDER BY partition_id, run_id
         LIMIT %(batch)s) b;

-- name: backfill_batch
-- One batch in runs' key order after the cursor, copied with its attempts,
-- and the cursor moved past it, in one transaction: a batch is copied whole
-- and counted once, or not at all. FOR KEY SHARE holds off a delete of a row
-- being copied (a delete after the copy is mirrored); an update racing the
-- copy is the mirror's upsert, which the copy's DO NOTHING never overwrites.
-- Terminal runs older than the horizon are visited, not copied: their day
-- would be dropped at once.
WITH batch AS (
    SELECT r.* FROM runs r
     WHERE (r.partition_id, r.run_id) > (%(p)s, %(id)s)
     ORDER BY r.partition_id, r.run_id
     LIMIT %(batch)s
       FOR KEY SHARE),
wanted AS (
    SELECT * FROM batch WHERE finished_at IS NULL OR scheduled_at >= %(horizon)s),
runs_in AS (
    INSERT INTO runs_daily SELECT * FROM wanted
    ON CONFLICT (partition_id, run_id, scheduled_at) DO NOTHING
    RETURNING 1),
attempts_in AS (
    INSERT INTO run_attempts_daily
    SELECT a.partition_id, a.run_id, a.attempt, a.worker_id, a.started_at, a.finished_at,
           a.outcome, a.error, w.scheduled_at, w.tenant_id
      FROM wanted w
      JOIN run_attempts a ON a.partition_id = w.partition_id AND a.run_id = w.run_id
    ON CONFLICT (partition_id, run_id, attempt, scheduled_at) DO NOTHING
    RETURNING 1),
last AS (
    SELECT partition_id, run_id FROM batch ORDER BY partition_id DESC, run_id DESC LIMIT 1)
UPDATE backfills f
   SET after_partition_id = coalesce((SELECT partition_id FROM last), f.after_partition_id),
       after_run_id = coalesce((SELECT run_id FROM last), f.after_run_id),
       visited = f.visited + (SELECT count(*) FROM batch),
       copied = f.copied + (SELECT count(*) FROM runs_in),
       copied_attempts = f.copied_attempts + (SELECT count(*) FROM attempts_in),
       updated_at = %(now)s,
       finished_at = CASE WHEN (SELECT count(*) FROM batch) < %(batch)s THEN %(now)s END
 WHERE f.name = 'runs_daily'
RETURNING (SELECT count(*) FROM batch) AS visited_now, f.visited, f.copied,
          f.copied_attempts, f.total, f.finished_at;

-- name: backfill_status
SELECT name, after_partition_id, after_run_id, visited, copied, copied_attempts, total,
       started_at, updated_at, finished_at
  FROM backfills
 ORDER BY name;

-- name: backfill_reset
-- Start the copy over (a restore put old rows back): the cursor to the
-- start. The copy's DO NOTHING makes a second pass harmless.
UPDATE backfills
   SET after_partition_id = NULL, after_run_id = NULL, visited = 0, copied = 0,
       copied_attempts = 0, total = NULL, started_at = NULL, updated_at = NULL,
       finished_at = NULL
 WHERE name = 'runs_daily';
