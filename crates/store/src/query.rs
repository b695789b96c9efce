//! One statement API over both databases' connections.
//!
//! The store's method bodies are written once, generic over [`Conn`], and run on a
//! SQLite or a Postgres connection alike. sqlx's own generic API would need the same
//! long `where` clause (every bound type must encode on the database, every row decode)
//! repeated on every generic function; here the values a statement can bind are the
//! three column types both schemas use (text, 64-bit integers, doubles, each possibly
//! NULL), and each connection type turns them into its own arguments in one place.

use std::future::Future;

use sqlx::postgres::{PgConnection, PgRow};
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{Arguments, Database, Encode, FromRow, Postgres, Sqlite, Type};

/// One value bound to a statement parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arg<'a> {
    /// TEXT (NULL when `None`).
    Text(Option<&'a str>),
    /// BIGINT / INTEGER (NULL when `None`).
    Int(Option<i64>),
    /// DOUBLE PRECISION / REAL (NULL when `None`).
    Real(Option<f64>),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(Some(v))
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(Some(v))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(v: &'a Option<String>) -> Self {
        Arg::Text(v.as_deref())
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}

impl From<rollout_core::domain::EpochMs> for Arg<'_> {
    fn from(v: rollout_core::domain::EpochMs) -> Self {
        Arg::Int(Some(v.as_millis()))
    }
}

impl From<Option<rollout_core::domain::EpochMs>> for Arg<'_> {
    fn from(v: Option<rollout_core::domain::EpochMs>) -> Self {
        Arg::Int(v.map(rollout_core::domain::EpochMs::as_millis))
    }
}

impl From<f64> for Arg<'_> {
    fn from(v: f64) -> Self {
        Arg::Real(Some(v))
    }
}

impl From<Option<f64>> for Arg<'_> {
    fn from(v: Option<f64>) -> Self {
        Arg::Real(v)
    }
}

/// A row type both databases decode: the `sqlx::FromRow` derive over the shared column
/// types gives both impls.
pub(crate) trait FromRows:
    for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin + 'static
{
}

impl<T> FromRows for T where
    T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin + 'static
{
}

/// A statement and its bound values, built like sqlx's `query(..).bind(..)`.
#[derive(Debug, Clone)]
#[must_use = "a statement does nothing until it is run on a connection"]
pub(crate) struct Query<'a> {
    sql: &'static str,
    args: Vec<Arg<'a>>,
}

/// Starts a statement; its values are bound in `$1`, `$2`, … order.
pub(crate) fn query<'a>(sql: &'static str) -> Query<'a> {
    Query {
        sql,
        args: Vec::with_capacity(12),
    }
}

impl<'a> Query<'a> {
    /// Binds the next parameter.
    pub(crate) fn bind(mut self, value: impl Into<Arg<'a>>) -> Self {
        self.args.push(value.into());
        self
    }

    /// Runs the statement; returns how many rows it changed.
    pub(crate) async fn execute<C: Conn>(self, conn: &mut C) -> Result<u64, sqlx::Error> {
        conn.execute(self).await
    }

    /// Runs the statement and decodes its first row, if any.
    pub(crate) async fn fetch_optional<R: FromRows, C: Conn>(
        self,
        conn: &mut C,
    ) -> Result<Option<R>, sqlx::Error> {
        conn.fetch_optional(self).await
    }

    /// Runs the statement and decodes every row.
    pub(crate) async fn fetch_all<R: FromRows, C: Conn>(
        self,
        conn: &mut C,
    ) -> Result<Vec<R>, sqlx::Error> {
        conn.fetch_all(self).await
    }

    /// The bound values as `DB`'s arguments.
    fn arguments<DB: Database>(&self) -> Result<DB::Arguments, sqlx::Error>
    where
        for<'t> Option<&'t str>: Encode<'t, DB> + Type<DB>,
        for<'t> Option<i64>: Encode<'t, DB> + Type<DB>,
        for<'t> Option<f64>: Encode<'t, DB> + Type<DB>,
    {
        let mut out = DB::Arguments::default();
        for arg in &self.args {
            match *arg {
                Arg::Text(v) => out.add(v),
                Arg::Int(v) => out.add(v),
                Arg::Real(v) => out.add(v),
            }
            .map_err(sqlx::Error::Encode)?;
        }
        Ok(out)
    }
}

