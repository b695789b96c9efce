//! Postgres's [`Dialect`], for deployments with workers on many machines.
//!
//! Each write runs on a pooled connection (in a transaction of its own when it is
//! several statements), and Postgres's own concurrency does the rest — except a job's
//! end. Result sequence numbers are identity values, handed out at insert but visible
//! at commit, so two ends committing out of order would let a reader polling
//! `seq > 10` see 11 and skip 10 for ever. Ends therefore take turns under a
//! transaction-scoped advisory lock held until commit, and the results trigger also
//! updates the batch's counter row, locked until commit too. One end per transaction
//! would make one commit (one WAL flush) per job the whole service's ceiling, whatever
//! the number of nodes; so each process hands its ends to a [`GroupWriter`] that takes
//! the lock once for whatever has queued up and commits the lot together. Under load, a
//! group grows while the previous one holds the lock; and since every statement in a
//! group is a round trip made while every other process's ends wait for the lock, the
//! ends themselves arrive coalesced, many to a statement (see [`ends`](super::write::ends)).
//!
//! The other writes every job makes — three claims, two hand-offs, the published mark
//! — go through a [`Coalescer`] each, which runs whatever has queued up as one
//! multi-row statement: the server's cost is mostly per statement, not per row.
//!
//! Every pooled TCP connection has Nagle's algorithm off ([`nodelay`]): sqlx 0.9.0
//! leaves it on, and a batched statement could then wait up to 40 ms for the server's
//! acknowledgement, inside the result-ordering lock for job ends.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use super::dialect::{Dialect, StageAdvance, StageClaim, in_request_order};
use super::migrations::Schema;
use super::query::query;
use super::rows::JobRow;
use super::write::coalesce::{Coalescer, WriteKind};
use super::write::group::{GroupWriter, Txn};
use super::{StoreResult, nodelay, sql};
use rollout_core::domain::EpochMs;

/// Advisory-lock key serialising result inserts (see the module's documentation):
/// 0x00726f6c6c6f7574, "rollout" in ASCII, written out for [`BEGIN_RESULTS`].
macro_rules! results_lock {
    () => {
        "32210658811409780"
    };
}

/// Opens a job-ends transaction and takes the result-ordering lock in one round trip (a
/// simple query may hold several statements).
const BEGIN_RESULTS: &str = concat!("BEGIN; SELECT pg_advisory_xact_lock(", results_lock!(), ")");

/// Advisory-lock key serialising backend assignments (see [`PostgresDb::lock_pool`]).
const POOL_LOCK: i64 = 0x0072_6f6c_6c70_6f6f; // "rollpoo"

/// Advisory-lock key a process holds while it migrates (see [`PostgresDb::migrate`]).
const SETUP_LOCK: i64 = 0x0072_6f6c_6c73_6574; // "rollset"

/// A Postgres database behind a connection pool.
#[derive(Debug, Clone)]
pub(crate) struct PostgresDb {
    pool: PgPool,
    /// Job ends, committed in groups under the result-ordering lock.
    results: GroupWriter<PgConnection>,
    /// Claims, run many to a statement under load.
    claims: Coalescer<Claims>,
    /// Hand-offs, run many to a statement under load.
    advances: Coalescer<Advances>,
    /// Published marks, many lists to a statement under load.
    marks: Coalescer<Marks>,
}

