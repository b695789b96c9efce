//! SQLite's [`Dialect`]: the embedded default for one machine.
//!
//! WAL lets readers run beside the one writer; `synchronous = NORMAL` is durable across
//! process crashes (only an OS crash can lose the last commits); a 30 s busy timeout
//! absorbs lock waits between processes sharing the file; every writing transaction
//! starts with `BEGIN IMMEDIATE`, because a deferred transaction that reads and then
//! writes can fail with `SQLITE_BUSY` at once, without waiting for the busy timeout.
//!
//! **Group commit.** Writes do not take a pooled connection each: they go to one
//! [`GroupWriter`] that owns the one writing connection and commits whatever has queued
//! up in one transaction. Several writing connections would take turns sleeping in
//! SQLite's busy handler while the lock sat free, and pay a commit each; one writer
//! committing groups does neither, so throughput grows with load while a write alone
//! still commits at once.

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Sqlite, SqlitePool};

use super::dialect::Dialect;
use super::group::{GroupWriter, Txn, exec};
use super::query::query;
use super::{StoreError, StoreResult, sql};
use crate::domain::EpochMs;

/// Result sequence numbers waiting to be marked published, and whether a flush op is
/// already queued for them.
#[derive(Debug, Default)]
struct PendingMarks {
    seqs: Vec<i64>,
    flush_queued: bool,
}

/// A SQLite file: readers on a pool, writes through the group-commit writer.
#[derive(Debug, Clone)]
pub(crate) struct SqliteDb {
    /// Readers.
    pool: SqlitePool,
    /// The group-commit writer, which owns the one writing connection.
    writer: GroupWriter<SqliteConnection>,
    opts: SqliteConnectOptions,
    /// Marks are coalesced: every result would otherwise cost a statement of its own.
    marks: Arc<Mutex<PendingMarks>>,
}

impl SqliteDb {
    const MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

    /// Opens (creating if missing, with its directory) the database at `url`.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let opts = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(true);
        if let Some(dir) = opts.get_filename().parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(sqlx::Error::Io)?;
        }
        // Switching a fresh file to WAL takes an exclusive lock that SQLite does not wait
        // for, so processes opening it together take turns.
        let lock = setup_lock(&opts).await?;
        let writer = opts.connect().await?;
        // A local file connection cannot break the way a network one can, so the ping
        // sqlx runs on every acquire by default (which costs more than a typical
        // statement here) buys nothing.
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .test_before_acquire(false)
            .connect_with(opts.clone())
            .await?;
        drop(lock);
        let writer = GroupWriter::start(WriterConn(writer), "SQLite");
        Ok(Self {
            pool,
            writer,
            opts,
            marks: Arc::default(),
        })
    }

    /// Applies the migrations under the setup lock (see [`setup_lock`]): sqlx does not
    /// lock SQLite migrations, so processes started together on a fresh database (a
    /// Slurm array, `docker compose up`) would each apply the first migration and all
    /// but one would fail.
    async fn run_migrations(&self) -> StoreResult<()> {
        let _lock = setup_lock(&self.opts).await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(self.opts.clone())
            .await?;
        Self::MIGRATOR.run(&pool).await?;
        pool.close().await;
        Ok(())
    }
}

impl Dialect for SqliteDb {
    type Conn = SqliteConnection;
    type Reader = PoolConnection<Sqlite>;

    const FINISH: &'static str = sql::FINISH_SQLITE;
    const FINISH_BARE: &'static str = sql::FINISH_BARE_SQLITE;

    async fn migrate(&self) -> StoreResult<()> {
        self.run_migrations().await
    }

    async fn reader(&self) -> StoreResult<PoolConnection<Sqlite>> {
        Ok(self.pool.acquire().await?)
    }

