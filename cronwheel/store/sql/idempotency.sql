-- Idempotency-Key: the first response to a POST, replayed to its duplicates.

-- name: forget_expired
DELETE FROM idempotency_keys
 WHERE scope = %(scope)s AND key = %(key)s AND created_at < %(expired_before)s;

-- name: claim
-- Waits on a concurrent first request with the same key until it commits; then
-- inserts nothing, and the caller reads the stored response.
INSERT INTO idempotency_keys (scope, key, fingerprint, created_at)
VALUES (%(scope)s, %(key)s, %(fingerprint)s, %(now)s)
ON CONFLICT (scope, key) DO NOTHING
RETURNING key;

-- name: stored
SELECT fingerprint, status, body FROM idempotency_keys
 WHERE scope = %(scope)s AND key = %(key)s;

-- name: record
UPDATE idempotency_keys SET status = %(status)s, body = %(body)s
 WHERE scope = %(scope)s AND key = %(key)s;

-- name: all_scopes
-- The pruner works on every tenant's keys: it acts as the operator for its
-- transaction (transactions.sql operator_role; migration 0018).
SET LOCAL ROLE cronwheel_operator;

-- name: prune
-- One batch of expired keys, oldest first (idempotency_keys_created); rows a
-- request holds (its own key, being replayed or forgotten) are skipped.
DELETE FROM idempotency_keys i
 USING (SELECT scope, key FROM idempotency_keys
         WHERE created_at < %(expired_before)s
         ORDER BY created_at
         LIMIT %(batch)s
           FOR UPDATE SKIP LOCKED) AS old
 WHERE i.scope = old.scope AND i.key = old.key;

-- name: unredacted
-- Successful answers that may show a secret (recorded before the gateway
-- redacted them), after the last one seen; the caller checks each.
SELECT scope, key, body FROM idempotency_keys
 WHERE status < 300 AND body IS NOT NULL
   AND (body LIKE '%%"api_key"%%' OR body LIKE '%%"secret"%%' OR body LIKE '%%"password"%%')
   AND (scope, key) > (%(scope)s, %(key)s)
 ORDER BY scope, key
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: rewrite
UPDATE idempotency_keys SET body = %(body)s WHERE scope = %(scope)s AND key = %(key)s;
