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
//!
//! On Postgres, where a failed statement aborts the transaction, every write would need
//! a savepoint; writes queued as repeatable ones (job ends) skip them while nothing
//! fails, and a group with a failure is rolled back and run again under savepoints
//! (see [`run_group`]).
//!
//! A write that panics (a bug in its code) fails its group as an error would, and the
//! writer task goes on with the next group.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use crate::query::{Conn, query};
use crate::{StoreError, StoreResult};

/// Most writes committed together.
const MAX_GROUP: usize = 512;

/// A queued write: it runs on the writer's connection, keeps its result, and answers its
/// caller once, when its group is over.
trait Op<C>: Send {
    /// Whether the write runs several statements that must apply all or nothing (it
    /// needs a savepoint where a group's writes are isolated by savepoints).
    fn atomic(&self) -> bool;
    /// Whether the write can run again after a run of it was rolled back.
    fn repeatable(&self) -> bool;
    /// Runs the write and keeps its result; true if it succeeded. A repeatable write's
    /// later run replaces the result of its earlier one.
    fn run<'c>(&'c mut self, conn: &'c mut C) -> BoxFuture<'c, bool>;
    /// Answers the caller: the error of its group if the group did not commit,
    /// otherwise the write's own result.
    fn answer(self: Box<Self>, group_error: Option<&str>);
}

/// A write and what it came to so far.
struct Queued<T, F> {
    op: F,
    atomic: bool,
    repeatable: bool,
    result: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<C, T, F> Op<C> for Queued<T, F>
where
    C: Conn,
    T: Send + 'static,
    F: for<'c> FnMut(&'c mut C) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
{
    fn atomic(&self) -> bool {
        self.atomic
    }

    fn repeatable(&self) -> bool {
        self.repeatable
    }

    fn run<'c>(&'c mut self, conn: &'c mut C) -> BoxFuture<'c, bool> {
        Box::pin(async move {
            let result = (self.op)(conn).await;
            let ok = result.is_ok();
            self.result = Some(result);
            ok
        })
    }

    fn answer(self: Box<Self>, group_error: Option<&str>) {
        let _ = self.reply.send(match (group_error, self.result) {
            (Some(e), _) => Err(StoreError::GroupWrite(e.to_string())),
            (None, Some(result)) => result,
            (None, None) => Err(StoreError::GroupWrite("not run".into())),
        });
    }
}

/// How a writer opens, commits and abandons its group's transaction.
pub(crate) trait Txn: Send + 'static {
    /// The connection the writes run on.
    type Conn: Conn + 'static;
    /// Whether one failed statement aborts the whole transaction (Postgres), so that
    /// every write needs a savepoint, not only those of several statements (SQLite
    /// undoes a failed statement by itself). A group of repeatable writes first runs
    /// without them (see [`run_group`]).
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
pub(crate) struct GroupWriter<C> {
    ops: mpsc::Sender<Box<dyn Op<C>>>,
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
    pub(crate) fn start<T: Txn<Conn = C>>(txn: T, what: &'static str) -> Self {
        let (ops, rx) = mpsc::channel(4 * MAX_GROUP);
        tokio::spawn(run_writer(txn, rx, what));
        Self { ops }
    }

