//! Durable job state: one [`Store`] trait, one implementation per database.
//!
//! The database is the source of truth for every job; the queue only carries hand-offs.
//! Every stage transition is a compare-and-set on the job row (`WHERE id = $1 AND stage
//! = $2 AND epoch = $3 …`), so a redelivered or duplicated message can never apply a
//! transition twice, and every terminal transition writes the job's single result and
//! updates its batch and group counters in the same transaction.
//!
//! [`sqlite::SqliteStore`] (the embedded default: WAL, a long busy timeout and `BEGIN
//! IMMEDIATE` for writing transactions) and [`postgres::PostgresStore`] (for many nodes)
//! share their SQL text, which is written in the dialect both accept (`$N` parameters,
//! `RETURNING`, `ON CONFLICT`), through the `impl_store!`
//! macro; each backend supplies only how it opens a writing transaction and how it orders
//! result sequence numbers.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::{
    BatchCounters, GroupCounters, Job, JobResult, Outcome, Stage, Status, WorkMessage,
};

pub mod postgres;
mod rows;
mod shared;
pub mod sqlite;

pub(crate) use shared::impl_store;

/// A database failure. Callers treat these as transient (retry or nak) unless stated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or rejected a statement.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying migrations failed (a migration was edited after it was applied, or the
    /// database is newer than this binary).
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value could not be decoded; the row was written by an incompatible version.
    #[error("corrupt row in the database: {0}")]
    Corrupt(String),
    /// The SQLite write batch this op was part of could not be committed.
    #[error("database write failed: {0}")]
    Batch(String),
    /// The store's writer has stopped (the process is shutting down).
    #[error("database writer stopped")]
    Closed,
    /// The database URL is not one this build supports.
    #[error("unsupported database URL `{0}`: use sqlite://PATH or postgres://USER@HOST/DB")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// Whether the database refused the statement itself (a value it cannot store, a
    /// constraint), as opposed to not being reachable: the same statement will be
    /// refused again, so retrying it is pointless.
    pub fn is_rejected(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(_)))
            || matches!(self, StoreError::Corrupt(_))
    }

    /// Whether the database aborted the transaction because it collided with another
    /// (Postgres's deadlock or serialization failure): the same transaction may
    /// succeed when run again.
    pub fn is_conflict(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40P01") | Some("40001"))
            }
            _ => false,
        }
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

/// A job to insert at submit time (already validated).
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Fresh job id.
    pub id: String,
    /// Task kind.
    pub kind: String,
    /// Caller's idempotency key.
    pub client_id: Option<String>,
    /// Prompt group.
    pub group_id: Option<String>,
    /// The task JSON as submitted.
    pub task: serde_json::Value,
}

/// What submit did with one task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// The job's id (the existing one for a repeated `client_id`).
    pub id: String,
    /// The caller's key, echoed.
    pub client_id: Option<String>,
    /// The job's status now.
    pub status: Status,
    /// Its current stage.
    pub stage: Stage,
    /// Its stage-entry counter (needed to re-publish its message).
    #[serde(skip)]
    pub epoch: i64,
    /// True when the `client_id` already existed and no new job was created.
    pub duplicate: bool,
}

/// Result of trying to start a stage.
#[derive(Debug, Clone)]
pub enum Claim {
    /// The job is now `running` in this stage under a fresh lease; go ahead.
    Started(Box<Job>),
    /// The message is stale: the job has moved on or ended. Carries the job as it is.
    Stale(Box<Job>),
    /// Another delivery holds a live lease on this stage until the given time (epoch ms).
    Busy(i64),
    /// No such job.
    Missing,
}

/// Which jobs a terminal transition may apply to.
#[derive(Debug, Clone)]
pub enum FinishIf {
    /// Only if the job is still in this stage entry under this claim (`attempt` is the
    /// job's `attempts` right after the claim): the worker holding the stage ends it.
    Claimed {
        /// The stage entry.
        msg: WorkMessage,
        /// The claim's token.
        attempt: i64,
    },
    /// Only if the job is still in this stage entry and nobody holds a live lease on it:
    /// giving up on a message nobody is working on.
    Unleased(WorkMessage),
    /// Whenever the job is live (used by cancel).
    Live,
}

