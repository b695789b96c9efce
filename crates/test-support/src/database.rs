//! A database of its own for each test or benchmark measurement, so that nothing reads
//! what another left (a batch of the same name would already be done), made cheap by
//! copying one that is already migrated instead of migrating each from nothing.
//!
//! - **Postgres** (when `ROLLOUT_TEST_DATABASE_URL` names a server whose user may create
//!   databases): a template database is migrated once per run, by whichever test
//!   process gets there first under an advisory lock, and marked a template; each test
//!   then gets `CREATE DATABASE … TEMPLATE` of it, as crates.io's test pool does. The
//!   template's name carries the run (`ROLLOUT_TEST_RUN`, else `dev`) and a digest of
//!   the migrations, so a changed migration never meets an old template. The test
//!   command drops its run's template at the end; a developer's `dev` one is kept for
//!   the next run.
//! - **SQLite**: one migrated file per set of migrations under the temporary root,
//!   copied into each test's directory.
//!
//! The store opening a copy finds every migration applied and checks their checksums,
//! so a template that does not match the migrations compiled into the store fails the
//! test instead of passing on a wrong schema.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sqlx::migrate::Migrator;
use sqlx::{ConnectOptions, Connection};

/// The variable that names the Postgres server (an admin URL) the tests use.
pub const POSTGRES_VARIABLE: &str = "ROLLOUT_TEST_DATABASE_URL";

/// The Postgres migrations, the same files the store compiles in.
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../../migrations/postgres");
/// The SQLite migrations, the same files the store compiles in.
static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../../migrations/sqlite");

/// The admin URL of the Postgres server the tests use, if one is named.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var(POSTGRES_VARIABLE)
        .ok()
        .filter(|u| !u.is_empty())
}

/// The admin URL of the Postgres server, for a test that cannot run without one: when
/// none is named, the test (named after the harness's thread, else `what`) is reported
/// missing its prerequisite (a failure under `CI=true`) and the caller returns.
pub fn postgres_admin_url_or_skip(what: &str) -> Option<String> {
    let admin = postgres_admin_url();
    if admin.is_none() {
        let current = std::thread::current();
        crate::prerequisite::missing(
            current.name().unwrap_or(what),
            "ROLLOUT_TEST_DATABASE_URL names no Postgres server (scripts/test.sh sets it when one answers on 127.0.0.1:5432)",
        );
    }
    admin
}

/// A fresh database for one test: SQLite in the test's directory, or a new Postgres
/// database, dropped with this value.
pub struct TestDb {
    /// The database's URL.
    pub url: String,
    pg: Option<FreshPostgres>,
}

impl TestDb {
    /// Postgres when `ROLLOUT_TEST_DATABASE_URL` is set, else SQLite in `dir`: the
    /// suites that run on whichever database the run is for.
    pub async fn new(dir: &Path) -> TestDb {
        match postgres_admin_url() {
            Some(admin) => TestDb::postgres(&admin).await,
            None => TestDb::sqlite(dir),
        }
    }

    /// A migrated SQLite database in `dir` (the file `rollout.db`).
    pub fn sqlite(dir: &Path) -> TestDb {
        let path = dir.join("rollout.db");
        std::fs::copy(sqlite_template(), &path)
            .unwrap_or_else(|e| panic!("copy the migrated SQLite template to {path:?}: {e}"));
        TestDb {
            url: format!("sqlite://{}", path.display()),
            pg: None,
        }
    }

    /// A migrated database on the Postgres server `admin` names.
    pub async fn postgres(admin: &str) -> TestDb {
        let db = FreshPostgres::create(admin)
            .await
            .unwrap_or_else(|e| panic!("create a test database on the server at {admin}: {e}"));
        TestDb {
            url: db.url.clone(),
            pg: Some(db),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(db) = self.pg.take() {
            db.remove_blocking();
        }
    }
}

/// A migrated database created on a Postgres server from the run's template;
/// [`remove`](FreshPostgres::remove) drops it.
pub struct FreshPostgres {
    admin: String,
    name: String,
    /// The database's URL (the admin URL's, with the database's name and the same
    /// query parameters).
    pub url: String,
}

impl FreshPostgres {
    /// Creates a fresh, migrated database on the server `admin` (a URL whose user can
    /// create databases) names.
    pub async fn create(admin: &str) -> Result<Self, sqlx::Error> {
        let template = postgres_template(admin).await?;
        Self::create_from(admin, Some(&template)).await
    }

    /// Creates a fresh database with no tables on the server `admin` names: for a test
    /// that migrates it itself.
    pub async fn create_empty(admin: &str) -> Result<Self, sqlx::Error> {
        Self::create_from(admin, None).await
    }

    /// Creates the database, a copy of `template` if given.
    async fn create_from(admin: &str, template: Option<&str>) -> Result<Self, sqlx::Error> {
        let name = format!(
            "rollout_test_{}_{}",
            run_tag(),
            uuid::Uuid::now_v7().simple()
        );
        let copy = template
            .map(|t| format!(" TEMPLATE {t}"))
            .unwrap_or_default();
        let mut conn = sqlx::PgConnection::connect(admin).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}{copy}")))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(Self {
            admin: admin.to_string(),
            url: with_database(admin, &name),
            name,
        })
    }

    /// Drops the database, closing whatever is still connected to it (best effort: a
    /// failure leaves one stray database, which the test command's final check names).
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

