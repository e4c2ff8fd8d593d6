-- Fewer index entries per run (docs/architecture.md, "What a run costs the
-- store"). Every fired run was a heap row plus five index entries, and every
-- transition of it (start, complete) five more: runs_active_job's predicate
-- names `state`, and an update that changes a column an index names (in its
-- keys or its predicate) cannot be HOT. 0010 built its replacement.

-- The primary key (partition_id, run_id) already makes run ids unique: the
-- partition is the run id's first three hex digits (core/ids.py
-- partition_of_run), so no two rows can share a run id in different
-- partitions, and every query names both (store/sql/*.sql, runs_read.py).
DROP INDEX IF EXISTS runs_run_id;
DROP INDEX IF EXISTS runs_active_job;

-- Room on each page for the new versions of start, heartbeat and retry
-- updates, so they stay HOT (existing pages gain it as they are rewritten).
ALTER TABLE runs SET (fillfactor = 80);
