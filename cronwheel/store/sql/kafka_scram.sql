-- A tenant's Kafka credential as its broker keeps it (cronwheel/scram.py,
-- migration 0023): never the password. Written by the gateway with the
-- principal (services/gateway/kafka_credentials.py), read by a move
-- (cronwheel/store/moves.py) to make the same credential in the target.

-- name: keep
UPDATE tenants
   SET kafka_scram_mechanism = %(mechanism)s,
       kafka_scram_iterations = %(iterations)s,
       kafka_scram_salt = %(salt)s,
       kafka_scram_salted_password = %(salted_password)s
 WHERE tenant_id = %(t)s;

-- name: kept
SELECT kafka_scram_mechanism AS mechanism,
       kafka_scram_iterations AS iterations,
       kafka_scram_salt AS salt,
       kafka_scram_salted_password AS salted_password
  FROM tenants
 WHERE tenant_id = %(t)s AND kafka_scram_salted_password IS NOT NULL;
