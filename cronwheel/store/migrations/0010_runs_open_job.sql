-- cronwheel: no-transaction
-- "Has this job an unfinished run?" (overlap skip / buffer_one, firing.sql
-- jobs_for_timers; cancel_pending_runs_of_job), replacing runs_active_job
-- (dropped in 0011). finished_at IS NULL is the same set as state IN (PENDING,
-- RUNNING, RETRY_WAIT) by the finished_iff_terminal check, and unlike state it
-- does not change when a run starts, retries or heartbeats: with no index
-- naming `state`, those updates can be HOT. Built concurrently: runs is the
-- largest table and written all the time.
CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_open_job ON runs (job_id)
 WHERE finished_at IS NULL AND job_id IS NOT NULL;
