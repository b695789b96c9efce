//! SQLite's [`Dialect`]: the embedded default for one machine.
//!
//! WAL lets readers run beside the one writer; `synchronous = NORMAL` is durable across
//! process crashes (only an OS crash can lose the last commits); a 30 s busy timeout
//! absorbs lock waits between processes sharing the file; every writing transaction
//! starts with `BEGIN IMMEDIATE`, because a deferred transaction that reads and then
//! writes can fail with `SQLITE_BUSY` at once, without waiting for the busy timeout.
//!
//! **Group commit.** Writes do not take a pooled connection each. They are queued to a
//! single writer task that owns the one writing connection and runs whatever has queued
//! up — one op, or hundreds under load — inside one transaction, each multi-statement op
//! under its own savepoint (so one op's error undoes only that op; a single statement
//! that fails is undone by SQLite itself), then commits once and only then
//! answers every caller. A commit (a WAL append) costs far more here than the statements
//! in it, and several writing connections would take turns sleeping in SQLite's busy
//! handler while the lock sat free; one writer committing batches does neither, so
//! throughput grows with load while an op alone still commits at once. Callers see
//! exactly the semantics of one transaction per op: a reply means the op is durable.

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
use tokio::sync::{mpsc, oneshot};

use super::dialect::Dialect;
use super::query::query;
use super::{StoreError, StoreResult, sql};
use crate::domain::EpochMs;

/// Most ops committed together.
const MAX_BATCH: usize = 512;

/// Hands an op's result (or the batch's commit error) back to its caller.
type Deliver = Box<dyn FnOnce(Option<&str>) + Send>;

/// Runs a queued write and yields whether it succeeded and how to answer its caller.
/// Called with `run = false` it does not touch the connection (the batch could not
/// start) and only yields its `Deliver`.
type RunOp = Box<
    dyn for<'c> FnOnce(&'c mut SqliteConnection, bool) -> BoxFuture<'c, (bool, Deliver)> + Send,
>;

/// A queued write, and whether it needs a savepoint of its own.
struct Op {
    atomic: bool,
    run: RunOp,
}

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
    /// The writer task's queue.
    ops: mpsc::Sender<Op>,
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
        let (ops, rx) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(run_writer(writer, rx));
        Ok(Self {
            pool,
            ops,
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

    /// Queues `op` for the writer (under a savepoint of its own when `atomic`) and
    /// waits until its batch is committed.
    async fn queue<T, F>(&self, atomic: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, StoreResult<T>>
            + Send
            + 'static,
    {
        let (tx, rx) = oneshot::channel::<StoreResult<T>>();
        let run: RunOp = Box::new(move |conn, run| {
            Box::pin(async move {
                let result = if run {
                    op(conn).await
                } else {
                    Err(StoreError::Corrupt("not run".into()))
                };
                let ok = result.is_ok();
                let deliver: Deliver = Box::new(move |batch_error| {
                    let _ = tx.send(match batch_error {
                        None => result,
                        Some(e) => Err(StoreError::Batch(e.to_string())),
                    });
                });
                (ok, deliver)
            })
        });
        self.ops
            .send(Op { atomic, run })
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
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
        self.queue(atomic, op).await
    }

    /// SQLite has one writer at a time, so AUTOINCREMENT values are already handed out
    /// in commit order.
    async fn order_results(_conn: &mut SqliteConnection) -> StoreResult<()> {
        Ok(())
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
                    .queue(false, move |conn: &mut SqliteConnection| {
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

/// Runs one of the writer's own statements (`BEGIN`, `SAVEPOINT`, `COMMIT`, …).
async fn exec(conn: &mut SqliteConnection, statement: &'static str) -> Result<(), String> {
    sqlx::query(statement)
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The writer task: commits queued ops in batches until every sender is gone.
async fn run_writer(mut conn: SqliteConnection, mut rx: mpsc::Receiver<Op>) {
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    while let Some(op) = rx.recv().await {
        batch.push(op);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut failed = exec(&mut conn, "BEGIN IMMEDIATE").await.err();
        let began = failed.is_none();
        let mut delivers = Vec::with_capacity(batch.len());
        for op in batch.drain(..) {
            if failed.is_none()
                && op.atomic
                && let Err(e) = exec(&mut conn, "SAVEPOINT op").await
            {
                failed = Some(e);
            }
            if failed.is_some() {
                delivers.push((op.run)(&mut conn, false).await.1);
                continue;
            }
            let (ok, deliver) = (op.run)(&mut conn, true).await;
            delivers.push(deliver);
            if !op.atomic {
                continue;
            }
            let end = if ok {
                exec(&mut conn, "RELEASE op").await
            } else {
                match exec(&mut conn, "ROLLBACK TO op").await {
                    Ok(()) => exec(&mut conn, "RELEASE op").await,
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = end {
                failed = Some(e);
            }
        }
        if failed.is_none()
            && let Err(e) = exec(&mut conn, "COMMIT").await
        {
            failed = Some(e);
        }
        if let Some(e) = &failed {
            tracing::error!(error = %e, ops = delivers.len(), "SQLite write batch failed; its ops are reported as failed");
            if began {
                let _ = exec(&mut conn, "ROLLBACK").await;
            }
        }
        for deliver in delivers {
            deliver(failed.as_deref());
        }
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