impl PostgresDb {
    /// Connects to the database at `url`.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let options: PgConnectOptions = url.parse()?;
        // A Unix socket has no Nagle's algorithm to turn off.
        let tcp_port = options.get_socket().is_none().then(|| options.get_port());
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(move |_conn, _meta| {
                Box::pin(async move {
                    if let Some(port) = tcp_port {
                        nodelay::on_sockets_to(port);
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await?;
        let results = GroupWriter::start(ResultsTxn::new(pool.clone()), "Postgres job ends");
        let claims = Coalescer::start(Claims(pool.clone()));
        let advances = Coalescer::start(Advances(pool.clone()));
        let marks = Coalescer::start(Marks(pool.clone()));
        Ok(Self {
            pool,
            results,
            claims,
            advances,
            marks,
        })
    }
}

impl Dialect for PostgresDb {
    type Conn = PgConnection;
    type Reader = PoolConnection<Postgres>;

    const FINISH: &'static str = sql::FINISH_POSTGRES;
    const FINISH_MANY: &'static str = sql::FINISH_MANY_POSTGRES;
    const FINISH_BARE: &'static str = sql::FINISH_BARE_POSTGRES;
    const INSERT_JOBS: &'static str = sql::INSERT_JOBS_POSTGRES;

    /// Applies the migrations and the views (see [`migrations`](super::migrations)) on
    /// a connection of its own, holding the setup lock (a session-level advisory lock)
    /// from before the first migration to after the views: sqlx's migrator locks each
    /// of its runs only, and the views are made between runs. The connection is closed
    /// after, which releases the lock whatever happened.
    async fn migrate(&self) -> StoreResult<()> {
        let mut conn = self.pool.acquire().await?.detach();
        query(sql::ADVISORY_LOCK)
            .bind(SETUP_LOCK)
            .execute(&mut conn)
            .await?;
        let brought_up = Schema::POSTGRES.bring_up(&mut conn).await;
        let _ = sqlx::Connection::close(conn).await;
        brought_up
    }

    async fn reader(&self) -> StoreResult<PoolConnection<Postgres>> {
        Ok(self.pool.acquire().await?)
    }

    /// Runs an `atomic` `op` in a transaction of its own (a transaction is atomic however
    /// many statements it runs), and any other `op` on a pooled connection as it is, each
    /// statement committing by itself. Most writes (claims, hand-offs, lease renewals)
    /// are one statement each, and a transaction around one statement costs two more
    /// round trips (`BEGIN`, `COMMIT`) for nothing it does not already have.
    async fn write<T, F>(&self, atomic: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        if !atomic {
            let mut conn = self.pool.acquire().await?;
            return op(&mut conn).await;
        }
        let mut tx = self.pool.begin().await?;
        let out = op(&mut tx).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Through the process's group writer, under the result-ordering lock (see the
    /// module's documentation).
    async fn write_result<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> Fn(&'c mut PgConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.results.write_repeatable(op).await
    }

    /// Through the process's claim coalescer: one statement for whatever claims have
    /// queued up (see [`coalesce`](super::write::coalesce)).
    async fn claim(&self, c: StageClaim) -> StoreResult<Option<JobRow>> {
        self.claims.write(c).await
    }

    /// Through the process's hand-off coalescer, as claims.
    async fn advance(&self, a: StageAdvance) -> StoreResult<Option<i64>> {
        self.advances.write(a).await
    }

    /// Assignments read the counts and then write one: two RUN workers assigning at once
    /// must not both see the same counts. A transaction-scoped advisory lock makes them
    /// take turns (an assignment is a few small statements, once per job).
    async fn lock_pool(conn: &mut PgConnection) -> StoreResult<()> {
        query(sql::ADVISORY_XACT_LOCK)
            .bind(POOL_LOCK)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn lock_batch(conn: &mut PgConnection, batch_id: &str) -> StoreResult<()> {
        query(sql::LOCK_BATCH_POSTGRES)
            .bind(batch_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn lock_job(conn: &mut PgConnection, job_id: &str) -> StoreResult<()> {
        query(sql::LOCK_JOB_POSTGRES)
            .bind(job_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Through the process's marks coalescer: every job's end marks its result, and
    /// one statement marks whatever marks have queued up.
    async fn mark_published(&self, seqs: &[i64], now: EpochMs) -> StoreResult<()> {
        self.marks.write((seqs.to_vec(), now)).await
    }
}

/// The job-ends writer's transactions: each on a pooled connection (so a connection cut
/// by a server restart is replaced), holding the result-ordering lock from its start.
pub(super) struct ResultsTxn {
    pool: PgPool,
    open: Option<Transaction<'static, Postgres>>,
}

impl ResultsTxn {
    /// Transactions on `pool`.
    pub(super) fn new(pool: PgPool) -> Self {
        Self { pool, open: None }
    }
}

impl Txn for ResultsTxn {
    type Conn = PgConnection;
    const SAVEPOINT_EVERY_WRITE: bool = true;

    async fn begin(&mut self) -> Result<(), String> {
        let tx = self
            .pool
            .begin_with(BEGIN_RESULTS)
            .await
            .map_err(|e| e.to_string())?;
        self.open = Some(tx);
        Ok(())
    }

    fn conn(&mut self) -> &mut PgConnection {
        self.open
            .as_deref_mut()
            .expect("the group writer asks for the connection only inside a transaction")
    }

    async fn commit(&mut self) -> Result<(), String> {
        match self.open.take() {
            Some(tx) => tx.commit().await.map_err(|e| e.to_string()),
            None => Err("no transaction is open".into()),
        }
    }

    async fn rollback(&mut self) {
        if let Some(tx) = self.open.take() {
            let _ = tx.rollback().await;
        }
    }
}

/// Claims as one statement: [`sql::CLAIM`] for one, [`sql::CLAIM_MANY_POSTGRES`] for
/// more. The rows are handed over in job-id order, the order such a statement usually
/// locks them in, so two of them rarely wait on each other in a cycle; when they do,
/// Postgres fails one, and its writes are tried again one by one.
pub(super) struct Claims(PgPool);

impl WriteKind for Claims {
    type Req = StageClaim;
    type Resp = Option<JobRow>;

    type Key = String;

    fn key(req: &StageClaim) -> String {
        req.job_id.clone()
    }

    async fn run(&self, reqs: &[StageClaim]) -> StoreResult<Vec<Option<JobRow>>> {
        let mut conn = self.0.acquire().await?;
        if let [c] = reqs {
            return Ok(vec![claim_one(&mut conn, c).await?]);
        }
        let mut order: Vec<&StageClaim> = reqs.iter().collect();
        order.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        let rows: Vec<JobRow> = sqlx::query_as(sql::CLAIM_MANY_POSTGRES)
            .bind(order.iter().map(|c| c.job_id.as_str()).collect::<Vec<_>>())
            .bind(order.iter().map(|c| c.stage.as_str()).collect::<Vec<_>>())
            .bind(order.iter().map(|c| c.epoch).collect::<Vec<_>>())
            .bind(order.iter().map(|c| c.node.as_str()).collect::<Vec<_>>())
            .bind(
                order
                    .iter()
                    .map(|c| c.lease_until.as_millis())
                    .collect::<Vec<_>>(),
            )
            .bind(order.iter().map(|c| c.now.as_millis()).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await?;
        let rows = rows.into_iter().map(|r| (r.id().to_string(), r)).collect();
        Ok(in_request_order(reqs, rows, |c| &c.job_id))
    }
}

/// Hand-offs as one statement: [`sql::ADVANCE`] for one, [`sql::ADVANCE_MANY_POSTGRES`]
/// for more (in job-id order, as claims).
pub(super) struct Advances(PgPool);

impl WriteKind for Advances {
    type Req = StageAdvance;
    type Resp = Option<i64>;

    type Key = String;

    fn key(req: &StageAdvance) -> String {
        req.job_id.clone()
    }

    async fn run(&self, reqs: &[StageAdvance]) -> StoreResult<Vec<Option<i64>>> {
        let mut conn = self.0.acquire().await?;
        if let [a] = reqs {
            return Ok(vec![advance_one(&mut conn, a).await?]);
        }
        let mut order: Vec<&StageAdvance> = reqs.iter().collect();
        order.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        let rows: Vec<(String, i64)> = sqlx::query_as(sql::ADVANCE_MANY_POSTGRES)
            .bind(order.iter().map(|a| a.job_id.as_str()).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.stage.as_str()).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.epoch).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.next.as_str()).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.now.as_millis()).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.route.as_deref()).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.output.as_str()).collect::<Vec<_>>())
            .bind(order.iter().map(|a| a.attempt).collect::<Vec<_>>())
            .fetch_all(&mut *conn)
            .await?;
        Ok(in_request_order(reqs, rows, |a| &a.job_id))
    }
}

/// Runs one claim as its own statement.
async fn claim_one(conn: &mut PgConnection, c: &StageClaim) -> StoreResult<Option<JobRow>> {
    Ok(query(sql::CLAIM)
        .bind(&c.job_id)
        .bind(c.stage.as_str())
        .bind(c.epoch)
        .bind(&c.node)
        .bind(c.lease_until)
        .bind(c.now)
        .fetch_optional(conn)
        .await?)
}

/// Runs one hand-off as its own statement.
async fn advance_one(conn: &mut PgConnection, a: &StageAdvance) -> StoreResult<Option<i64>> {
    let row: Option<(i64,)> = query(sql::ADVANCE)
        .bind(&a.job_id)
        .bind(a.stage.as_str())
        .bind(a.epoch)
        .bind(a.next.as_str())
        .bind(a.now)
        .bind(&a.route)
        .bind(&a.output)
        .bind(a.attempt)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(epoch,)| epoch))
}

/// Published marks as one statement (the lists bind as one Postgres array, which the
/// shared statement API does not carry), stamped with the latest of their times.
pub(super) struct Marks(PgPool);

impl WriteKind for Marks {
    /// The results' sequence numbers, and when they were published.
    type Req = (Vec<i64>, EpochMs);
    type Resp = ();
    /// A list's first result (callers' lists do not overlap; if two did, marking one
    /// result twice in a statement would be harmless anyway).
    type Key = Option<i64>;

    fn key(req: &(Vec<i64>, EpochMs)) -> Option<i64> {
        req.0.first().copied()
    }

    async fn run(&self, reqs: &[(Vec<i64>, EpochMs)]) -> StoreResult<Vec<()>> {
        let seqs: Vec<i64> = reqs.iter().flat_map(|(s, _)| s.iter().copied()).collect();
        let now = reqs
            .iter()
            .map(|(_, t)| *t)
            .max()
            .unwrap_or_else(EpochMs::now);
        sqlx::query(sql::MARK_PUBLISHED_POSTGRES)
            .bind(now.as_millis())
            .bind(seqs)
            .execute(&self.0)
            .await?;
        Ok(vec![(); reqs.len()])
    }
}

/// An empty database of its own on the server `ROLLOUT_TEST_DATABASE_URL` names, for
/// the store's unit tests that migrate it themselves (part of the way, or to compare
/// schemas): the test-support crate's, named for the run so the test command's final
/// check finds any left behind.
#[cfg(test)]
pub(super) struct UnitDb {
    db: rollout_test_support::database::FreshPostgres,
    /// The database's URL.
    pub(super) url: String,
}

#[cfg(test)]
impl UnitDb {
    /// Creates the database, or `None` when no server is named: the test is then
    /// skipped, saying so, and fails under `CI` (the test command runs these tests on
    /// Postgres, and leaves them out of its SQLite pass by name).
    pub(super) async fn create() -> Option<Self> {
        let admin = rollout_test_support::database::postgres_admin_url_or_skip(
            "a Postgres unit test of the store",
        )?;
        let db = rollout_test_support::database::FreshPostgres::create_empty(&admin)
            .await
            .unwrap();
        Some(Self {
            url: db.url.clone(),
            db,
        })
    }

    /// Drops the database (closing whatever is still connected to it).
    pub(super) async fn remove(self) {
        self.db.remove().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::checks::{
        multi_row_writes_apply_each_to_its_own_job,
        upgrade_counts_existing_rewards_into_their_batches,
    };
    use crate::sql_store::SqlStore;
    use crate::write::ends::checks::{
        ends_of_whole_groups_in_one_statement_decide_each_once,
        several_ends_in_one_statement_apply_each_to_its_own_job,
    };

    /// Every connection of the store's pool has Nagle's algorithm off (see
    /// [`nodelay`]): the server names each one's client port, and this process's
    /// socket on that port has `TCP_NODELAY`.
    #[tokio::test]
    async fn every_pooled_connection_has_nagle_off() {
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let db = PostgresDb::connect(&unit.url, 3).await.unwrap();
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(db.pool.acquire().await.unwrap());
        }
        for conn in &mut conns {
            let port: Option<i32> = sqlx::query_scalar("SELECT inet_client_port()")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            let Some(port) = port else {
                // A Unix socket: no Nagle to turn off.
                continue;
            };
            let port = u16::try_from(port).unwrap();
            assert_eq!(nodelay::nodelay_of_local_port(port), Some(true));
        }
        drop(conns);
        drop(db);
        unit.remove().await;
    }

    /// A job-ends transaction holds the result-ordering lock from its start until it
    /// commits: another session cannot take it meanwhile, and can after.
    #[tokio::test]
    async fn a_job_ends_transaction_holds_the_results_lock_until_it_commits() {
        async fn free(conn: &mut PgConnection, key: i64) -> bool {
            sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_xact_lock($1)")
                .bind(key)
                .fetch_one(conn)
                .await
                .unwrap()
        }
        let key: i64 = results_lock!().parse().unwrap();
        assert_eq!(key.to_be_bytes(), *b"\0rollout");
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let pool = PgPool::connect(&unit.url).await.unwrap();
        let mut other = pool.acquire().await.unwrap();
        let mut txn = ResultsTxn::new(pool.clone());
        txn.begin().await.unwrap();
        assert!(
            !free(&mut other, key).await,
            "taken while the transaction is open"
        );
        txn.commit().await.unwrap();
        assert!(free(&mut other, key).await, "free once it committed");
        drop(other);
        pool.close().await;
        unit.remove().await;
    }

    /// Upgrading a database that has results counts their rewards into their batches
    /// (see the check; the Postgres migration's backfill is its own SQL).
    #[tokio::test]
    async fn the_upgrade_counts_existing_rewards_into_their_batches() {
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let db = PostgresDb::connect(&unit.url, 2).await.unwrap();
        crate::migrations::POSTGRES
            .run_to(11, &db.pool)
            .await
            .unwrap();
        upgrade_counts_existing_rewards_into_their_batches(&db).await;
        drop(db);
        unit.remove().await;
    }

    /// The plans of `statements` (each with how many parameters it takes, bound to
    /// 1000) on a fresh database of `unit`, with sequential scans priced out: a table
    /// still scanned then has no index the statement's conditions can use.
    async fn plans_without_seqscans(
        unit: &UnitDb,
        statements: &[(&str, usize)],
    ) -> Vec<Vec<String>> {
        let db = PostgresDb::connect(&unit.url, 1).await.unwrap();
        db.migrate().await.unwrap();
        let mut conn = db.pool.acquire().await.unwrap();
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .unwrap();
        let mut plans = Vec::new();
        for (statement, params) in statements {
            let explain = format!("EXPLAIN {statement}");
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(explain));
            for _ in 0..*params {
                query = query.bind(1_000_i64);
            }
            plans.push(query.fetch_all(&mut *conn).await.unwrap());
        }
        plans
    }

    /// The metrics scrape's totals can reach `jobs` through the partial index of
    /// unfinished jobs alone: with sequential scans priced out, the plan uses it (a
    /// query whose conditions did not imply its predicate could not, and would still
    /// read every job).
    #[tokio::test]
    async fn totals_can_read_only_unfinished_jobs() {
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let plan = plans_without_seqscans(&unit, &[(sql::TOTALS, 0)])
            .await
            .remove(0);
        let on_jobs: Vec<&String> = plan.iter().filter(|l| l.contains(" on jobs")).collect();
        assert_eq!(on_jobs.len(), 1, "{plan:#?}");
        assert!(on_jobs[0].contains("using jobs_unfinished"), "{plan:#?}");
        unit.remove().await;
    }

    /// The status page's reads can reach `jobs` and `results` without reading either
    /// whole: with sequential scans priced out, no plan scans them, and each read uses
    /// the index made for it (a query whose conditions did not match its index would
    /// still scan).
    #[tokio::test]
    async fn dashboard_reads_can_reach_jobs_and_results_through_indexes() {
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let reads = [
            (sql::DASHBOARD_BATCHES, 1, "batches_created"),
            (sql::DASHBOARD_QUEUES, 0, "jobs_unfinished"),
            (sql::DASHBOARD_TIMINGS, 2, "jobs_finished"),
            (sql::DASHBOARD_THROUGHPUT, 1, "results_minute"),
            (sql::DASHBOARD_FAILURES, 3, "results_failures"),
        ];
        let statements: Vec<(&str, usize)> = reads.iter().map(|(s, p, _)| (*s, *p)).collect();
        let plans = plans_without_seqscans(&unit, &statements).await;
        for ((statement, _, index), plan) in reads.iter().zip(plans) {
            assert!(
                !plan
                    .iter()
                    .any(|l| l.contains("Seq Scan on jobs") || l.contains("Seq Scan on results")),
                "{statement}: {plan:#?}"
            );
            assert!(
                plan.iter().any(|l| l.contains(&format!(" {index} "))),
                "{statement}: {plan:#?}"
            );
        }
        unit.remove().await;
    }

    /// The multi-row statements apply each write to its own job only, under the same
    /// conditions as the one-row ones, and answer each in request order (not the job-id
    /// order they run in). Runs when `ROLLOUT_TEST_DATABASE_URL` names a server.
    #[tokio::test]
    async fn claims_and_hand_offs_of_several_jobs_in_one_statement_apply_each_to_its_own_job() {
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let db = PostgresDb::connect(&unit.url, 4).await.unwrap();
        db.migrate().await.unwrap();
        let pool = db.pool.clone();
        let store = SqlStore::new(db);
        multi_row_writes_apply_each_to_its_own_job(
            &store,
            &Claims(pool.clone()),
            &Advances(pool.clone()),
        )
        .await;
        drop(store);
        unit.remove().await;
    }

    /// Several job ends in one statement apply each to its own job, and whole sampling
    /// groups ended together are decided as ending them one at a time decides them.
    /// Runs when `ROLLOUT_TEST_DATABASE_URL` names a server.
    #[tokio::test]
    async fn several_job_ends_in_one_statement_apply_each_to_its_own_job() {
        let Some(unit) = UnitDb::create().await else {
            return;
        };
        let db = PostgresDb::connect(&unit.url, 4).await.unwrap();
        db.migrate().await.unwrap();
        let store = SqlStore::new(db);
        several_ends_in_one_statement_apply_each_to_its_own_job(&store).await;
        ends_of_whole_groups_in_one_statement_decide_each_once(&store).await;
        drop(store);
        unit.remove().await;
    }
}
