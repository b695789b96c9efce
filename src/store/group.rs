//! Group commit: writes queued by many tasks run together, in one transaction, on one
//! writer task.
//!
//! A commit (a WAL append and its flush) costs far more than the statements in it. When
//! writes must take turns anyway — SQLite has one writer; on Postgres, job ends take
//! turns under the result-ordering lock — one transaction per write makes the commit the
//! ceiling on throughput. A [`GroupWriter`] instead runs whatever has queued up (one
//! write alone, or hundreds under load) inside one transaction, each write under a
//! savepoint of its own where it needs one (so one write's error undoes only that
//! write), commits once, and only then answers every caller. Callers see exactly the
//! semantics of one transaction per write: a reply means the write is durable, and an
//! error means nothing of it was applied.

use std::future::Future;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::query::{Conn, query};
use super::{StoreError, StoreResult};

/// Most writes committed together.
const MAX_GROUP: usize = 512;

/// Hands a write's result (or its group's commit error) back to its caller.
type Deliver = Box<dyn FnOnce(Option<&str>) + Send>;

/// Runs a queued write and yields whether it succeeded and how to answer its caller.
/// Called without a connection (its group could not start, or broke before reaching
/// it) it only yields its `Deliver`.
type RunOp<C> = Box<dyn for<'c> FnOnce(Option<&'c mut C>) -> BoxFuture<'c, (bool, Deliver)> + Send>;

/// A queued write, and whether it needs a savepoint of its own.
struct Op<C> {
    atomic: bool,
    run: RunOp<C>,
}

/// How a writer opens, commits and abandons its group's transaction.
pub(super) trait Txn: Send + 'static {
    /// The connection the writes run on.
    type Conn: Conn + 'static;
    /// Whether one failed statement aborts the whole transaction (Postgres), so that
    /// every write needs a savepoint, not only those of several statements (SQLite
    /// undoes a failed statement by itself).
    const SAVEPOINT_EVERY_WRITE: bool;
    /// Opens a transaction (and takes whatever it must hold while its writes run).
    fn begin(&mut self) -> impl Future<Output = Result<(), String>> + Send;
    /// The open transaction's connection; called only between a successful
    /// [`begin`](Txn::begin) and the matching commit or rollback.
    fn conn(&mut self) -> &mut Self::Conn;
    /// Commits the open transaction.
    fn commit(&mut self) -> impl Future<Output = Result<(), String>> + Send;
    /// Abandons the open transaction, if any, after a failure.
    fn rollback(&mut self) -> impl Future<Output = ()> + Send;
}

/// The queue of a writer task that commits writes in groups. Cloning it shares the task.
pub(super) struct GroupWriter<C> {
    ops: mpsc::Sender<Op<C>>,
}

impl<C> Clone for GroupWriter<C> {
    fn clone(&self) -> Self {
        Self {
            ops: self.ops.clone(),
        }
    }
}

impl<C> std::fmt::Debug for GroupWriter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupWriter").finish_non_exhaustive()
    }
}

