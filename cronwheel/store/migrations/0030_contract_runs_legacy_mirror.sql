-- Run retention's contract, first of two steps (issue 25; docs/migrations.md,
-- "Worked example: run retention", 3b): the reverse mirror goes. Since
-- v0.4.0 (0029) every release reads and writes runs_daily and
-- run_attempts_daily only; 0029's triggers copied those writes back to
-- `runs` and `run_attempts` for v0.3.0, the last release that reads them.
-- After this step they fall behind, so it is a contract step, applied by
-- `cronwheel migrate --contract` once no v0.3.0 instance runs.
--
-- The tables go in 0031, a transaction of their own: DROP TRIGGER holds
-- ACCESS EXCLUSIVE on runs_daily, run_attempts_daily and each of their
-- partitions until commit (every run write waits), and a dropped table's
-- files are unlinked at commit, before the locks are released, for a time
-- that grows with `runs`, which nothing ever trimmed. Here the lock covers
-- catalog changes only.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

DROP TRIGGER runs_legacy_mirror_insert ON runs_daily;
DROP TRIGGER runs_legacy_mirror_update ON runs_daily;
DROP TRIGGER runs_legacy_mirror_delete ON runs_daily;
DROP TRIGGER run_attempts_legacy_mirror_insert ON run_attempts_daily;
DROP TRIGGER run_attempts_legacy_mirror_update ON run_attempts_daily;
DROP TRIGGER run_attempts_legacy_mirror_delete ON run_attempts_daily;

-- squawk-ignore-file ban-drop-function -- trigger functions that only the triggers above called
DROP FUNCTION runs_legacy_mirror_upsert();
DROP FUNCTION runs_legacy_mirror_delete();
DROP FUNCTION run_attempts_legacy_mirror_upsert();
DROP FUNCTION run_attempts_legacy_mirror_delete();
