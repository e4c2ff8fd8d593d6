-- cronwheel: no-transaction
-- 0019's wider timers_kind_check, added NOT VALID, checked against the rows
-- that were there (SHARE UPDATE EXCLUSIVE: reads and writes go on).
-- squawk-ignore prefer-robust-stmts -- validating again after a failure does the same
ALTER TABLE timers VALIDATE CONSTRAINT timers_kind_check;