impl<C: Conn + 'static> GroupWriter<C> {
    /// Starts the writer task over `txn`; it runs until every clone of the returned
    /// queue is dropped.
    pub(super) fn start<T: Txn<Conn = C>>(txn: T, what: &'static str) -> Self {
        let (ops, rx) = mpsc::channel(4 * MAX_GROUP);
        tokio::spawn(run_writer(txn, rx, what));
        Self { ops }
    }

    /// Queues `op` (under a savepoint of its own when `atomic`) and waits until its group
    /// is committed.
    pub(super) async fn write<T, F>(&self, atomic: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<StoreResult<T>>();
        let run: RunOp<C> = Box::new(move |conn| {
            Box::pin(async move {
                let result = match conn {
                    Some(conn) => op(conn).await,
                    None => Err(StoreError::Batch("not run".into())),
                };
                let ok = result.is_ok();
                let deliver: Deliver = Box::new(move |group_error| {
                    let _ = tx.send(match group_error {
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

/// Runs one of a writer's own statements (`BEGIN`, `SAVEPOINT`, `COMMIT`, …).
pub(super) async fn exec<C: Conn>(conn: &mut C, statement: &'static str) -> Result<(), String> {
    conn.execute(query(statement))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Runs `op` on the open transaction, under a savepoint when it needs one; an error
/// means the transaction itself is broken (not that the op failed: its own error goes
/// to its caller through the returned `Deliver`).
async fn run_one<T: Txn>(txn: &mut T, op: Op<T::Conn>) -> (Deliver, Result<(), String>) {
    let savepoint = op.atomic || T::SAVEPOINT_EVERY_WRITE;
    if savepoint && let Err(e) = exec(txn.conn(), "SAVEPOINT op").await {
        return ((op.run)(None).await.1, Err(e));
    }
    let (ok, deliver) = (op.run)(Some(txn.conn())).await;
    if !savepoint {
        return (deliver, Ok(()));
    }
    let conn = txn.conn();
    let end = if ok {
        exec(conn, "RELEASE SAVEPOINT op").await
    } else {
        match exec(conn, "ROLLBACK TO SAVEPOINT op").await {
            Ok(()) => exec(conn, "RELEASE SAVEPOINT op").await,
            Err(e) => Err(e),
        }
    };
    (deliver, end)
}

/// The writer task: commits queued writes in groups until every sender is gone.
async fn run_writer<T: Txn>(mut txn: T, mut rx: mpsc::Receiver<Op<T::Conn>>, what: &'static str) {
    let mut group: Vec<Op<T::Conn>> = Vec::with_capacity(MAX_GROUP);
    while let Some(op) = rx.recv().await {
        group.push(op);
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) => group.push(op),
                Err(_) => break,
            }
        }
        let mut failed = txn.begin().await.err();
        let began = failed.is_none();
        let mut delivers = Vec::with_capacity(group.len());
        for op in group.drain(..) {
            if failed.is_some() {
                delivers.push((op.run)(None).await.1);
                continue;
            }
            let (deliver, broken) = run_one(&mut txn, op).await;
            delivers.push(deliver);
            failed = broken.err();
        }
        if failed.is_none()
            && let Err(e) = txn.commit().await
        {
            failed = Some(e);
        }
        if let Some(e) = &failed {
            tracing::error!(error = %e, writes = delivers.len(), "{what}: a group of writes failed; each is reported failed to its caller");
            if began {
                txn.rollback().await;
            }
        }
        for deliver in delivers {
            deliver(failed.as_deref());
        }
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    use super::*;

    /// What each of the writes queued by [`one_group_of_mixed_writes`] should come to.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Kind {
        /// One statement that applies.
        Good,
        /// One statement the database refuses (a NULL in a NOT NULL column).
        Refused,
        /// Two statements, the second refused (a duplicate key): the first must be undone.
        HalfDone,
    }

    fn kind(i: i64) -> Kind {
        match i % 3 {
            0 => Kind::Good,
            1 => Kind::Refused,
            _ => Kind::HalfDone,
        }
    }

    /// Holds the writer on a first write until `n` more are queued, so they are all in
    /// the next group, then checks that each write came out as if it had had a
    /// transaction of its own: refused ones fail alone, the others apply, and no half of
    /// a write remains.
    async fn one_group_of_mixed_writes<C: Conn + 'static>(writer: GroupWriter<C>) -> Vec<i64> {
        const N: i64 = 60;
        let (release, held) = oneshot::channel::<()>();
        let (running, started) = oneshot::channel::<()>();
        let first = {
            let w = writer.clone();
            tokio::spawn(async move {
                w.write(false, move |_conn: &mut C| {
                    Box::pin(async move {
                        let _ = running.send(());
                        let _ = held.await;
                        Ok(())
                    })
                })
                .await
            })
        };
        // The first write's group has been gathered: the writes below queue behind it.
        started.await.unwrap();
        let writes: Vec<_> = (0..N)
            .map(|i| {
                let w = writer.clone();
                tokio::spawn(async move {
                    let k = kind(i);
                    w.write(k == Kind::HalfDone, move |conn: &mut C| {
                        Box::pin(async move {
                            let v = (k != Kind::Refused).then(|| format!("v{i}"));
                            let insert = "INSERT INTO group_test (id, v) VALUES ($1, $2)";
                            conn.execute(query(insert).bind(i).bind(&v)).await?;
                            if k == Kind::HalfDone {
                                conn.execute(query(insert).bind(i).bind(&v)).await?;
                            }
                            Ok(())
                        })
                    })
                    .await
                })
            })
            .collect();
        // Then wait until all of them are queued, so that they make one group.
        while writer.ops.max_capacity() - writer.ops.capacity() < usize::try_from(N).unwrap() {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        let mut applied = Vec::new();
        for (i, w) in (0..N).zip(writes) {
            match (kind(i), w.await.unwrap()) {
                (Kind::Good, Ok(())) => applied.push(i),
                (Kind::Refused | Kind::HalfDone, Err(e)) => {
                    assert!(e.is_rejected(), "write {i} failed for another reason: {e}");
                }
                (k, r) => panic!("write {i} ({k:?}) came to {r:?}"),
            }
        }
        applied
    }

    fn expected() -> Vec<i64> {
        (0..60).filter(|i| kind(*i) == Kind::Good).collect()
    }

    #[tokio::test]
    async fn sqlite_writes_in_one_group_fail_alone() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE group_test (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&mut conn)
            .await
            .unwrap();
        let writer = GroupWriter::start(super::super::sqlite::WriterConn(conn), "test");
        let applied = one_group_of_mixed_writes(writer.clone()).await;
        assert_eq!(applied, expected());
        let stored: Vec<i64> = writer
            .write(false, |conn: &mut sqlx::SqliteConnection| {
                Box::pin(async move {
                    let rows: Vec<(i64,)> = conn
                        .fetch_all(query("SELECT id FROM group_test ORDER BY id"))
                        .await?;
                    Ok(rows.into_iter().map(|r| r.0).collect())
                })
            })
            .await
            .unwrap();
        assert_eq!(stored, expected());
    }

    /// On Postgres a refused statement aborts the whole transaction: without a
    /// savepoint per write, every write after the first refused one would fail too.
    /// Runs when `ROLLOUT_TEST_DATABASE_URL` names a server, in a database of its own.
    #[tokio::test]
    async fn postgres_writes_in_one_group_fail_alone() {
        let Some(unit) = super::super::postgres::UnitDb::create().await else {
            return;
        };
        let pool = sqlx::PgPool::connect(&unit.url).await.unwrap();
        sqlx::query("CREATE TABLE group_test (id BIGINT PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let writer = GroupWriter::start(
            super::super::postgres::ResultsTxn::new(pool.clone()),
            "test",
        );
        let applied = one_group_of_mixed_writes(writer).await;
        let stored: Vec<(i64,)> = sqlx::query_as("SELECT id FROM group_test ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        unit.remove().await;
        assert_eq!(applied, expected());
        assert_eq!(
            stored.into_iter().map(|r| r.0).collect::<Vec<_>>(),
            expected()
        );
    }
}
