//! Bringing a database's schema up to date: its dialect's numbered migrations, then the
//! dashboard views, which are written once, in `migrations/views.sql`, instead of
//! restated in full by every migration that changes one.
//!
//! sqlx records a checksum of every migration it applied and refuses a database whose
//! applied migration was edited, so a migration, once released, stays as it is. Views
//! hold no data, so they need no history: the views file is their one definition, and
//! after the migrations (under the caller's setup lock) the store drops every view it
//! names and creates it again, in one transaction, whenever the file differs from the
//! text the views were last made from (kept in `managed_views`) or a migration ran with
//! them dropped.
//!
//! Migrations up to [`SQLITE_FOLDED_AT`] and [`POSTGRES_FOLDED_AT`] were written before
//! the views were folded: they create, replace and drop views themselves (some with a
//! bare `DROP VIEW`), so they run first, exactly as they always did. The views are
//! dropped before any later migration runs, so that one may alter or drop a column a
//! view reads (Postgres refuses that while a view depends on the column; SQLite refuses
//! a schema whose view names a missing column) as long as the views file stops reading
//! it in the same change. `migrations_after_the_fold_never_touch_a_view` holds later
//! migrations to that.

use std::future::Future;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;

use super::query::{Conn, query};
use super::{StoreError, StoreResult};

/// SQLite's migrations (`migrations/sqlite`).
pub(crate) static SQLITE: Migrator = sqlx::migrate!("../../migrations/sqlite");
/// Postgres's migrations (`migrations/postgres`).
pub(crate) static POSTGRES: Migrator = sqlx::migrate!("../../migrations/postgres");

/// The last SQLite migration that makes views itself.
pub(crate) const SQLITE_FOLDED_AT: i64 = 18;
/// The last Postgres migration that makes views itself.
pub(crate) const POSTGRES_FOLDED_AT: i64 = 20;

/// The dashboard views, the one definition both databases use.
pub(crate) const VIEWS: &str = include_str!("../../../migrations/views.sql");

/// A connection the migrations run on: a [`Conn`] sqlx can also migrate.
pub(crate) trait Migrating: Conn {
    /// Applies `migrator`'s pending migrations up to `target` (all with `None`).
    fn apply(
        &mut self,
        migrator: &Migrator,
        target: Option<i64>,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send;

    /// Runs `sql`, which may hold many statements and no parameters.
    fn run_script(&mut self, sql: String) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// The one body of [`Migrating`] for each connection type (sqlx's traits differ per
/// database only in their types).
macro_rules! migrating {
    ($($conn:ty),*) => {$(
        impl Migrating for $conn {
            async fn apply(
                &mut self,
                migrator: &Migrator,
                target: Option<i64>,
            ) -> Result<(), sqlx::migrate::MigrateError> {
                // What `run` and `run_to` call: they take an `Acquire`, whose lifetimes
                // make the future they return fail the `Send` check here.
                migrator.run_direct(target, self, false).await
            }

            async fn run_script(&mut self, sql: String) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(self).await?;
                Ok(())
            }
        }
    )*};
}

migrating!(SqliteConnection, PgConnection);

/// What a database is brought up to: its migrations, the last of them that makes views
/// itself, and the views' definition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schema<'a> {
    /// The dialect's migrations.
    pub(crate) migrator: &'a Migrator,
    /// The last migration that makes views itself.
    pub(crate) folded_at: i64,
    /// The views' definition (`CREATE VIEW` statements).
    pub(crate) views: &'a str,
}

impl Schema<'static> {
    /// SQLite's schema as this build knows it.
    pub(crate) const SQLITE: Schema<'static> = Schema {
        migrator: &SQLITE,
        folded_at: SQLITE_FOLDED_AT,
        views: VIEWS,
    };
    /// Postgres's schema as this build knows it.
    pub(crate) const POSTGRES: Schema<'static> = Schema {
        migrator: &POSTGRES,
        folded_at: POSTGRES_FOLDED_AT,
        views: VIEWS,
    };
}

