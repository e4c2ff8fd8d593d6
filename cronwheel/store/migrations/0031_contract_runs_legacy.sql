-- Run retention's contract, second step (issue 25; docs/migrations.md,
-- "Worked example: run retention", 3b): `runs` and `run_attempts` go, with
-- their indexes, policies, grants and 0025's triggers that mirrored them
-- into runs_daily, and those triggers' functions. No release since v0.4.0
-- reads or writes them; v0.3.0 did, so this is a contract step, applied by
-- `cronwheel migrate --contract` once no v0.3.0 instance runs. Nothing
-- writes them since 0030, so while their files are unlinked at commit the
-- locks held are on these two tables alone, none the platform uses.
--
-- `backfills` stays: `cronwheel migrate --status` reads it, and `cronwheel
-- backfill` finds that there is nothing left to copy.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

-- squawk-ignore ban-drop-table -- no release since v0.4.0 reads or writes it; v0.3.0 must not run
DROP TABLE run_attempts;
-- squawk-ignore ban-drop-table -- no release since v0.4.0 reads or writes it; v0.3.0 must not run
DROP TABLE runs;

-- squawk-ignore-file ban-drop-function -- trigger functions that only the dropped tables' triggers called
DROP FUNCTION runs_daily_mirror_upsert();
DROP FUNCTION runs_daily_mirror_delete();
DROP FUNCTION run_attempts_daily_mirror_upsert();
DROP FUNCTION run_attempts_daily_mirror_delete();