    async fn write<T, F>(&self, atomic: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, StoreResult<T>>
            + Send
            + 'static,
    {
        self.writer.write(atomic, op).await
    }

    /// Like any other write: SQLite has one writer at a time, so AUTOINCREMENT values
    /// are already handed out in commit order.
    async fn write_result<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, StoreResult<T>>
            + Send
            + 'static,
    {
        self.writer.write(true, op).await
    }

    /// The single writer already runs one assignment at a time.
    async fn lock_pool(_conn: &mut SqliteConnection) -> StoreResult<()> {
        Ok(())
    }

    async fn lock_batch(_conn: &mut SqliteConnection, _batch_id: &str) -> StoreResult<()> {
        Ok(())
    }

    /// Adds `seqs` to the pending marks and makes sure one flush op is queued; the op
    /// takes every mark pending when the writer reaches it and sets them in one
    /// statement. Returns at once: a mark lost to a crash only makes the reconciler
    /// publish that result again (deduplicated by the server within its duplicate
    /// window; a trainer may see it twice after that, with the same `seq`).
    async fn mark_published(&self, seqs: &[i64], _now: EpochMs) -> StoreResult<()> {
        let queue_flush = {
            let mut m = self.marks.lock().expect("marks lock");
            m.seqs.extend_from_slice(seqs);
            !std::mem::replace(&mut m.flush_queued, true)
        };
        if queue_flush {
            let store = self.clone();
            tokio::spawn(async move {
                let marks = store.marks.clone();
                let r = store
                    .writer
                    .write(false, move |conn: &mut SqliteConnection| {
                        Box::pin(async move {
                            let seqs = {
                                let mut m = marks.lock().expect("marks lock");
                                m.flush_queued = false;
                                std::mem::take(&mut m.seqs)
                            };
                            let seqs = serde_json::to_string(&seqs).expect("numbers serialise");
                            query(sql::MARK_PUBLISHED_SQLITE)
                                .bind(EpochMs::now())
                                .bind(&seqs)
                                .execute(conn)
                                .await?;
                            Ok(())
                        })
                    })
                    .await;
                if let Err(e) = r {
                    // If the op never ran, its marks are still pending: let the next mark
                    // queue a new flush for them.
                    store.marks.lock().expect("marks lock").flush_queued = false;
                    tracing::warn!(error = %e, "cannot mark results published; will retry with the next mark");
                }
            });
        }
        Ok(())
    }
}

/// The writer's one connection; every group starts with `BEGIN IMMEDIATE` (see the
/// module's documentation).
pub(super) struct WriterConn(pub(super) SqliteConnection);

impl Txn for WriterConn {
    type Conn = SqliteConnection;
    const SAVEPOINT_EVERY_WRITE: bool = false;

    async fn begin(&mut self) -> Result<(), String> {
        exec(&mut self.0, "BEGIN IMMEDIATE").await
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.0
    }

    async fn commit(&mut self) -> Result<(), String> {
        exec(&mut self.0, "COMMIT").await
    }

    async fn rollback(&mut self) {
        let _ = exec(&mut self.0, "ROLLBACK").await;
    }
}

/// An exclusive lock on `<database>.setup-lock`, held while a process opens the
/// database and while it migrates it, so processes starting together on one file take
/// turns; `None` for an in-memory database. The lock file stays (an empty file).
async fn setup_lock(
    opts: &SqliteConnectOptions,
) -> StoreResult<Option<nix::fcntl::Flock<std::fs::File>>> {
    let file = opts.get_filename();
    if file.as_os_str().is_empty() || file == Path::new(":memory:") {
        return Ok(None);
    }
    let mut path = file.as_os_str().to_os_string();
    path.push(".setup-lock");
    let path = std::path::PathBuf::from(path);
    let lock = tokio::task::spawn_blocking(move || lock_file(&path))
        .await
        .map_err(|e| StoreError::Batch(format!("the database setup lock's task failed: {e}")))?
        .map_err(sqlx::Error::Io)?;
    Ok(Some(lock))
}

/// Opens (creating) `path` and takes an exclusive `flock` on it, waiting for any holder;
/// released when the returned value is dropped (or the process dies).
fn lock_file(path: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::other(format!("cannot lock {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Six processes' worth of stores opening one fresh database at once, five times:
    /// every one migrates (without the lock, most trials lost some to `table … already
    /// exists`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn stores_started_together_on_a_fresh_database_all_migrate() {
        for trial in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("r.db").display());
            let starts: Vec<_> = (0..6)
                .map(|_| {
                    let url = url.clone();
                    tokio::spawn(async move {
                        let db = SqliteDb::connect(&url, 2).await?;
                        db.migrate().await
                    })
                })
                .collect();
            for s in starts {
                s.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("trial {trial}: {e}"));
            }
        }
    }
}