impl Schema<'_> {
    /// Brings the database `conn` is connected to up to date. The caller holds the
    /// setup lock: nothing else migrates it meanwhile.
    pub(crate) async fn bring_up<C: Migrating>(&self, conn: &mut C) -> StoreResult<()> {
        conn.apply(self.migrator, Some(self.folded_at)).await?;
        let applied: Vec<(i64,)> = query("SELECT version FROM _sqlx_migrations")
            .fetch_all(conn)
            .await?;
        let later_pending = self
            .migrator
            .iter()
            .filter(|m| m.migration_type.is_up_migration() && m.version > self.folded_at)
            .any(|m| !applied.iter().any(|&(v,)| v == m.version));
        // `managed_views` is made by the first migration after the fold: it is there
        // when any later migration has been applied, and not before.
        let made = if applied.iter().any(|&(v,)| v > self.folded_at) {
            made_from(conn).await?
        } else {
            None
        };
        if later_pending {
            conn.run_script(self.drop_views(made.as_deref()))
                .await
                .map_err(StoreError::Views)?;
            conn.apply(self.migrator, None).await?;
        }
        if later_pending || made.as_deref() != Some(self.views) {
            self.remake_views(conn, made.as_deref()).await?;
        }
        Ok(())
    }

    /// Statements dropping the views the database may have: those the file names, and
    /// those the text it was `made` from names (a view the file no longer has).
    fn drop_views(&self, made: Option<&str>) -> String {
        let mut names = view_names(self.views);
        names.extend(made.map(view_names).unwrap_or_default());
        drop_views(&names)
    }

    /// Drops the views the database has (those `made` names and those the file names)
    /// and creates the file's, recording the text they were made from, in one
    /// transaction: a reader sees the old views or the new ones, never none.
    async fn remake_views<C: Migrating>(
        &self,
        conn: &mut C,
        made: Option<&str>,
    ) -> StoreResult<()> {
        conn.run_script("BEGIN".into()).await?;
        let done = async {
            conn.run_script(format!("{}\n{}", self.drop_views(made), self.views))
                .await
                .map_err(StoreError::Views)?;
            query("DELETE FROM managed_views").execute(conn).await?;
            query("INSERT INTO managed_views (definition, made_at) VALUES ($1, $2)")
                .bind(self.views)
                .bind(rollout_core::domain::EpochMs::now())
                .execute(conn)
                .await?;
            Ok::<_, StoreError>(())
        }
        .await;
        match done {
            Ok(()) => Ok(conn.run_script("COMMIT".into()).await?),
            Err(e) => {
                let _ = conn.run_script("ROLLBACK".into()).await;
                Err(e)
            }
        }
    }
}

/// The views' definition the database's views were last made from, if they were.
async fn made_from<C: Conn>(conn: &mut C) -> StoreResult<Option<String>> {
    let row: Option<(String,)> = query("SELECT definition FROM managed_views")
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(d,)| d))
}

/// The names of the views `sql` creates, in order.
pub(crate) fn view_names(sql: &str) -> Vec<&str> {
    sql.lines()
        .filter_map(|l| l.strip_prefix("CREATE VIEW "))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect()
}

/// Statements dropping the views `names`, where they exist, last made first.
fn drop_views(names: &[&str]) -> String {
    let mut seen = Vec::new();
    for n in names.iter().rev() {
        if !seen.contains(n) {
            seen.push(*n);
        }
    }
    seen.iter()
        .map(|n| format!("DROP VIEW IF EXISTS {n};\n"))
        .collect()
}

/// Checks run on both databases (see the `tests` modules here and in `postgres`).
#[cfg(test)]
pub(crate) mod checks {
    use std::borrow::Cow;

    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    use super::{Migrating, Schema, query};