/// Filter and page of `GET /v1/jobs`.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    /// Only this batch.
    pub batch: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Return ids greater than this (the previous page's last id).
    pub cursor: Option<String>,
    /// Page size.
    pub limit: i64,
}

/// One line of `rollout status`: how many jobs have this status in this stage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatusCount {
    /// Status.
    pub status: Status,
    /// Stage.
    pub stage: Stage,
    /// Number of jobs.
    pub count: i64,
}

/// One entry of a job's event log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    /// When (epoch ms).
    pub at: i64,
    /// A status name for transitions, or a named event such as `republished`.
    pub event: String,
    /// Stage at the time.
    pub stage: Option<String>,
    /// Stage-entry counter at the time.
    pub epoch: Option<i64>,
    /// Attempt counter at the time.
    pub attempt: Option<i64>,
    /// Node involved.
    pub node: Option<String>,
    /// Error text or other detail.
    pub detail: Option<String>,
}

/// A job whose hand-off may have been lost, for the reconciler to re-publish.
#[derive(Debug, Clone)]
pub struct StaleJob {
    /// The message to re-publish.
    pub msg: WorkMessage,
    /// Where RUN goes (`any` or a node), for RUN messages.
    pub route: Option<String>,
    /// `queued` (its message may be lost) or `running` (its lease lapsed and no
    /// redelivery took it over: its message is lost or out of deliveries).
    pub status: Status,
    /// Stage starts so far.
    pub attempts: i64,
}

/// A job waiting for RUN on a node that stopped renewing its sandbox's lease.
#[derive(Debug, Clone)]
pub struct AbandonedRun {
    /// The job's RUN stage entry.
    pub msg: WorkMessage,
    /// Times it was sent back to INIT already.
    pub restarts: i64,
    /// The node that held its sandbox.
    pub node: String,
}

/// A live sandbox as the database knows it: which node holds it and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct SandboxRecord {
    /// The job it belongs to (one sandbox per job at a time).
    pub job_id: String,
    /// The node it runs on.
    pub node: String,
    /// `local`, `bwrap` or `apptainer`.
    pub backend: String,
    /// Its directory on that node.
    pub dir: String,
    /// Its socket on that node.
    pub socket: String,
    /// Until when (epoch ms) the node vouches for it; renewed by the node's reaper.
    pub lease_until: i64,
    /// When it was recorded.
    pub created_at: i64,
}

