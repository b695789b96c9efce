//! The SQLite backend: the embedded default for one machine.
//!
//! WAL lets readers run beside the one writer; `synchronous = NORMAL` is durable across
//! process crashes (only an OS crash can lose the last commits); a 30 s busy timeout
//! absorbs writer contention between processes; and every transaction that writes starts
//! with `BEGIN IMMEDIATE`, because a deferred transaction that reads and then writes can
//! fail with `SQLITE_BUSY` at once, without waiting for the busy timeout.
//!
//! Writes go through a pool of a single connection and reads through a separate pool.
//! SQLite admits one writer at a time anyway; with several writing connections in one
//! process, the losers of each lock race sleep in SQLite's busy handler (milliseconds at
//! a time) while the lock sits free, which caps throughput at a few hundred jobs per
//! second. Queueing writers on the pool instead keeps the one writer busy. Other
//! processes on the same file still coordinate through the busy timeout.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::{StoreResult, impl_store};

/// A [`Store`](super::Store) over a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Readers.
    pool: SqlitePool,
    /// The one writing connection.
    writer: SqlitePool,
}

impl SqliteStore {
    const MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

    /// Opens (creating if missing, with its directory) the database at `url`.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
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
        // A local file connection cannot break the way a network one can, so the ping
        // sqlx runs on every acquire by default (which costs more than a typical
        // statement here) buys nothing.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(opts.clone())
            .await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .test_before_acquire(false)
            .connect_with(opts)
            .await?;
        Ok(Self { pool, writer })
    }

    fn writer(&self) -> &SqlitePool {
        &self.writer
    }

    async fn write_tx(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// SQLite has one writer at a time, so AUTOINCREMENT values are already handed out
    /// in commit order.
    async fn order_results(_tx: &mut Transaction<'static, Sqlite>) -> StoreResult<()> {
        Ok(())
    }
}

impl_store!(SqliteStore, Sqlite);
