//! A Postgres database of its own for one test or one benchmark measurement, on a
//! shared server, so that nothing reads what another run left (a batch of the same name
//! would already be done). Shared by the integration tests and the benchmarks.

use sqlx::Connection;

/// A database created on a server; [`remove`](FreshPostgres::remove) drops it.
pub struct FreshPostgres {
    admin: String,
    name: String,
    /// The database's URL (the admin URL's, with the database's name and the same
    /// query parameters).
    pub url: String,
}

impl FreshPostgres {
    /// Creates a fresh database on the server `admin` (a URL whose user can create
    /// databases) names.
    pub async fn create(admin: &str) -> Result<Self, sqlx::Error> {
        let mut conn = sqlx::PgConnection::connect(admin).await?;
        let name = format!("rollout_test_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let (path, query) = admin.split_once('?').unwrap_or((admin, ""));
        let base = path.rsplit_once('/').map_or(path, |(b, _)| b);
        let url = if query.is_empty() {
            format!("{base}/{name}")
        } else {
            format!("{base}/{name}?{query}")
        };
        Ok(Self {
            admin: admin.to_string(),
            name,
            url,
        })
    }

    /// Drops the database, closing whatever is still connected to it (best effort: a
    /// failure leaves one stray database).
    pub async fn remove(self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
        }
    }

    /// [`remove`](FreshPostgres::remove) from synchronous code (a `Drop`), on a thread
    /// and runtime of its own, waiting until it is done.
    pub fn remove_blocking(self) {
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database")
                .block_on(self.remove());
        })
        .join();
    }
}
