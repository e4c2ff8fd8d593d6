-- Tables that churn: every firing moves its timers (a non-HOT update, since
-- due_at is indexed) and the relay deletes every outbox row it publishes. Dead
-- index entries pile up at the front of the ranges the firing loop and the
-- relay scan on every pass (due_at <= now, the oldest rows of a lane), and each
-- pass steps over all of them until a vacuum removes them. With the default
-- thresholds (20% of the table) a table of 1M timers is vacuumed after 200k
-- dead rows; here after a fixed 2,000 with no cost-based pauses, which keeps
-- those ranges short. (docs/architecture.md, "Vacuum on the churning tables".)
ALTER TABLE timers SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);
