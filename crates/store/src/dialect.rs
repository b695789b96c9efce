//! What differs between the two databases, and the one store built over either.
//!
//! [`SqlStore`] holds every method body once; a [`Dialect`] supplies the handful of
//! things that differ: how a write runs (SQLite queues it for its single group-commit
//! writer; Postgres runs it on a pooled connection, in a transaction of its own when it
//! is several statements), how a job's end is written so that result sequence numbers
//! become visible in commit order, how claims and hand-offs are coalesced, how backend
//! assignments take turns, how a list of results is marked published, and the
//! statements whose SQL differs.

use std::future::Future;
use std::ops::DerefMut;

use futures::future::BoxFuture;

use super::StoreResult;
use super::query::Conn;
use super::rows::JobRow;
use rollout_core::domain::{EpochMs, Stage};

/// A claim of a job's stage entry (see `sql::CLAIM`): the hottest write with the hand-off,
/// one per stage of every job.
#[derive(Debug, Clone)]
pub(crate) struct StageClaim {
    pub(crate) job_id: String,
    pub(crate) stage: Stage,
    pub(crate) epoch: i64,
    pub(crate) node: String,
    pub(crate) lease_until: EpochMs,
    pub(crate) now: EpochMs,
}

/// A claimed stage handing its job to the next stage (see `sql::ADVANCE`).
#[derive(Debug, Clone)]
pub(crate) struct StageAdvance {
    pub(crate) job_id: String,
    pub(crate) stage: Stage,
    pub(crate) epoch: i64,
    pub(crate) next: Stage,
    pub(crate) now: EpochMs,
    pub(crate) route: Option<String>,
    /// The stage's output, as JSON text.
    pub(crate) output: String,
    /// The claim's token (`attempts` at the claim).
    pub(crate) attempt: i64,
}

