-- What the migrate preflight decides on: the server's version (`server_version_num`, and the
-- text it shows), the role migrating, the database, the schema new objects would be created
-- in (null when no schema on the search_path exists) and whether the role may create there,
-- and whether palisade's two migration tables exist yet.
SELECT current_setting('server_version_num') AS server_version_num,
       current_setting('server_version') AS server_version,
       current_user::text AS role_name,
       current_database()::text AS database_name,
       current_schema()::text AS schema_name,
       current_setting('search_path') AS search_path,
       COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false) AS may_create,
       to_regclass('_sqlx_migrations') IS NOT NULL AS has_migrations_table,
       to_regclass('backward_compatible_migrations') IS NOT NULL AS has_compatibility_table