/// `admin` with its database name replaced by `name`, query parameters kept.
fn with_database(admin: &str, name: &str) -> String {
    let (path, query) = admin.split_once('?').unwrap_or((admin, ""));
    let base = path.rsplit_once('/').map_or(path, |(b, _)| b);
    if query.is_empty() {
        format!("{base}/{name}")
    } else {
        format!("{base}/{name}?{query}")
    }
}

/// The run's tag in database names: `ROLLOUT_TEST_RUN` (the test command's run id) in
/// lower-case letters, digits and underscores, else `dev`.
pub fn run_tag() -> String {
    match std::env::var("ROLLOUT_TEST_RUN") {
        Ok(run) if !run.is_empty() => run
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(16)
            .collect(),
        _ => "dev".into(),
    }
}

/// A short digest of a set of migrations (their versions and checksums), naming the
/// templates made from it.
fn digest(migrator: &Migrator) -> String {
    let mut h = std::hash::DefaultHasher::new();
    for m in migrator.iter() {
        m.version.hash(&mut h);
        m.checksum.hash(&mut h);
    }
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// The name of the run's Postgres template on the server `admin` names, made (once per
/// run, whichever process comes first) if it does not exist yet.
async fn postgres_template(admin: &str) -> Result<String, sqlx::Error> {
    type Made = Arc<tokio::sync::OnceCell<String>>;
    static MADE: OnceLock<Mutex<Vec<(String, Made)>>> = OnceLock::new();
    let cell = {
        let mut made = MADE
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, cell)) = made.iter().find(|(a, _)| a == admin) {
            cell.clone()
        } else {
            let cell = Made::default();
            made.push((admin.to_string(), cell.clone()));
            cell
        }
    };
    cell.get_or_try_init(|| make_postgres_template(admin))
        .await
        .cloned()
}

/// Makes the template under an advisory lock on the admin database: a complete one
/// (marked `datistemplate`) is used as it is, a half-made one (its maker died) is
/// dropped and made again.
async fn make_postgres_template(admin: &str) -> Result<String, sqlx::Error> {
    let name = format!("rollout_tpl_{}_{}", run_tag(), digest(&POSTGRES_MIGRATIONS));
    let mut conn = sqlx::PgConnection::connect(admin).await?;
    sqlx::query("SELECT pg_advisory_lock(hashtext($1))")
        .bind(&name)
        .execute(&mut conn)
        .await?;
    let made = async {
        let state: Option<bool> =
            sqlx::query_scalar("SELECT datistemplate FROM pg_database WHERE datname = $1")
                .bind(&name)
                .fetch_optional(&mut conn)
                .await?;
        match state {
            Some(true) => return Ok(()),
            Some(false) => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE {name} WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await?;
            }
            None => {}
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let mut db = sqlx::PgConnection::connect(&with_database(admin, &name)).await?;
        POSTGRES_MIGRATIONS
            .run(&mut db)
            .await
            .map_err(|e| sqlx::Error::Migrate(Box::new(e)))?;
        db.close().await?;
        // Only a template nobody is connected to can be copied, and only a complete one
        // is marked as such.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} WITH IS_TEMPLATE true"
        )))
        .execute(&mut conn)
        .await?;
        Ok::<_, sqlx::Error>(())
    }
    .await;
    let _ = sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
        .bind(&name)
        .execute(&mut conn)
        .await;
    made.map(|()| name)
}

/// The migrated SQLite file this process's tests copy: made once per set of
/// migrations under the temporary root (written aside and renamed into place, so a
/// process never copies a half-made one).
fn sqlite_template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!(
            "rollout-test-sqlite-{}.db",
            digest(&SQLITE_MIGRATIONS)
        ));
        if !path.exists() {
            // On a thread and runtime of its own: the caller may be inside a runtime.
            let made = path.clone();
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime to migrate the SQLite template")
                    .block_on(make_sqlite_template(&made))
            })
            .join()
            .expect("the SQLite template's thread")
            .unwrap_or_else(|e| panic!("migrate the SQLite template at {path:?}: {e}"));
        }
        path
    })
}

/// Migrates a new SQLite file aside and renames it to `path`.
async fn make_sqlite_template(path: &Path) -> Result<(), sqlx::Error> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    let aside = path.with_extension(format!("{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&aside);
    let mut conn = SqliteConnectOptions::new()
        .filename(&aside)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Delete)
        .connect()
        .await?;
    SQLITE_MIGRATIONS
        .run(&mut conn)
        .await
        .map_err(|e| sqlx::Error::Migrate(Box::new(e)))?;
    conn.close().await?;
    std::fs::rename(&aside, path).map_err(sqlx::Error::Io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_name_replaces_the_admin_urls_and_keeps_its_parameters() {
        assert_eq!(
            with_database("postgres://u@h:5432/test", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(
            with_database("postgres://u@h/test?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }

    #[test]
    fn the_two_dialects_templates_are_named_apart_by_their_migrations() {
        assert_ne!(digest(&SQLITE_MIGRATIONS), digest(&POSTGRES_MIGRATIONS));
        assert_eq!(digest(&SQLITE_MIGRATIONS), digest(&SQLITE_MIGRATIONS));
    }
}
