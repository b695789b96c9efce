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
//!
//! **Coalesced claims and hand-offs.** Each statement is a round trip between the
//! calling task and the connection's own thread (sqlx runs every SQLite connection on a
//! thread of its own), and the writer runs its group's statements one after another;
//! so the writer's pace is set by those round trips, not by SQLite. The writes every
//! stage of every job makes (a claim and a hand-off) therefore go through a
//! [`Coalescer`] each, which turns whatever has queued up into one multi-row statement
//! over a JSON array, run by the writer like any other write.

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

use super::dialect::{Dialect, StageAdvance, StageClaim, in_request_order};
use super::migrations::Schema;
use super::query::query;
use super::rows::JobRow;
use super::write::coalesce::{Coalescer, WriteKind};
use super::write::group::{GroupWriter, Txn, exec};
use super::{StoreError, StoreResult, sql};
use rollout_core::domain::EpochMs;

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
    /// Claims, run many to a statement under load.
    claims: Coalescer<Claims>,
    /// Hand-offs, run many to a statement under load.
    advances: Coalescer<Advances>,
}

impl SqliteDb {
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
            claims: Coalescer::start(Claims(writer.clone())),
            advances: Coalescer::start(Advances(writer.clone())),
            writer,
            opts,
            marks: Arc::default(),
        })
    }

    /// Applies the migrations and the views (see [`migrations`](super::migrations))
    /// under the setup lock (see [`setup_lock`]): sqlx does not lock SQLite migrations,
    /// so processes started together on a fresh database (a Slurm array, `docker
    /// compose up`) would each apply the first migration and all but one would fail.
    async fn run_migrations(&self) -> StoreResult<()> {
        let _lock = setup_lock(&self.opts).await?;
        let mut conn = self.opts.connect().await?;
        let brought_up = Schema::SQLITE.bring_up(&mut conn).await;
        let _ = sqlx::Connection::close(conn).await;
        brought_up
    }
}

impl Dialect for SqliteDb {
    type Conn = SqliteConnection;
    type Reader = PoolConnection<Sqlite>;

    const FINISH: &'static str = sql::FINISH_SQLITE;
    const FINISH_MANY: &'static str = sql::FINISH_MANY_SQLITE;
    const FINISH_BARE: &'static str = sql::FINISH_BARE_SQLITE;
    const INSERT_JOBS: &'static str = sql::INSERT_JOBS_SQLITE;

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
        F: for<'c> Fn(&'c mut SqliteConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.writer.write(true, op).await
    }

    /// Through the claim coalescer, then the writer (see the module's documentation).
    async fn claim(&self, c: StageClaim) -> StoreResult<Option<JobRow>> {
        self.claims.write(c).await
    }

    /// Through the hand-off coalescer, as claims.
    async fn advance(&self, a: StageAdvance) -> StoreResult<Option<i64>> {
        self.advances.write(a).await
    }

    /// The single writer already runs one assignment at a time.
    async fn lock_pool(_conn: &mut SqliteConnection) -> StoreResult<()> {
        Ok(())
    }

    async fn lock_batch(_conn: &mut SqliteConnection, _batch_id: &str) -> StoreResult<()> {
        Ok(())
    }

    async fn lock_job(_conn: &mut SqliteConnection, _job_id: &str) -> StoreResult<()> {
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

/// One claim in [`sql::CLAIM_MANY_SQLITE`]'s JSON array.
#[derive(serde::Serialize)]
struct ClaimArg<'a> {
    id: &'a str,
    stage: &'a str,
    epoch: i64,
    node: &'a str,
    lease: i64,
    now: i64,
}

/// One hand-off in [`sql::ADVANCE_MANY_SQLITE`]'s JSON array.
#[derive(serde::Serialize)]
struct AdvanceArg<'a> {
    id: &'a str,
    stage: &'a str,
    epoch: i64,
    next: &'a str,
    now: i64,
    route: Option<&'a str>,
    output: &'a str,
    attempt: i64,
}

/// Claims as one write of the writer, [`sql::CLAIM_MANY_SQLITE`], however many (one
/// statement is one round trip to the connection's thread either way).
pub(super) struct Claims(GroupWriter<SqliteConnection>);

impl WriteKind for Claims {
    type Req = StageClaim;
    type Resp = Option<JobRow>;

    type Key = String;

    fn key(req: &StageClaim) -> String {
        req.job_id.clone()
    }

    async fn run(&self, reqs: &[StageClaim]) -> StoreResult<Vec<Option<JobRow>>> {
        let args: Vec<ClaimArg> = reqs
            .iter()
            .map(|c| ClaimArg {
                id: &c.job_id,
                stage: c.stage.as_str(),
                epoch: c.epoch,
                node: &c.node,
                lease: c.lease_until.as_millis(),
                now: c.now.as_millis(),
            })
            .collect();
        let json = serde_json::to_string(&args).expect("claims serialise");
        let rows = self
            .0
            .write(false, move |conn: &mut SqliteConnection| {
                Box::pin(async move {
                    let rows: Vec<JobRow> = query(sql::CLAIM_MANY_SQLITE)
                        .bind(&json)
                        .fetch_all(conn)
                        .await?;
                    Ok(rows)
                })
            })
            .await?;
        let rows = rows.into_iter().map(|r| (r.id().to_string(), r)).collect();
        Ok(in_request_order(reqs, rows, |c| &c.job_id))
    }
}

