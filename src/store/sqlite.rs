//! The SQLite backend: the embedded default for one machine.
//!
//! WAL lets readers run beside the one writer; `synchronous = NORMAL` is durable across
//! process crashes (only an OS crash can lose the last commits); a 30 s busy timeout
//! absorbs writer contention between processes; and every transaction that writes starts
//! with `BEGIN IMMEDIATE`, because a deferred transaction that reads and then writes can
//! fail with `SQLITE_BUSY` at once, without waiting for the busy timeout.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::{StoreResult, impl_store};

/// A [`Store`](super::Store) over a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
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
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .connect_with(opts)
            .await?;
        Ok(Self { pool })
    }

    async fn write_tx(&self) -> StoreResult<Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// SQLite has one writer at a time, so AUTOINCREMENT values are already handed out
    /// in commit order.
    async fn order_results(_tx: &mut Transaction<'static, Sqlite>) -> StoreResult<()> {
        Ok(())
    }
}

impl_store!(SqliteStore, Sqlite);
