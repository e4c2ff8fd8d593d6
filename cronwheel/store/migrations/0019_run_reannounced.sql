-- No run waits forever (docs/pending-deadline.md): a PENDING run that no
-- worker started by its deadline is announced again by the timer, when its
-- partition's sweep timer (kind `pending`, cronwheel/store/pending.py) fires,
-- and the run shows how often and when last
-- (GET /v1/runs/{id}: `reannounced`, `last_reannounced_at`). Both stay NULL
-- until a first re-announcement (read as 0 and null): a NULL costs a row a
-- bit of its null bitmap, which every run already has, and adding nullable
-- columns without a default rewrites nothing.
-- Catalog-only (no rewrite, no scan), but ACCESS EXCLUSIVE on the busiest
-- table: give up rather than queue every run's writes behind a long
-- transaction; a failed try changes nothing and is run again.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '10s';
ALTER TABLE runs
    ADD COLUMN reannounced int CHECK (reannounced >= 1),
    ADD COLUMN last_reannounced_at timestamptz;

-- The new timer kind. Every row the old check allowed, the new one allows:
-- added NOT VALID (no scan under the ACCESS EXCLUSIVE lock), validated by
-- 0020 under a lock that blocks neither reads nor writes.
-- squawk-ignore ban-drop-constraint -- replaced in this transaction by a wider check of the same name
ALTER TABLE timers DROP CONSTRAINT timers_kind_check;
ALTER TABLE timers ADD CONSTRAINT timers_kind_check
    CHECK (kind IN ('job', 'retry', 'lease', 'timeout', 'workflow', 'pending')) NOT VALID;