/// Durable job state. Implemented for SQLite and Postgres; all methods are safe to call
/// from many processes at once.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> StoreResult<()>;
    /// Checks the database answers.
    async fn ping(&self) -> StoreResult<()>;
    /// Inserts jobs in one transaction, creating the batch and groups as needed. A task
    /// whose `client_id` exists already returns that job with `duplicate = true`.
    async fn submit(
        &self,
        batch_id: &str,
        jobs: &[NewJob],
        now: i64,
    ) -> StoreResult<Vec<Submitted>>;
    /// One job.
    async fn job(&self, id: &str) -> StoreResult<Option<Job>>;
    /// A page of jobs in id (= creation) order.
    async fn list_jobs(&self, q: &JobQuery) -> StoreResult<Vec<Job>>;
    /// Starts the stage named by `msg` on `node` with a lease until `lease_until`.
    async fn claim(
        &self,
        msg: &WorkMessage,
        node: &str,
        lease_until: i64,
        now: i64,
    ) -> StoreResult<Claim>;
    /// Extends the lease of a running stage; false when the job is no longer running in
    /// that stage entry (cancelled, or taken over), which tells the worker to stop.
    async fn extend_lease(
        &self,
        msg: &WorkMessage,
        lease_until: i64,
        now: i64,
    ) -> StoreResult<bool>;
    /// Records the output of the claim `attempt` of a stage and queues the job for the next
    /// stage; returns the next stage's message, or `None` if the compare-and-set failed
    /// (the job moved on or was taken over).
    async fn advance(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        output: &serde_json::Value,
        route: Option<&str>,
        now: i64,
    ) -> StoreResult<Option<WorkMessage>>;
    /// Hands the claim `attempt` of a running stage back to the queue: after a transient
    /// fault (the start counts towards the delivery limit) or, with `hand_back`, because
    /// the worker is shutting down (it does not).
    async fn release(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        hand_back: bool,
        now: i64,
    ) -> StoreResult<bool>;
    /// Ends the job with `outcome` if `cond` holds, writing its result and updating the
    /// batch and group counters in the same transaction. `None` if the condition failed.
    /// An end the database refuses (for what the job's data holds) is recorded instead as
    /// a failure whose error gives the reason, without the output, so that no job is
    /// retried for ever; only a database that cannot be reached is an error.
    async fn finish(
        &self,
        cond: &FinishIf,
        job_id: &str,
        outcome: &Outcome,
        now: i64,
    ) -> StoreResult<Option<JobResult>>;
    /// Results with `seq > after`, in `seq` order: at most `limit`, and no more than fit
    /// in `max_bytes` of stored output and error (but at least one, however large).
    async fn results_after(
        &self,
        batch: Option<&str>,
        after: i64,
        limit: i64,
        max_bytes: i64,
    ) -> StoreResult<Vec<JobResult>>;
    /// The result of one job.
    async fn result(&self, job_id: &str) -> StoreResult<Option<JobResult>>;
    /// Marks results as published on the results stream. This is bookkeeping for the
    /// reconciler, which re-publishes unmarked results (deduplicated by the server), so a
    /// backend may apply it shortly after returning (SQLite coalesces marks).
    async fn mark_published(&self, seqs: &[i64], now: i64) -> StoreResult<()>;
    /// Results not yet marked published that were written before `before`.
    async fn unpublished_results(&self, before: i64, limit: i64) -> StoreResult<Vec<JobResult>>;
    /// Live jobs with no change since `before` (queued) or whose lease ended before it
    /// (running), oldest first.
    async fn stale_jobs(&self, before: i64, limit: i64) -> StoreResult<Vec<StaleJob>>;
    /// Queued jobs handed off between `since` and `before` and not touched since, oldest
    /// first: hand-offs whose message may have been lost with the process that wrote
    /// them (see the reconciler), each listed once.
    async fn overdue_handoffs(
        &self,
        before: i64,
        since: i64,
        limit: i64,
    ) -> StoreResult<Vec<StaleJob>>;
    /// Marks a queued job as just re-published, so the next sweep skips it.
    async fn touch(&self, msg: &WorkMessage, now: i64) -> StoreResult<bool>;
    /// Puts a running job whose lease lapsed back in the queue under a new stage entry
    /// (so its new message gets a new id and fresh deliveries); `None` if it moved on.
    async fn requeue(&self, msg: &WorkMessage, now: i64) -> StoreResult<Option<WorkMessage>>;
    /// Sends the claim `attempt` of a running stage back to INIT under a new stage entry,
    /// because the node-local state it needed is gone; `None` if the claim no longer
    /// holds or the job was sent back `max_restarts` times already. An uncounted restart
    /// (a graceful hand-back) leaves the job's `restarts` as it is.
    async fn restart(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        max_restarts: i64,
        counted: bool,
        now: i64,
    ) -> StoreResult<Option<WorkMessage>>;
    /// Jobs queued for RUN whose sandbox's lease ended before `before` (their node is
    /// gone), oldest lease first.
    async fn abandoned_runs(&self, before: i64, limit: i64) -> StoreResult<Vec<AbandonedRun>>;
    /// Sends a job still queued for RUN in the stage entry `msg` back to INIT, unless it
    /// was sent back `max_restarts` times already; `None` if it moved on or ran out.
    async fn restart_queued(
        &self,
        msg: &WorkMessage,
        max_restarts: i64,
        now: i64,
    ) -> StoreResult<Option<WorkMessage>>;
    /// Records (or replaces) a job's sandbox.
    async fn put_sandbox(&self, sandbox: &SandboxRecord) -> StoreResult<()>;
    /// A job's sandbox, if one is recorded.
    async fn sandbox(&self, job_id: &str) -> StoreResult<Option<SandboxRecord>>;
    /// Forgets a job's sandbox (after it was stopped).
    async fn delete_sandbox(&self, job_id: &str) -> StoreResult<()>;
    /// A node's sandboxes whose job ended (or is unknown). Lapsed leases are not a reason
    /// here: the node's own reaper renews every lease first, and the reconciler handles
    /// the sandboxes of nodes that stopped renewing.
    async fn sandboxes_to_reap(&self, node: &str) -> StoreResult<Vec<SandboxRecord>>;
    /// All of a node's recorded sandboxes.
    async fn sandboxes_of_node(&self, node: &str) -> StoreResult<Vec<SandboxRecord>>;
    /// Renews until `lease_until` the leases of all of a node's sandboxes (`now` is the
    /// caller's clock, for the record).
    async fn renew_sandboxes(&self, node: &str, lease_until: i64, now: i64) -> StoreResult<u64>;
    /// Job counts by status and stage.
    async fn counts(&self, batch: Option<&str>) -> StoreResult<Vec<StatusCount>>;
    /// A batch's counters.
    async fn batch(&self, id: &str) -> StoreResult<Option<BatchCounters>>;
    /// A prompt group's counters.
    async fn group(&self, batch_id: &str, id: &str) -> StoreResult<Option<GroupCounters>>;
    /// Registers `spec` (from `source`: `config` or `api`), or replaces the backend of
    /// that id; a backend whose URL is unchanged keeps its health.
    async fn upsert_backend(
        &self,
        spec: &crate::domain::backend::BackendSpec,
        source: &str,
        now: i64,
    ) -> StoreResult<()>;
    /// Unregisters a backend; false when unknown. Jobs assigned to it keep their rows
    /// until they end or move: their next failed request moves them elsewhere.
    async fn delete_backend(&self, id: &str) -> StoreResult<bool>;
    /// Every backend with its active count, by id.
    async fn backends(&self) -> StoreResult<Vec<crate::domain::backend::BackendState>>;
    /// One backend.
    async fn backend(&self, id: &str) -> StoreResult<Option<crate::domain::backend::BackendState>>;
    /// Records a health verdict; returns the previous one (`None`: unknown backend), so
    /// callers can log changes.
    async fn set_backend_health(
        &self,
        id: &str,
        healthy: bool,
        error: Option<&str>,
        now: i64,
    ) -> StoreResult<Option<bool>>;
    /// Gives the job a backend in one transaction: the one it has when that is healthy,
    /// not excluded and of the wanted model (sticky), else one chosen by
    /// [`crate::domain::placement::choose`] from the healthy ones, recorded as its
    /// assignment. `None` (and no assignment) when no backend qualifies. Assignments are
    /// deleted by the database when the job leaves RUN or ends.
    async fn assign_backend(
        &self,
        req: &crate::domain::placement::AssignRequest,
        now: i64,
    ) -> StoreResult<Option<crate::domain::placement::Assignment>>;
    /// Forgets where prompt groups last ran for groups not placed since `before`; returns
    /// how many were forgotten.
    async fn forget_group_homes(&self, before: i64) -> StoreResult<u64>;
    /// Deletes a job's assignment (jobs that are not rows of this database, such as a
    /// benchmark's, release their own).
    async fn release_backend(&self, job_id: &str) -> StoreResult<()>;
    /// A job's event log, oldest first.
    async fn events(&self, job_id: &str) -> StoreResult<Vec<JobEvent>>;
    /// Appends a named event (one that is not a status change) to a job's log.
    async fn record_event(
        &self,
        job_id: &str,
        event: &str,
        stage: Option<Stage>,
        node: Option<&str>,
        detail: Option<&str>,
        now: i64,
    ) -> StoreResult<()>;
}

/// Opens the database named by `url` (`sqlite:…` or `postgres://…`) and applies
/// migrations.
pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Arc<dyn Store>> {
    let store: Arc<dyn Store> = if url.starts_with("sqlite:") {
        Arc::new(sqlite::SqliteStore::connect(url, max_connections).await?)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Arc::new(postgres::PostgresStore::connect(url, max_connections).await?)
    } else {
        return Err(StoreError::UnsupportedUrl(crate::config::redact_url(url)));
    };
    store.migrate().await?;
    Ok(store)
}
