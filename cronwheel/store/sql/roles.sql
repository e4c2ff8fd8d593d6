-- The roles services log in as, and the check that a service's login cannot
-- bypass row-level security (migration 0018; docs/tenancy.md, "Roles").

-- name: existing
SELECT rolname FROM pg_roles WHERE rolname = ANY(%(names)s);

-- name: set_login
-- {role} and {verifier} are filled in by psycopg.sql (an identifier and a
-- literal). The verifier is SCRAM-SHA-256, computed by libpq on this side:
-- the password itself never reaches the server or its logs.
ALTER ROLE {role} WITH LOGIN PASSWORD {verifier};

-- name: session_role
-- The login and what would let it past row-level security: superuser,
-- BYPASSRLS, or being (a member of) the owner of a table with policies (the
-- owner bypasses them: 0018 left no table FORCEd). `owns` names one such table.
SELECT r.rolname, r.rolsuper, r.rolbypassrls,
       (SELECT c.relname FROM pg_class c
         WHERE c.relrowsecurity AND c.relkind IN ('r', 'p')
           AND pg_has_role(session_user, c.relowner, 'MEMBER')
         ORDER BY c.relname
         LIMIT 1) AS owns
  FROM pg_roles r
 WHERE r.rolname = session_user;