/// One database's side of the store. Every method is safe to call from many tasks.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The connection statements run on.
    type Conn: Conn;
    /// A pooled connection for reads.
    type Reader: DerefMut<Target = Self::Conn> + Send;

    /// Ends a job by inserting its result (see `sql::FINISH_SQLITE`).
    const FINISH: &'static str;
    /// Ends many jobs by inserting their results (see `sql::finish_many!`).
    const FINISH_MANY: &'static str;
    /// Ends a job as failed without its output (see `sql::finish_bare!`).
    const FINISH_BARE: &'static str;
    /// Inserts a submit's jobs from a JSON array (see `sql::insert_jobs!`).
    const INSERT_JOBS: &'static str;

    /// Applies pending migrations.
    fn migrate(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// A connection for reads (never inside a write's transaction).
    fn reader(&self) -> impl Future<Output = StoreResult<Self::Reader>> + Send;

    /// Runs `op` and returns once what it wrote is committed. `atomic` says `op` runs
    /// several writing statements that must apply all or nothing, so they need one
    /// transaction; otherwise `op` writes with one statement (it may read after it),
    /// which is atomic by itself, and a dialect may commit it without a transaction.
    fn write<T, F>(&self, atomic: bool, op: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Self::Conn) -> BoxFuture<'c, StoreResult<T>> + Send + 'static;

    /// Runs `op`, a write of several statements (all or nothing) that inserts a result,
    /// and returns once it is committed. Result sequence numbers must become visible in
    /// the order they are handed out, so a reader paging by `seq` never skips one; and
    /// every job's end goes through here (many ends to a write under load: see
    /// [`ends`](super::write::ends)), so this is the service's hottest write.
    /// `op` may run more than once (a dialect may roll a run of it back with its group
    /// and run it again), so it is `Fn`.
    fn write_result<T, F>(&self, op: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'c> Fn(&'c mut Self::Conn) -> BoxFuture<'c, StoreResult<T>> + Send + 'static;

    /// Called inside a write before it reads the backends' load and assigns one: two
    /// assignments must not both see the same counts.
    fn lock_pool(conn: &mut Self::Conn) -> impl Future<Output = StoreResult<()>> + Send;

    /// Called in an assignment after [`Dialect::lock_pool`], before it records the job's
    /// backend: holds the job's row until commit where rows are locked (Postgres), so
    /// the job cannot end between the check that it is still in RUN and the commit
    /// (see `sql::PUT_ASSIGNMENT`). Only the pool lock's holder takes such a lock, so
    /// two assignments never wait on each other's rows. SQLite's single writer needs
    /// nothing.
    fn lock_job(
        conn: &mut Self::Conn,
        job_id: &str,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Called first in a sampling batch's launch: holds the batch's row until commit
    /// where rows are locked (Postgres), so a launch takes its rows in the order a job's
    /// end does. SQLite's single writer needs nothing.
    fn lock_batch(
        conn: &mut Self::Conn,
        batch_id: &str,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Claims a stage entry; returns the job's row if the claim applied. Every stage of
    /// every job starts with one, so both dialects run whatever claims have queued up
    /// as one statement (see [`coalesce`](super::write::coalesce)).
    fn claim(&self, c: StageClaim) -> impl Future<Output = StoreResult<Option<JobRow>>> + Send;

    /// Hands a claimed stage to the next; returns the new stage entry's epoch if it
    /// applied. Coalesced as claims are.
    fn advance(&self, a: StageAdvance) -> impl Future<Output = StoreResult<Option<i64>>> + Send;

    /// Marks results (never an empty list) as published; may apply shortly after it
    /// returns (see [`ResultStore::mark_published`](super::ResultStore::mark_published)).
    fn mark_published(
        &self,
        seqs: &[i64],
        now: EpochMs,
    ) -> impl Future<Output = StoreResult<()>> + Send;
}

/// Answers a multi-row write's callers in request order from the `(job id, value)` rows
/// its statement returned, in whatever order it ran them; a request without a row did
/// not apply.
pub(super) fn in_request_order<R, T>(
    reqs: &[R],
    rows: Vec<(String, T)>,
    job_id: impl Fn(&R) -> &str,
) -> Vec<Option<T>> {
    let mut by_id: std::collections::HashMap<String, T> = rows.into_iter().collect();
    reqs.iter().map(|r| by_id.remove(job_id(r))).collect()
}

/// What the dialects' unit tests share.
#[cfg(test)]
pub(super) mod checks {
    use super::*;
    use crate::query::query;
    use crate::sql_store::SqlStore;
    use crate::{JobStore, NewJob};
    use rollout_core::domain::Status;

    fn claim(job_id: &str, epoch: i64, node: &str) -> StageClaim {
        StageClaim {
            job_id: job_id.into(),
            stage: Stage::Init,
            epoch,
            node: node.into(),
            lease_until: EpochMs(5_000),
            now: EpochMs(2_000),
        }
    }

    fn advance(job_id: &str, attempt: i64, output: &str) -> StageAdvance {
        StageAdvance {
            job_id: job_id.into(),
            stage: Stage::Init,
            epoch: 0,
            next: Stage::Run,
            now: EpochMs(3_000),
            route: Some(format!("route-{output}")),
            output: format!("{{\"out\":\"{output}\"}}"),
            attempt,
        }
    }

    /// A job's history as (event, stage, epoch, attempt).
    async fn history<D: Dialect>(store: &SqlStore<D>, id: &str) -> Vec<(String, String, i64, i64)> {
        store
            .events(id)
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.event,
                    e.stage.unwrap(),
                    e.epoch.unwrap(),
                    e.attempt.unwrap(),
                )
            })
            .collect()
    }

    fn ev(event: &str, stage: &str, epoch: i64, attempt: i64) -> (String, String, i64, i64) {
        (event.to_string(), stage.to_string(), epoch, attempt)
    }

    /// The check both dialects' multi-row claims and hand-offs pass (their unit tests call
    /// it): each write applies to its own job only, under the same conditions as the
    /// one-row statements, and is answered in request order.
    pub(crate) async fn multi_row_writes_apply_each_to_its_own_job<D: Dialect>(
        store: &SqlStore<D>,
        claims: &impl crate::write::coalesce::WriteKind<Req = StageClaim, Resp = Option<JobRow>>,
        advances: &impl crate::write::coalesce::WriteKind<Req = StageAdvance, Resp = Option<i64>>,
    ) {
        let jobs: Vec<NewJob> = (0..4)
            .map(|_| NewJob {
                id: uuid::Uuid::now_v7().to_string(),
                kind: "synthetic".into(),
                client_id: None,
                group_id: None,
                task: serde_json::json!({"kind": "synthetic", "spec": {}}),
            })
            .collect();
        store.submit("b", &jobs, EpochMs(1_000)).await.unwrap();
        // Ids are time-ordered: asking in reverse makes request order differ from the
        // statement's job-id order.
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| jobs[i].id.as_str());

        let got = claims
            .run(&[
                claim(d, 0, "n-d"),
                claim(c, 7, "n-c"),
                claim(b, 0, "n-b"),
                claim(a, 0, "n-a"),
            ])
            .await
            .unwrap();
        let got: Vec<Option<(String, String, i64)>> = got
            .into_iter()
            .map(|r| {
                r.map(|r| {
                    let j = r.into_job().unwrap();
                    (j.id, j.node.unwrap(), j.attempts)
                })
            })
            .collect();
        assert_eq!(
            got,
            vec![
                Some((d.into(), "n-d".into(), 1)),
                None, // another stage entry: not claimed
                Some((b.into(), "n-b".into(), 1)),
                Some((a.into(), "n-a".into(), 1)),
            ]
        );
        // Live leases: claiming again takes nothing.
        let again = claims
            .run(&[claim(a, 0, "x"), claim(b, 0, "x")])
            .await
            .unwrap();
        assert!(again.iter().all(Option::is_none));

        let got = advances
            .run(&[
                advance(d, 1, "d"),
                advance(b, 2, "b"),
                advance(a, 1, "a"),
                advance(c, 1, "c"),
            ])
            .await
            .unwrap();
        // b's token is wrong, c was never claimed.
        assert_eq!(got, vec![Some(1), None, Some(1), None]);
        for (id, out) in [(a, "a"), (d, "d")] {
            let j = store.job(id).await.unwrap().unwrap();
            assert_eq!(
                (j.status, j.stage, j.epoch, j.route.as_deref()),
                (
                    Status::Queued,
                    Stage::Run,
                    1,
                    Some(format!("route-{out}").as_str())
                )
            );
            assert_eq!(j.init_output, Some(serde_json::json!({ "out": out })));
            assert_eq!(
                (j.timings.init.finished_at, j.timings.run.queued_at),
                (Some(3_000), Some(3_000))
            );
        }
        let b_job = store.job(b).await.unwrap().unwrap();
        assert_eq!((b_job.status, b_job.stage), (Status::Running, Stage::Init));

        // The history has a row per job per change, written by the statements' triggers:
        // nothing for the claims that did not apply or the hand-off with a wrong token.
        for id in [a, d] {
            assert_eq!(
                history(store, id).await,
                vec![
                    ev("queued", "init", 0, 0),
                    ev("running", "init", 0, 1),
                    ev("queued", "run", 1, 1)
                ]
            );
        }
        assert_eq!(
            history(store, b).await,
            vec![ev("queued", "init", 0, 0), ev("running", "init", 0, 1)]
        );
        assert_eq!(history(store, c).await, vec![ev("queued", "init", 0, 0)]);
    }
    /// The check both dialects' upgrades pass (their unit tests call it, with `db`
    /// migrated to just before the bounded-dashboard migration): a database that has
    /// results has their rewards counted into their batches by the upgrade (the batch
    /// rows read the same before and after), and results after it are counted by the
    /// trigger that ends their jobs.
    pub(crate) async fn upgrade_counts_existing_rewards_into_their_batches<D: Dialect>(db: &D) {
        async fn end<D: Dialect>(db: &D, job: &str, status: &str, reward: Option<f64>, at: i64) {
            let mut conn = db.reader().await.unwrap();
            conn.execute(
                query(
                    "INSERT INTO jobs (id, batch_id, kind, task, status, stage, created_at, \
                     updated_at) VALUES ($1, 'b', 'synthetic', '{}', 'running', 'eval', 1, 1)",
                )
                .bind(job),
            )
            .await
            .unwrap();
            conn.execute(
                query(
                    "INSERT INTO results (job_id, batch_id, status, reward, output, created_at) \
                     VALUES ($1, 'b', $2, $3, '{}', $4)",
                )
                .bind(job)
                .bind(status)
                .bind(reward)
                .bind(at),
            )
            .await
            .unwrap();
        }
        async fn progress<D: Dialect>(db: &D) -> (i64, i64, Option<f64>, Option<i64>) {
            let mut conn = db.reader().await.unwrap();
            conn.fetch_optional(query(
                "SELECT finished, rewarded, reward_mean, last_result_at FROM batch_progress",
            ))
            .await
            .unwrap()
            .expect("the batch's row")
        }
        let mut conn = db.reader().await.unwrap();
        conn.execute(query(
            "INSERT INTO batches (id, created_at) VALUES ('b', 1)",
        ))
        .await
        .unwrap();
        drop(conn);
        end(db, "j1", "done", Some(1.0), 100).await;
        end(db, "j2", "done", Some(0.0), 300).await;
        end(db, "j3", "failed", None, 200).await;
        let before = progress(db).await;
        assert_eq!(before, (3, 2, Some(0.5), Some(300)));

        db.migrate().await.unwrap();
        assert_eq!(progress(db).await, before);
        end(db, "j4", "done", Some(1.0), 250).await;
        let (finished, rewarded, mean, last) = progress(db).await;
        assert_eq!((finished, rewarded, last), (4, 3, Some(300)));
        assert!((mean.unwrap() - 2.0 / 3.0).abs() < 1e-12, "{mean:?}");
    }
}
