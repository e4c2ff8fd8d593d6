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
