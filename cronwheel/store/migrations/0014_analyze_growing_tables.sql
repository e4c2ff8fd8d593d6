-- Back to the default autoanalyze threshold for the tables that grow: runs,
-- run_attempts and processed (0013 raised it to 50,000 changes on them).
--
-- Their statistics change shape as they grow (a young deployment's first
-- months, a storm of 100k one-off runs), and plans are made from them; with
-- the default, a growing table is analyzed each time it grows by 10%, which is
-- rarely once it is large. 0013 stays for the tables whose size stays bounded
-- while they churn -- timers, outbox, jobs, partition_leases -- where the
-- analyzes at every naptime were, and where their plan invalidations cost.
ALTER TABLE runs RESET (autovacuum_analyze_threshold);
ALTER TABLE run_attempts RESET (autovacuum_analyze_threshold);
ALTER TABLE processed RESET (autovacuum_analyze_threshold);
