//! A database of its own for a benchmark on a shared Postgres server, so that no run
//! reads what an earlier one left (a batch of the same name would already be done).

use sqlx::Connection;

/// A database created for one measurement; [`drop`](FreshPostgres::drop) removes it.
pub struct FreshPostgres {
    admin: String,
    name: String,
    /// The database's URL.
    pub url: String,
}

impl FreshPostgres {
    /// Creates a fresh database on the server `admin` (a URL that can create databases)
    /// names; `None` when that server does not answer or refuses.
    pub async fn create(admin: &str) -> Option<Self> {
        let mut conn = sqlx::PgConnection::connect(admin).await.ok()?;
        let name = format!("rollout_bench_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .ok()?;
        let base = admin.split('?').next().unwrap_or(admin);
        let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
        Some(Self {
            admin: admin.to_string(),
            url: format!("{base}/{name}"),
            name,
        })
    }

    /// Drops the database (best effort: a failure leaves one stray database).
    pub async fn drop(self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
        }
    }
}
