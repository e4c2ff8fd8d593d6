#!/bin/sh
# The postgres image runs this once, on the first boot of an empty data
# directory (docker-entrypoint-initdb.d), as the cluster's superuser: it makes
# the owner of cronwheel's tables, a role that is not a superuser, and the
# database it owns. CREATEROLE lets `cronwheel migrate`, which runs as this
# owner, make the services' roles and give them their logins (migration 0018,
# docs/tenancy.md "Roles").
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v owner_password="$CRONWHEEL_OWNER_PASSWORD" <<'SQL'
CREATE ROLE cronwheel LOGIN CREATEROLE PASSWORD :'owner_password';
CREATE DATABASE cronwheel OWNER cronwheel;
SQL
