//! The migrate preflight and the schema compatibility window, on the real PostgreSQL: a
//! refused migration changes nothing (no `_sqlx_migrations`, no table), and a build runs
//! beside a newer schema only when every newer migration is marked backward compatible.

use store::StoreError;
use store::schema::{Requirements, SchemaError};
use tests::TestSystem;
use tests::empty_database::EmptyDatabase;

/// The tables in the database's `public` schema, `_sqlx_migrations` included.
async fn tables(pool: &store::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn migrating_a_postgres_too_old_fails_before_any_change_naming_the_version_it_needs() {
    let database = EmptyDatabase::create().await;
    let pool = database.pool().await;
    // The one server here is new enough: demand a newer one to see the refusal.
    let demanding = Requirements {
        postgres_major_min: 99,
    };
    let refused = store::migrate_with(&pool, &demanding).await.unwrap_err();
    let StoreError::Schema(SchemaError::PostgresTooOld { needed: 99, found }) = &refused else {
        panic!("refused for another reason: {refused}");
    };
    let message = refused.to_string();
    assert!(
        message.contains("palisade needs PostgreSQL 99 or newer")
            && message.contains(found.as_str()),
        "names the version it needs and the one it found: {message}"
    );
    assert_eq!(
        tables(&pool).await,
        Vec::<String>::new(),
        "nothing was created"
    );

    // What palisade needs, this server has: the same call migrates.
    let plan = store::migrate_with(&pool, &Requirements::default())
        .await
        .unwrap();
    assert_eq!(plan.pending.len(), store::MIGRATOR.iter().count());
    assert!(tables(&pool).await.contains(&"_sqlx_migrations".to_owned()));
    pool.close().await;
    database.drop().await;
}

#[tokio::test]
async fn a_role_that_may_not_create_in_the_schema_is_told_which_grant_is_missing() {
    let database = EmptyDatabase::create().await;
    let admin = database.pool().await;
    let role = format!(
        "palisade_nocreate_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    // PostgreSQL 15 grants nobody CREATE on `public` by default.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let as_role = store::connect(&store::DatabaseSettings::new(database.url_as(&role)))
        .await
        .unwrap();

    let refused = store::migrate(&as_role).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::Schema(SchemaError::CreateNotGranted { role: named, schema, .. }) if *named == role && schema == "public"),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains(&format!("GRANT CREATE ON SCHEMA public TO {role}")),
        "says the grant: {refused}"
    );
    assert_eq!(
        tables(&admin).await,
        Vec::<String>::new(),
        "nothing was created"
    );

    // Granted, the same role migrates.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "GRANT CREATE ON SCHEMA public TO {role}"
    )))
    .execute(&admin)
    .await
    .unwrap();
    store::migrate(&as_role).await.unwrap();
    as_role.close().await;
    admin.close().await;
    // The role owns the tables it created: drop them with the database, then the role.
    let maintenance_url = store::with_database(&database.url, "postgres");
    database.drop().await;
    let maintenance = store::connect(&store::DatabaseSettings::new(maintenance_url))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP ROLE {role}")))
        .execute(&maintenance)
        .await
        .unwrap();
    maintenance.close().await;
}

/// A version newer than any migration this build knows.
const NEWER_VERSION: i64 = 99_991_231_000_001;

/// Records [`NEWER_VERSION`] as applied, as a newer build's migrate would.
async fn apply_newer_migration(pool: &store::PgPool) {
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'from a newer build', true, '\\x00', 1)",
    )
    .bind(NEWER_VERSION)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_build_runs_beside_a_newer_schema_only_when_every_newer_migration_is_marked_compatible() {
    let system = TestSystem::spawn().await;
    let expected = store::expected_migration_version();
    apply_newer_migration(&system.pool).await;
    let open =
        || runtime::Connections::open(&system.settings.common, &messages::Identity::Operator);

    // Not marked: this build refuses to start, naming both versions.
    let refused = open().await.map(drop).unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains(&format!("at migration {NEWER_VERSION}"))
            && message.contains(&format!("its newest is {expected}"))
            && message.contains("not marked backward compatible"),
        "{message}"
    );
    // Migrating it is refused too, before any change.
    let before = tables(&system.pool).await;
    let refused = store::migrate(&system.pool).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::Schema(SchemaError::NewerThanBuild { applied: NEWER_VERSION, expected: e, .. }) if e == expected),
        "{refused}"
    );

    // Marked backward compatible (the rolling upgrade's case): this build starts.
    sqlx::query(
        "INSERT INTO backward_compatible_migrations (version, reason) VALUES ($1, 'adds only')",
    )
    .bind(NEWER_VERSION)
    .execute(&system.pool)
    .await
    .unwrap();
    open()
        .await
        .expect("starts beside a compatible newer schema");
    // An older build never migrates a newer schema, marked or not.
    assert!(matches!(
        store::migrate(&system.pool).await,
        Err(StoreError::Schema(SchemaError::NewerThanBuild { .. }))
    ));
    assert_eq!(tables(&system.pool).await, before);
    system.finish().await;
}

#[tokio::test]
async fn a_build_refuses_to_start_on_an_older_schema_naming_both_versions() {
    let system = TestSystem::spawn().await;
    let expected = store::expected_migration_version();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(expected)
        .execute(&system.pool)
        .await
        .unwrap();
    let refused =
        runtime::Connections::open(&system.settings.common, &messages::Identity::Operator)
            .await
            .map(drop)
            .unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains(&format!("needs migration {expected}"))
            && message.contains("run `palisade migrate`"),
        "{message}"
    );
    // Migrating brings it back (the migration is idempotent).
    store::migrate(&system.pool).await.unwrap();
    runtime::Connections::open(&system.settings.common, &messages::Identity::Operator)
        .await
        .expect("starts once migrated");
    system.finish().await;
}
