-- Run reads switch to runs_daily and run_attempts_daily in this release
-- (issue 25; cronwheel/store/sql/runs_read.sql; docs/migrations.md, "Worked
-- example: run retention"): they hold every run only once `cronwheel
-- backfill` has copied the rows older than migration 0025's triggers. This
-- step changes nothing; it refuses to apply until that backfill is done, so
-- no release that reads the new tables is rolled out before they are whole
-- (`cronwheel migrate` stops here with the line below; it applies once the
-- backfill is done).
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM backfills WHERE name = 'runs_daily' AND finished_at IS NULL) THEN
        RAISE EXCEPTION 'the runs_daily backfill is not done: run `cronwheel backfill` until'
            ' `cronwheel migrate --status` says done, then `cronwheel migrate` again';
    END IF;
END $$;