    /// Queues `op` (under a savepoint of its own when `atomic`) and waits until its group
    /// is committed.
    pub(crate) async fn write<T, F>(&self, atomic: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut C) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        let mut op = Some(op);
        let once = for_any_connection(move |conn: &mut C| match op.take() {
            Some(op) => op(conn),
            None => Box::pin(std::future::ready(Err(StoreError::GroupWrite(
                "a write that runs once was run again".into(),
            )))),
        });
        self.queue(atomic, false, once).await
    }

    /// Queues `op`, a write of several statements that can run again if a run of it is
    /// rolled back, and waits until its group is committed. Such writes let a writer
    /// whose statements abort the transaction on error (Postgres) run a group without
    /// a savepoint per write.
    pub(crate) async fn write_repeatable<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> Fn(&'c mut C) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.queue(true, true, op).await
    }

    async fn queue<T, F>(&self, atomic: bool, repeatable: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnMut(&'c mut C) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel::<StoreResult<T>>();
        let queued = Queued {
            op,
            atomic,
            repeatable,
            result: None,
            reply,
        };
        self.ops
            .send(Box::new(queued))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

/// `f`, typed as a write for a connection of any lifetime (a closure's own inferred
/// type names one lifetime).
fn for_any_connection<C, T, F>(f: F) -> F
where
    F: for<'c> FnMut(&'c mut C) -> BoxFuture<'c, StoreResult<T>>,
{
    f
}

/// Runs one of a writer's own statements (`BEGIN`, `SAVEPOINT`, `COMMIT`, …).
pub(crate) async fn exec<C: Conn>(conn: &mut C, statement: &'static str) -> Result<(), String> {
    conn.execute(query(statement))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Runs `op` on the open transaction, under a savepoint when it needs one; an error
/// means the transaction itself is broken (not that the op failed: its own result is
/// kept for its caller).
async fn run_one<T: Txn>(txn: &mut T, op: &mut dyn Op<T::Conn>) -> Result<(), String> {
    let savepoint = op.atomic() || T::SAVEPOINT_EVERY_WRITE;
    if savepoint {
        exec(txn.conn(), "SAVEPOINT op").await?;
    }
    let ok = op.run(txn.conn()).await;
    if !savepoint {
        return Ok(());
    }
    let conn = txn.conn();
    if ok {
        exec(conn, "RELEASE SAVEPOINT op").await
    } else {
        exec(conn, "ROLLBACK TO SAVEPOINT op").await?;
        exec(conn, "RELEASE SAVEPOINT op").await
    }
}

/// The writer task: commits queued writes in groups until every sender is gone.
async fn run_writer<T: Txn>(
    mut txn: T,
    mut rx: mpsc::Receiver<Box<dyn Op<T::Conn>>>,
    what: &'static str,
) {
    let mut group: Vec<Box<dyn Op<T::Conn>>> = Vec::with_capacity(MAX_GROUP);
    while let Some(op) = rx.recv().await {
        group.push(op);
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) => group.push(op),
                Err(_) => break,
            }
        }
        let ran = AssertUnwindSafe(run_group(&mut txn, &mut group, what))
            .catch_unwind()
            .await;
        if let Err(panic) = ran {
            // A write panicked (a bug in its code) mid-group: nothing of the group is
            // committed, and the writer goes on. Dying would fail every later write
            // of the process while it looked alive.
            txn.rollback().await;
            let e = format!(
                "a write panicked: {}",
                rollout_core::supervise::panic_message(panic)
            );
            fail_group(&mut group, &e, what);
        }
    }
}

/// Runs one group and answers every write in it (draining `group`).
///
/// Where a failed statement aborts the transaction (`T::SAVEPOINT_EVERY_WRITE`) and
/// every write in the group can run again, the group first runs without savepoints:
/// a savepoint is two more round trips per write, made while every other group waits,
/// and each one that writes is a subtransaction, of which Postgres tracks only 64 per
/// transaction in shared memory before every other session's visibility checks start
/// reading `pg_subtrans`. If a write fails there, the group is rolled back, that write
/// keeps its own error (what it would have got under a savepoint: the writes before it
/// were just as visible), and the others run again, under savepoints.
async fn run_group<T: Txn>(txn: &mut T, group: &mut Vec<Box<dyn Op<T::Conn>>>, what: &str) {
    if T::SAVEPOINT_EVERY_WRITE && group.iter().all(|op| op.repeatable()) {
        match run_without_savepoints(txn, group).await {
            Ok(None) => {
                for op in group.drain(..) {
                    op.answer(None);
                }
                return;
            }
            Ok(Some(failed)) => {
                group.remove(failed).answer(None);
                if group.is_empty() {
                    return;
                }
            }
            Err(e) => return fail_group(group, &e, what),
        }
    }
    let mut failed = txn.begin().await.err();
    let began = failed.is_none();
    for op in group.iter_mut() {
        if failed.is_some() {
            break;
        }
        failed = run_one(txn, op.as_mut()).await.err();
    }
    if failed.is_none()
        && let Err(e) = txn.commit().await
    {
        failed = Some(e);
    }
    if let Some(e) = failed {
        if began {
            txn.rollback().await;
        }
        return fail_group(group, &e, what);
    }
    for op in group.drain(..) {
        op.answer(None);
    }
}

/// Runs `group` in one transaction without savepoints: `Ok(None)` if it committed,
/// `Ok(Some(i))` if write `i` failed (the transaction is rolled back), `Err` if the
/// transaction could not begin or commit.
async fn run_without_savepoints<T: Txn>(
    txn: &mut T,
    group: &mut [Box<dyn Op<T::Conn>>],
) -> Result<Option<usize>, String> {
    txn.begin().await?;
    for (i, op) in group.iter_mut().enumerate() {
        if !op.run(txn.conn()).await {
            txn.rollback().await;
            return Ok(Some(i));
        }
    }
    if let Err(e) = txn.commit().await {
        txn.rollback().await;
        return Err(e);
    }
    Ok(None)
}

