-- A tenant's kept Kafka credential sealed at rest (issue 23). SaltedPassword
-- is as good as the password to a SCRAM client (ClientKey is an HMAC of it),
-- so from now on kafka_scram_salted_password holds it sealed with the
-- operator's keyring (cronwheel/core/sealing.py, as webhook secrets since
-- 0016), and this column names the key. Rows written by 0023's code hold it
-- in the clear with no key id: they are still read, and `cronwheel secrets
-- reseal` seals them while the system runs.
-- A nullable column with no default: catalog-only; the lock is short, but
-- give up rather than queue behind a long transaction.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '30s';
ALTER TABLE tenants ADD COLUMN kafka_scram_key_id text;
