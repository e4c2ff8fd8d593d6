-- Autoanalyze on the tables every run writes, after a fixed 50,000 changes
-- (plus the default 10% of the table) instead of 50 (plus 10%).
--
-- Why: an ANALYZE (as a VACUUM) rewrites the table's pg_class row, and that
-- invalidates every cached plan of every statement on the table, in every
-- backend; each backend then plans its statements again on their next use,
-- and the lifecycle's batch statements take 1-3 ms to plan. With the default
-- threshold a small table that churns (a few hundred jobs firing each second,
-- the timers and outbox rows that come and go with them) was analyzed at every
-- autovacuum naptime: at 200 runs/s, about 110 analyzes in 40 s on the four
-- tables CompleteRun's statement reads, and planning became half of the
-- gateway's PostgreSQL CPU (docs/architecture.md, "Plans invalidated by
-- autovacuum"). What these statistics describe -- keys, states, the spread of
-- instants -- keeps its shape under churn; row counts stay current anyway,
-- since every VACUUM updates reltuples. The vacuum thresholds (0006) stay.
ALTER TABLE runs SET (autovacuum_analyze_threshold = 50000);
ALTER TABLE run_attempts SET (autovacuum_analyze_threshold = 50000);
ALTER TABLE timers SET (autovacuum_analyze_threshold = 50000);
ALTER TABLE outbox SET (autovacuum_analyze_threshold = 50000);
ALTER TABLE jobs SET (autovacuum_analyze_threshold = 50000);
ALTER TABLE processed SET (autovacuum_analyze_threshold = 50000);
ALTER TABLE partition_leases SET (autovacuum_analyze_threshold = 50000);