/// Answers every write of a group that did not commit with the group's error.
fn fail_group<C>(group: &mut Vec<Box<dyn Op<C>>>, error: &str, what: &str) {
    tracing::error!(error = %error, writes = group.len(), "{what}: a group of writes failed; each is reported failed to its caller");
    for op in group.drain(..) {
        op.answer(Some(error));
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
    /// a write remains. With `repeatable`, the writes are queued as repeatable ones
    /// (`write_repeatable`).
    async fn one_group_of_mixed_writes<C: Conn + 'static>(
        writer: GroupWriter<C>,
        repeatable: bool,
    ) -> Vec<i64> {
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
                    let op = mixed_write::<C>(i, k);
                    if repeatable {
                        w.write_repeatable(op).await
                    } else {
                        w.write(k == Kind::HalfDone, op).await
                    }
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

    /// Write `i` of kind `k`.
    fn mixed_write<C: Conn>(
        i: i64,
        k: Kind,
    ) -> impl for<'c> Fn(&'c mut C) -> BoxFuture<'c, StoreResult<()>> + Send + 'static {
        move |conn| {
            Box::pin(async move {
                let v = (k != Kind::Refused).then(|| format!("v{i}"));
                let insert = "INSERT INTO group_test (id, v) VALUES ($1, $2)";
                conn.execute(query(insert).bind(i).bind(&v)).await?;
                if k == Kind::HalfDone {
                    conn.execute(query(insert).bind(i).bind(&v)).await?;
                }
                Ok(())
            })
        }
    }

    fn expected() -> Vec<i64> {
        (0..60).filter(|i| kind(*i) == Kind::Good).collect()
    }

    /// A group writer over an in-memory SQLite database with an empty `group_test`.
    async fn sqlite_writer() -> GroupWriter<sqlx::SqliteConnection> {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE group_test (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .execute(&mut conn)
            .await
            .unwrap();
        GroupWriter::start(crate::sqlite::WriterConn(conn), "test")
    }

    /// The ids in `group_test`, read through `writer`.
    async fn stored_ids(writer: &GroupWriter<sqlx::SqliteConnection>) -> Vec<i64> {
        writer
            .write(false, |conn: &mut sqlx::SqliteConnection| {
                Box::pin(async move {
                    let rows: Vec<(i64,)> = conn
                        .fetch_all(query("SELECT id FROM group_test ORDER BY id"))
                        .await?;
                    Ok(rows.into_iter().map(|r| r.0).collect())
                })
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn sqlite_writes_in_one_group_fail_alone() {
        let writer = sqlite_writer().await;
        let applied = one_group_of_mixed_writes(writer.clone(), false).await;
        assert_eq!(applied, expected());
        assert_eq!(stored_ids(&writer).await, expected());
    }

    /// A write that panics fails its group with an error naming the panic, nothing of
    /// it is committed, and the writer goes on to the next write.
    #[tokio::test]
    async fn a_write_that_panics_fails_alone_and_the_writer_goes_on() {
        fn a_bug() -> StoreResult<()> {
            panic!("a bug in a write")
        }
        let writer = sqlite_writer().await;
        let e = writer
            .write(false, |conn: &mut sqlx::SqliteConnection| {
                Box::pin(async move {
                    let insert = "INSERT INTO group_test (id, v) VALUES (1, 'before the panic')";
                    conn.execute(query(insert)).await?;
                    a_bug()
                })
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::GroupWrite(m) if m.contains("a bug in a write")),
            "{e}"
        );
        writer
            .write(false, |conn: &mut sqlx::SqliteConnection| {
                Box::pin(async move {
                    conn.execute(query("INSERT INTO group_test (id, v) VALUES (2, 'after')"))
                        .await?;
                    Ok(())
                })
            })
            .await
            .unwrap();
        assert_eq!(
            stored_ids(&writer).await,
            vec![2],
            "the panicked write's row is not committed"
        );
    }

    /// On Postgres a refused statement aborts the whole transaction: without a
    /// savepoint per write, every write after the first refused one would fail too; and
    /// a group of repeatable writes, run first without savepoints, must come out the
    /// same. Runs when `ROLLOUT_TEST_DATABASE_URL` names a server, in a database of its
    /// own.
    #[tokio::test]
    async fn postgres_writes_in_one_group_fail_alone() {
        for repeatable in [false, true] {
            let Some(unit) = crate::postgres::UnitDb::create().await else {
                return;
            };
            let pool = sqlx::PgPool::connect(&unit.url).await.unwrap();
            sqlx::query("CREATE TABLE group_test (id BIGINT PRIMARY KEY, v TEXT NOT NULL)")
                .execute(&pool)
                .await
                .unwrap();
            let writer = GroupWriter::start(crate::postgres::ResultsTxn::new(pool.clone()), "test");
            let applied = one_group_of_mixed_writes(writer, repeatable).await;
            let stored: Vec<(i64,)> = sqlx::query_as("SELECT id FROM group_test ORDER BY id")
                .fetch_all(&pool)
                .await
                .unwrap();
            pool.close().await;
            unit.remove().await;
            assert_eq!(applied, expected(), "repeatable: {repeatable}");
            assert_eq!(
                stored.into_iter().map(|r| r.0).collect::<Vec<_>>(),
                expected(),
                "repeatable: {repeatable}"
            );
        }
    }
}
