-- cronwheel: no-transaction
-- The pending sweep's scan (cronwheel/store/sql/pending.sql,
-- reannounce_overdue): a partition's open runs by instant, never its history.
-- finished_at, as in runs_open_job (0010): it does not change when a run
-- starts, heartbeats or retries, so those updates stay HOT; a run's finish
-- already changes runs_open_job's predicate. A fired run costs one more index
-- entry, of a smallint and a timestamp. Built concurrently: runs is the
-- largest table and written all the time.
CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_unfinished ON runs (partition_id, scheduled_at)
 WHERE finished_at IS NULL;
