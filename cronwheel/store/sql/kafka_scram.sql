-- A tenant's Kafka credential as its broker keeps it (cronwheel/scram.py,
-- migration 0023): never the password. Written by the gateway with the
-- principal (services/gateway/kafka_credentials.py), read by a move
-- (cronwheel/store/moves.py) to make the same credential in the target.
-- SaltedPassword is sealed (migration 0027, cronwheel/store/tenant_credentials.py);
-- a row with no key id holds it as 0023's code wrote it, in the clear.

-- name: keep
UPDATE tenants
   SET kafka_scram_mechanism = %(mechanism)s,
       kafka_scram_iterations = %(iterations)s,
       kafka_scram_salt = %(salt)s,
       kafka_scram_salted_password = %(salted_password)s,
       kafka_scram_key_id = %(key_id)s
 WHERE tenant_id = %(t)s;

-- name: kept
SELECT kafka_scram_mechanism AS mechanism,
       kafka_scram_iterations AS iterations,
       kafka_scram_salt AS salt,
       kafka_scram_salted_password AS salted_password,
       kafka_scram_key_id AS key_id
  FROM tenants
 WHERE tenant_id = %(t)s AND kafka_scram_salted_password IS NOT NULL;

-- name: to_reseal
-- A batch of kept credentials not sealed with the current key (in the clear
-- from before 0027, or sealed with an older key), after the last one seen,
-- locked so that two reseals never fight over a row.
SELECT tenant_id, kafka_scram_salted_password, kafka_scram_key_id FROM tenants
 WHERE kafka_scram_salted_password IS NOT NULL
   AND kafka_scram_key_id IS DISTINCT FROM %(current)s
   AND tenant_id > %(after)s
 ORDER BY tenant_id
 LIMIT %(batch)s
   FOR UPDATE SKIP LOCKED;

-- name: reseal
UPDATE tenants SET kafka_scram_salted_password = %(sealed)s, kafka_scram_key_id = %(key_id)s
 WHERE tenant_id = %(t)s;
