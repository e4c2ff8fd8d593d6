-- The indexes of partitioned tables, completed partition by partition
-- (cronwheel/store/partition_indexes.py). Read as the tables' owner.

-- name: missing
-- Each partitioned index (relkind 'I': one made ON ONLY the parent) and each
-- partition of its table that has no index attached to it yet, with what
-- the child index must be (the parent's definition, from its USING on).
SELECT pi.relname AS parent_index, t.relname AS parent_table, c.relname AS partition,
       x.indisunique AS is_unique,
       substr(pg_get_indexdef(pi.oid), strpos(pg_get_indexdef(pi.oid), ' USING ') + 7) AS body
  FROM pg_index x
  JOIN pg_class pi ON pi.oid = x.indexrelid AND pi.relkind = 'I'
  JOIN pg_class t ON t.oid = x.indrelid
  JOIN pg_inherits h ON h.inhparent = x.indrelid
  JOIN pg_class c ON c.oid = h.inhrelid AND c.relkind = 'r'
 WHERE pi.relnamespace = 'public'::regnamespace
   AND NOT EXISTS (SELECT 1
                     FROM pg_inherits hi
                     JOIN pg_index cx ON cx.indexrelid = hi.inhrelid
                    WHERE hi.inhparent = pi.oid AND cx.indrelid = c.oid)
 ORDER BY pi.relname, c.relname;

-- name: index_valid
-- Whether an index of that name exists on that partition, and is valid (a
-- CREATE INDEX CONCURRENTLY that failed leaves an invalid one behind).
SELECT x.indisvalid
  FROM pg_class i JOIN pg_index x ON x.indexrelid = i.oid
 WHERE i.relname = %(name)s AND i.relnamespace = 'public'::regnamespace
   AND x.indrelid = %(partition)s::regclass;
