//! A database of its own that nothing migrated, for tests of what happens before the first
//! migration (the migrate preflight, `palisade migrate --check`).

use uuid::Uuid;

/// An empty database on the test PostgreSQL, dropped by [`EmptyDatabase::drop`].
pub struct EmptyDatabase {
    /// Its URL, as the superuser the tests connect as.
    pub url: String,
}

impl EmptyDatabase {
    /// Creates it.
    pub async fn create() -> Self {
        let backends = super::backends().await;
        let name = format!("palisade_empty_{}", Uuid::new_v4().simple());
        let url = store::with_database(&backends.database_url, &name);
        store::create_database_if_missing(&url)
            .await
            .expect("an empty database is created");
        Self { url }
    }

    /// A URL of the same database that does not exist yet (for `migrate --check` on a
    /// database to create).
    pub async fn missing() -> String {
        let backends = super::backends().await;
        let name = format!("palisade_missing_{}", Uuid::new_v4().simple());
        store::with_database(&backends.database_url, &name)
    }

    /// Its URL as `role` (PostgreSQL's trust authentication on the test server).
    pub fn url_as(&self, role: &str) -> String {
        let (scheme, rest) = self.url.split_once("://").expect("a URL with a scheme");
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{role}@{host}")
    }

    /// A pool on it as the test's superuser.
    pub async fn pool(&self) -> store::PgPool {
        store::connect(&store::DatabaseSettings::new(self.url.clone()))
            .await
            .expect("the empty database answers")
    }

    pub async fn drop(self) {
        store::drop_database(&self.url)
            .await
            .expect("the empty database is dropped");
    }
}
