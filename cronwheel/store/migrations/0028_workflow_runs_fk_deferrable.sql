-- A workflow run's reference to its workflow may be checked at commit
-- (issue 24, moving a tenant). The freeze's catch-up (store/moves.py
-- catch_up) deletes the tenant's workflows and inserts them again from the
-- source in one transaction, keeping its finished workflow runs; checked at
-- once, the delete failed with a foreign key violation for any tenant with a
-- workflow run, and the move stopped with the tenant frozen. Every other
-- writer still has it checked at each statement (INITIALLY IMMEDIATE); the
-- catch-up alone defers it (SET CONSTRAINTS), and at its commit every
-- workflow run has its workflow again.
-- ALTER CONSTRAINT changes the catalog only: no row is read. The lock is
-- short; give up rather than queue behind a long transaction.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '30s';
ALTER TABLE workflow_runs
    ALTER CONSTRAINT workflow_runs_partition_id_workflow_id_fkey DEFERRABLE INITIALLY IMMEDIATE;