/// Hand-offs as one write of the writer, [`sql::ADVANCE_MANY_SQLITE`], as claims.
pub(super) struct Advances(GroupWriter<SqliteConnection>);

impl WriteKind for Advances {
    type Req = StageAdvance;
    type Resp = Option<i64>;

    type Key = String;

    fn key(req: &StageAdvance) -> String {
        req.job_id.clone()
    }

    async fn run(&self, reqs: &[StageAdvance]) -> StoreResult<Vec<Option<i64>>> {
        let args: Vec<AdvanceArg> = reqs
            .iter()
            .map(|a| AdvanceArg {
                id: &a.job_id,
                stage: a.stage.as_str(),
                epoch: a.epoch,
                next: a.next.as_str(),
                now: a.now.as_millis(),
                route: a.route.as_deref(),
                output: &a.output,
                attempt: a.attempt,
            })
            .collect();
        let json = serde_json::to_string(&args).expect("hand-offs serialise");
        let rows = self
            .0
            .write(false, move |conn: &mut SqliteConnection| {
                Box::pin(async move {
                    let rows: Vec<(String, i64)> = query(sql::ADVANCE_MANY_SQLITE)
                        .bind(&json)
                        .fetch_all(conn)
                        .await?;
                    Ok(rows)
                })
            })
            .await?;
        Ok(in_request_order(reqs, rows, |a| &a.job_id))
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
        .map_err(|e| StoreError::GroupWrite(format!("the database setup lock's task failed: {e}")))?
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
    use crate::dialect::checks::{
        multi_row_writes_apply_each_to_its_own_job,
        upgrade_counts_existing_rewards_into_their_batches,
    };
    use crate::sql_store::SqlStore;
    use crate::write::ends::checks::{
        ends_of_whole_groups_in_one_statement_decide_each_once,
        several_ends_in_one_statement_apply_each_to_its_own_job,
    };

    /// The JSON-array statements apply each claim and hand-off to its own job only,
    /// under the one-row statements' conditions, answered in request order.
    #[tokio::test]
    async fn claims_and_hand_offs_of_several_jobs_in_one_statement_apply_each_to_its_own_job() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("r.db").display());
        let db = SqliteDb::connect(&url, 2).await.unwrap();
        db.migrate().await.unwrap();
        let writer = db.writer.clone();
        let store = SqlStore::new(db);
        multi_row_writes_apply_each_to_its_own_job(
            &store,
            &Claims(writer.clone()),
            &Advances(writer),
        )
        .await;
    }

    /// Several job ends in one statement apply each to its own job, and whole sampling
    /// groups ended together are decided as ending them one at a time decides them.
    #[tokio::test]
    async fn several_job_ends_in_one_statement_apply_each_to_its_own_job() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("r.db").display());
        let db = SqliteDb::connect(&url, 2).await.unwrap();
        db.migrate().await.unwrap();
        let store = SqlStore::new(db);
        several_ends_in_one_statement_apply_each_to_its_own_job(&store).await;
        ends_of_whole_groups_in_one_statement_decide_each_once(&store).await;
    }

    /// The lines of `statement`'s query plan on a fresh database that mention `jobs`,
    /// and the whole plan (for messages); `json_array`: the statement's one parameter,
    /// a JSON array, bound to an empty one.
    async fn plan_on_jobs(statement: &str, json_array: bool) -> (Vec<String>, String) {
        let plan = query_plan(statement, json_array, &[]).await;
        let jobs = plan
            .iter()
            .filter(|d| d.contains("jobs"))
            .cloned()
            .collect();
        (jobs, format!("{plan:?}"))
    }

    /// What `ANALYZE` recorded after the dashboard benchmark's million finished jobs
    /// (1% failed, none in flight), as `sqlite_stat1` rows: SQLite plans by these once
    /// a user or a tool has analyzed the database, and the store must not depend on
    /// nobody having done so.
    const MILLION_JOBS_STATS: &[&str] = &[
        "ANALYZE",
        "DELETE FROM sqlite_stat1",
        "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES \
         ('results', 'results_failures', '10000 1'), \
         ('results', 'results_minute', '1000000 1200'), \
         ('results', 'results_unpublished', '1000000 1000000 1'), \
         ('results', 'results_batch', '1000000 1000 1'), \
         ('results', 'sqlite_autoindex_results_1', '1000000 1'), \
         ('job_events', 'job_events_job', '2000000 2 1'), \
         ('jobs', 'jobs_unfinished', '0 0'), \
         ('jobs', 'jobs_finished', '1000000 1'), \
         ('jobs', 'jobs_group', '1000000 1000000'), \
         ('jobs', 'jobs_status', '1000000 500000 1'), \
         ('jobs', 'jobs_batch', '1000000 1000 1'), \
         ('jobs', 'sqlite_autoindex_jobs_2', '1000000 1000000'), \
         ('jobs', 'sqlite_autoindex_jobs_1', '1000000 1'), \
         ('batches', 'sqlite_autoindex_batches_1', '1000 1')",
        // Makes the connection read the statistics just written.
        "ANALYZE sqlite_schema",
    ];

    /// Whether a line of a query plan reads through the index `index`.
    fn uses_index(line: &str, index: &str) -> bool {
        let words: Vec<&str> = line.split(' ').collect();
        words.windows(2).any(|w| w[0] == "INDEX" && w[1] == index)
    }

    /// The lines of `statement`'s query plan on a fresh database after running `setup`
    /// on the planning connection (parameters unbound, but for `json_array` as in
    /// [`plan_on_jobs`]).
    async fn query_plan(statement: &str, json_array: bool, setup: &[&str]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("r.db").display());
        let db = SqliteDb::connect(&url, 2).await.unwrap();
        db.migrate().await.unwrap();
        let mut conn = db.reader().await.unwrap();
        for s in setup {
            sqlx::query(sqlx::AssertSqlSafe(*s))
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        let explain = format!("EXPLAIN QUERY PLAN {statement}");
        let mut plan = sqlx::query_as::<_, (i64, i64, i64, String)>(sqlx::AssertSqlSafe(explain));
        if json_array {
            plan = plan.bind("[]");
        }
        let plan = plan.fetch_all(&mut *conn).await.unwrap();
        plan.into_iter().map(|(.., detail)| detail).collect()
    }

    /// The multi-row statements look each job up by id. A plan that reaches `jobs`
    /// another way (through `jobs_status`, which SQLite prefers when it may) reads every
    /// queued job for each statement, so the statements' cost would grow with the
    /// backlog instead of with the batch.
    #[tokio::test]
    async fn multi_row_statements_find_their_jobs_by_id() {
        for statement in [
            sql::CLAIM_MANY_SQLITE,
            sql::ADVANCE_MANY_SQLITE,
            sql::FINISH_MANY_SQLITE,
        ] {
            let (jobs, plan) = plan_on_jobs(statement, true).await;
            assert_eq!(
                jobs,
                vec!["SEARCH jobs USING INDEX sqlite_autoindex_jobs_1 (id=?)"],
                "{plan}"
            );
        }
    }

    /// The metrics scrape's totals reach `jobs` only through an index of the live jobs
    /// (`jobs_unfinished`, or the live statuses of `jobs_status`), never by reading
    /// every job: on a database never analyzed and on one analyzed at a million jobs.
    #[tokio::test]
    async fn totals_read_only_live_jobs_through_their_index() {
        for setup in [&[][..], MILLION_JOBS_STATS] {
            let plan = query_plan(sql::TOTALS, false, setup).await;
            let jobs: Vec<&String> = plan.iter().filter(|l| l.contains("jobs")).collect();
            assert_eq!(jobs.len(), 1, "{plan:#?}");
            assert!(
                uses_index(jobs[0], "jobs_unfinished") || uses_index(jobs[0], "jobs_status"),
                "{plan:#?}"
            );
        }
    }

    /// The status page's reads reach `jobs` and `results` only through an index (a
    /// table scan of either reads every job or result there ever was, every time the
    /// page refreshes), each by the index made for it. On a database never analyzed,
    /// and on one analyzed at a million jobs (where SQLite, with only `jobs_status` to
    /// find queued and running jobs, chose to read every job for the stage queues).
    #[tokio::test]
    async fn dashboard_reads_reach_jobs_and_results_only_through_indexes() {
        for ((statement, index), setup) in [
            (sql::DASHBOARD_BATCHES, "batches_created"),
            (sql::DASHBOARD_QUEUES, "jobs_unfinished"),
            (sql::DASHBOARD_TIMINGS, "jobs_finished"),
            (sql::DASHBOARD_THROUGHPUT, "results_minute"),
            (sql::DASHBOARD_FAILURES, "results_failures"),
        ]
        .into_iter()
        .flat_map(|read| [(read, &[][..]), (read, MILLION_JOBS_STATS)])
        {
            let plan = query_plan(statement, false, setup).await;
            let scans: Vec<&String> = plan
                .iter()
                .filter(|l| {
                    let mut words = l.split(' ');
                    words.next() == Some("SCAN")
                        && matches!(words.next(), Some("jobs" | "results" | "j" | "r"))
                        && words.next() != Some("USING")
                })
                .collect();
            let analyzed = !setup.is_empty();
            assert!(
                scans.is_empty(),
                "{statement} (analyzed: {analyzed}): {plan:#?}"
            );
            assert!(
                plan.iter().any(|l| uses_index(l, index)),
                "{statement} (analyzed: {analyzed}): {plan:#?}"
            );
        }
    }

    /// Upgrading a database that has results counts their rewards into their batches
    /// (see the check).
    #[tokio::test]
    async fn the_upgrade_counts_existing_rewards_into_their_batches() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("r.db").display());
        let db = SqliteDb::connect(&url, 2).await.unwrap();
        crate::migrations::SQLITE.run_to(9, &db.pool).await.unwrap();
        upgrade_counts_existing_rewards_into_their_batches(&db).await;
    }

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