    /// Whether the view `name` answers a query.
    async fn answers<C: Migrating>(conn: &mut C, name: &'static str) -> bool {
        let sql: &'static str = match name {
            "sandbox_counts" => "SELECT COUNT(*) FROM sandbox_counts",
            "batch_progress" => "SELECT COUNT(*) FROM batch_progress",
            "gone" => "SELECT COUNT(*) FROM gone",
            other => panic!("no probe for {other}"),
        };
        query(sql).fetch_all::<(i64,), _>(conn).await.is_ok()
    }

    /// The text of the views the database was last made from, and when.
    async fn made<C: Migrating>(conn: &mut C) -> (String, i64) {
        query("SELECT definition, made_at FROM managed_views")
            .fetch_optional(conn)
            .await
            .unwrap()
            .expect("a record of the views")
    }

    /// A database brought up to date is left as it is while the views file is the
    /// one its views were made from; a different file makes them again, dropping the
    /// views the old one made.
    pub(crate) async fn views_are_made_again_only_when_their_file_changed<C: Migrating>(
        conn: &mut C,
        schema: Schema<'_>,
    ) {
        schema.bring_up(conn).await.unwrap();
        assert_eq!(made(conn).await.0, schema.views);
        assert!(answers(conn, "batch_progress").await);
        query("UPDATE managed_views SET made_at = 0")
            .execute(conn)
            .await
            .unwrap();
        schema.bring_up(conn).await.unwrap();
        assert_eq!(made(conn).await.1, 0, "the same file: nothing made again");

        let old = "CREATE VIEW gone AS\nSELECT 1 AS one;\n";
        conn.run_script(old.into()).await.unwrap();
        query("UPDATE managed_views SET definition = $1")
            .bind(old)
            .execute(conn)
            .await
            .unwrap();
        assert!(answers(conn, "gone").await);
        schema.bring_up(conn).await.unwrap();
        let (text, at) = made(conn).await;
        assert_eq!(text, schema.views);
        assert!(at > 0, "made again");
        assert!(
            !answers(conn, "gone").await,
            "the old file's view is dropped"
        );
        assert!(answers(conn, "batch_progress").await);
    }

    /// A migration after the fold may drop a column a view reads, in the change that
    /// stops the views file reading it: the views are dropped while it runs. On a
    /// database whose views are there, the same statement fails (so this check can).
    pub(crate) async fn a_later_migration_may_drop_a_column_a_view_reads<C: Migrating>(
        conn: &mut C,
        base: Schema<'_>,
    ) {
        const DROP: &str = "ALTER TABLE sandboxes DROP COLUMN backend";
        base.bring_up(conn).await.unwrap();
        assert!(answers(conn, "sandbox_counts").await);
        let refused = conn.run_script(DROP.into()).await;
        assert!(refused.is_err(), "a view reads sandboxes.backend");

        let mut migrations: Vec<Migration> = base.migrator.iter().cloned().collect();
        let last = migrations.iter().map(|m| m.version).max().unwrap();
        migrations.push(Migration::new(
            last + 1,
            Cow::Borrowed("drop a column a view reads"),
            MigrationType::Simple,
            sqlx::AssertSqlSafe(DROP).into_sql_str(),
            false,
        ));
        let migrator = Migrator::with_migrations(migrations);
        let start = base.views.find("CREATE VIEW sandbox_counts AS").unwrap();
        let end = start + base.views[start..].find(";\n").unwrap() + 2;
        let views = format!("{}{}", &base.views[..start], &base.views[end..]);
        let changed = Schema {
            migrator: &migrator,
            folded_at: base.folded_at,
            views: &views,
        };
        changed.bring_up(conn).await.unwrap();
        assert!(!answers(conn, "sandbox_counts").await);
        assert!(answers(conn, "batch_progress").await);
        assert_eq!(made(conn).await.0, views);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file names every view once, each as a plain identifier.
    #[test]
    fn the_views_file_names_each_view_once() {
        let names = view_names(VIEWS);
        assert_eq!(names.len(), VIEWS.matches("CREATE VIEW").count());
        assert!(names.len() >= 12, "{names:?}");
        for (i, n) in names.iter().enumerate() {
            assert!(!names[..i].contains(n), "{n} twice");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{n}");
        }
    }

    /// Migrations written after the fold leave views to the views file: one that
    /// created or replaced a view would be overwritten by the file at once, and one
    /// that dropped a view would fail, since the views are gone while later
    /// migrations run.
    #[test]
    fn migrations_after_the_fold_never_touch_a_view() {
        for schema in [Schema::SQLITE, Schema::POSTGRES] {
            let mut last_with_view = 0;
            for m in schema.migrator.iter() {
                let statements: String = m
                    .sql
                    .as_str()
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("--"))
                    .map(|l| format!(" {} ", l.to_ascii_uppercase()))
                    .collect();
                if statements.contains(" VIEW ") {
                    last_with_view = m.version;
                }
            }
            // `bring_up` reads `managed_views` once any migration after the fold is in.
            let first_after = schema
                .migrator
                .iter()
                .find(|m| m.version > schema.folded_at);
            assert!(
                first_after.is_some_and(|m| m.sql.as_str().contains("CREATE TABLE managed_views")),
                "the first migration after the fold makes managed_views"
            );
            assert_eq!(
                last_with_view, schema.folded_at,
                "the last migration that touches a view must be the fold's; \
                 put view changes in migrations/views.sql"
            );
        }
    }

    /// The checks on a fresh SQLite file each.
    async fn on_sqlite<F, Fut>(check: F)
    where
        F: FnOnce(SqliteConnection) -> Fut,
        Fut: Future<Output = ()>,
    {
        use sqlx::Connection;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("m.db").display());
        check(SqliteConnection::connect(&url).await.unwrap()).await;
    }

    #[tokio::test]
    async fn sqlite_views_are_made_again_only_when_their_file_changed() {
        on_sqlite(|mut c| async move {
            checks::views_are_made_again_only_when_their_file_changed(&mut c, Schema::SQLITE).await;
        })
        .await;
    }

    #[tokio::test]
    async fn sqlite_a_later_migration_may_drop_a_column_a_view_reads() {
        on_sqlite(|mut c| async move {
            checks::a_later_migration_may_drop_a_column_a_view_reads(&mut c, Schema::SQLITE).await;
        })
        .await;
    }

    /// The checks on a fresh Postgres database each (skipped without a server, failing
    /// under `CI`).
    async fn on_postgres<F, Fut>(check: F)
    where
        F: FnOnce(PgConnection) -> Fut,
        Fut: Future<Output = ()>,
    {
        use sqlx::Connection;
        let Some(unit) = crate::postgres::UnitDb::create().await else {
            return;
        };
        check(PgConnection::connect(&unit.url).await.unwrap()).await;
        unit.remove().await;
    }

    #[tokio::test]
    async fn postgres_views_are_made_again_only_when_their_file_changed() {
        on_postgres(|mut c| async move {
            checks::views_are_made_again_only_when_their_file_changed(&mut c, Schema::POSTGRES)
                .await;
        })
        .await;
    }

    #[tokio::test]
    async fn postgres_a_later_migration_may_drop_a_column_a_view_reads() {
        on_postgres(|mut c| async move {
            checks::a_later_migration_may_drop_a_column_a_view_reads(&mut c, Schema::POSTGRES)
                .await;
        })
        .await;
    }

    /// Dropping goes in reverse order of making and names each view once.
    #[test]
    fn views_are_dropped_last_made_first_and_once() {
        assert_eq!(
            drop_views(&["a", "b", "a", "c"]),
            "DROP VIEW IF EXISTS c;\nDROP VIEW IF EXISTS a;\nDROP VIEW IF EXISTS b;\n"
        );
    }
}