/// A database connection the store's statements run on.
pub(crate) trait Conn: Send {
    /// Runs `q`; returns how many rows it changed.
    fn execute(&mut self, q: Query<'_>) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    /// Runs `q` and decodes its first row, if any.
    fn fetch_optional<R: FromRows>(
        &mut self,
        q: Query<'_>,
    ) -> impl Future<Output = Result<Option<R>, sqlx::Error>> + Send;
    /// Runs `q` and decodes every row.
    fn fetch_all<R: FromRows>(
        &mut self,
        q: Query<'_>,
    ) -> impl Future<Output = Result<Vec<R>, sqlx::Error>> + Send;
}

impl Conn for SqliteConnection {
    async fn execute(&mut self, q: Query<'_>) -> Result<u64, sqlx::Error> {
        let args = q.arguments::<Sqlite>()?;
        let done = sqlx::query_with(q.sql, args).execute(self).await?;
        Ok(done.rows_affected())
    }

    async fn fetch_optional<R: FromRows>(
        &mut self,
        q: Query<'_>,
    ) -> Result<Option<R>, sqlx::Error> {
        let args = q.arguments::<Sqlite>()?;
        sqlx::query_as_with(q.sql, args).fetch_optional(self).await
    }

    async fn fetch_all<R: FromRows>(&mut self, q: Query<'_>) -> Result<Vec<R>, sqlx::Error> {
        let args = q.arguments::<Sqlite>()?;
        sqlx::query_as_with(q.sql, args).fetch_all(self).await
    }
}

impl Conn for PgConnection {
    async fn execute(&mut self, q: Query<'_>) -> Result<u64, sqlx::Error> {
        let args = q.arguments::<Postgres>()?;
        let done = sqlx::query_with(q.sql, args).execute(self).await?;
        Ok(done.rows_affected())
    }

    async fn fetch_optional<R: FromRows>(
        &mut self,
        q: Query<'_>,
    ) -> Result<Option<R>, sqlx::Error> {
        let args = q.arguments::<Postgres>()?;
        sqlx::query_as_with(q.sql, args).fetch_optional(self).await
    }

    async fn fetch_all<R: FromRows>(&mut self, q: Query<'_>) -> Result<Vec<R>, sqlx::Error> {
        let args = q.arguments::<Postgres>()?;
        sqlx::query_as_with(q.sql, args).fetch_all(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Connection;

    /// Every kind of value, NULL or not, round-trips through a real SQLite connection.
    #[tokio::test]
    async fn values_bind_and_rows_decode_on_sqlite() {
        let mut conn = SqliteConnection::connect("sqlite::memory:").await.unwrap();
        query("CREATE TABLE t (s TEXT, i INTEGER, r REAL)")
            .execute(&mut conn)
            .await
            .unwrap();
        let owned = Some("b".to_string());
        for (s, i, r) in [
            (Arg::from("a"), Arg::from(1i64), Arg::from(0.5f64)),
            (
                Arg::from(&owned),
                Arg::from(None::<i64>),
                Arg::from(None::<f64>),
            ),
            (
                Arg::from(None::<&str>),
                Arg::from(Some(3i64)),
                Arg::from(Some(2.0f64)),
            ),
        ] {
            let n = query("INSERT INTO t VALUES ($1, $2, $3)")
                .bind(s)
                .bind(i)
                .bind(r)
                .execute(&mut conn)
                .await
                .unwrap();
            assert_eq!(n, 1);
        }
        let rows: Vec<(Option<String>, Option<i64>, Option<f64>)> =
            query("SELECT s, i, r FROM t ORDER BY rowid")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        assert_eq!(
            rows,
            vec![
                (Some("a".into()), Some(1), Some(0.5)),
                (Some("b".into()), None, None),
                (None, Some(3), Some(2.0)),
            ]
        );
        let none: Option<(i64,)> = query("SELECT i FROM t WHERE s = $1")
            .bind("zzz")
            .fetch_optional(&mut conn)
            .await
            .unwrap();
        assert_eq!(none, None);
    }
}
