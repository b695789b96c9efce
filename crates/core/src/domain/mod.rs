//! Domain types: jobs, their stages and statuses, submitted tasks and results.
//!
//! These are the words the whole system shares. A *task* is what a trainer submits; the
//! service turns each task into a *job* that moves through the [`Stage`]s INIT → RUN →
//! EVAL and ends in exactly one terminal [`Status`], at which point a *result* is written
//! and published.
//!
//! The bottom layer: nothing here uses another module of the crate. Besides the job
//! types: [`backend`] (inference servers as registered), [`placement`] (which backend a
//! job goes to, a pure decision), [`sandbox`] (runtimes, limits, networks) and
//! [`parser`] (tool-call syntaxes), each shared by the configuration, the store and the
//! components that act on them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub mod backend;
pub mod parser;
pub mod placement;
pub mod policy;
pub mod sampling;
pub mod sandbox;
pub mod time;

pub use time::{EpochMs, duration_ms, duration_us};

/// One of the three pipeline stages a job passes through, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Prepare the workspace and sandbox.
    Init,
    /// Drive the policy model through the episode.
    Run,
    /// Score the outcome.
    Eval,
}

impl Stage {
    /// All stages in pipeline order.
    pub const ALL: [Stage; 3] = [Stage::Init, Stage::Run, Stage::Eval];

    /// The lowercase name used in the database, subjects and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Init => "init",
            Stage::Run => "run",
            Stage::Eval => "eval",
        }
    }

    /// The stage after this one, or `None` after EVAL (the job then ends).
    pub fn next(self) -> Option<Stage> {
        match self {
            Stage::Init => Some(Stage::Run),
            Stage::Run => Some(Stage::Eval),
            Stage::Eval => None,
        }
    }

    /// Parses a stage name as stored in the database.
    pub fn parse(s: &str) -> Option<Stage> {
        match s {
            "init" => Some(Stage::Init),
            "run" => Some(Stage::Run),
            "eval" => Some(Stage::Eval),
            _ => None,
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A job's status. `queued` and `running` are live; the other four are terminal and a
/// job reaches exactly one of them, exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting in a stage's queue.
    Queued,
    /// A worker holds the job's current stage.
    Running,
    /// All stages finished and a reward was given.
    Done,
    /// A stage reported an error, or the job exhausted its deliveries.
    Failed,
    /// Cancelled through the API before it finished.
    Cancelled,
    /// A stage exceeded its timeout.
    TimedOut,
    /// Scored, but its oldest model token came from a policy version older than the
    /// task's `max_staleness` allowed when it finished: kept, with its reward and
    /// trajectory, for inspection, and not a training sample (a sampling batch replaces
    /// its group).
    Stale,
}

impl Status {
    /// All statuses, live ones first.
    pub const ALL: [Status; 7] = [
        Status::Queued,
        Status::Running,
        Status::Done,
        Status::Failed,
        Status::Cancelled,
        Status::TimedOut,
        Status::Stale,
    ];

    /// The snake-case name used in the database and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::TimedOut => "timed_out",
            Status::Stale => "stale",
        }
    }

    /// Parses a status name as stored in the database or given in a query.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the job has ended; terminal statuses never change again.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Queued | Status::Running)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A task as a trainer submits it: an envelope the backbone understands plus a
/// kind-specific `spec` that only the task kind interprets.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// The task kind, e.g. `"synthetic"`; selects the code that runs each stage. (The
    /// served document lists the kinds this service knows.)
    pub kind: String,
    /// Optional caller-chosen id that makes the submit idempotent: submitting a task whose
    /// `client_id` already exists returns the existing job instead of creating another.
    /// 1-256 characters, no control characters.
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub client_id: Option<String>,
    /// Optional prompt group (the G samples of one prompt); counters are kept per group.
    /// 1-256 characters, no control characters.
    #[serde(default)]
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")]
    pub group_id: Option<String>,
    /// Kind-specific parameters, validated by the kind at submit time.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub spec: serde_json::Value,
    /// Free-form caller metadata (an object, or null for none), returned untouched with
    /// the result.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: serde_json::Value,
    /// The staleness bound, in policy versions: when the job finishes, a sample whose
    /// oldest model token came from a version more than this older than the current one
    /// ends `stale` instead of `done` (kept, not a training sample). `0` is on-policy
    /// only. Absent: no bound. Samples without versions (none announced) are never
    /// stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub max_staleness: Option<i64>,
}

impl Task {
    /// A task of `kind` with `spec` and no client id, group or metadata.
    pub fn new(kind: &str, spec: serde_json::Value) -> Self {
        Task {
            kind: kind.to_string(),
            client_id: None,
            group_id: None,
            spec,
            metadata: serde_json::Value::Null,
            max_staleness: None,
        }
    }
}

/// The message carried on a stage subject. It names the job and the exact stage entry
/// (`epoch`) it is for, so a stale or duplicated message can be recognised and dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkMessage {
    /// The job this message moves.
    pub job_id: String,
    /// The stage the job is queued for.
    pub stage: Stage,
    /// The job's stage-entry counter when this message was published.
    pub epoch: i64,
}

impl WorkMessage {
    /// The `Nats-Msg-Id` used when publishing: the same hand-off always gets the same id,
    /// so JetStream drops a re-publish inside its duplicate window.
    pub fn msg_id(&self) -> String {
        format!("{}:{}:{}", self.job_id, self.stage, self.epoch)
    }
}

/// The full state of a job as stored.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Job {
    /// Job id (a UUIDv7 string, so ids sort by creation time).
    pub id: String,
    /// The batch the job belongs to.
    pub batch_id: String,
    /// The prompt group, if any.
    pub group_id: Option<String>,
    /// The caller's idempotency key, if any.
    pub client_id: Option<String>,
    /// Task kind.
    pub kind: String,
    /// The submitted task.
    #[schema(value_type = Object)]
    pub task: serde_json::Value,
    /// Current status.
    pub status: Status,
    /// Current (or, for a terminal job, last) stage.
    pub stage: Stage,
    /// Stage-entry counter; increases every time the job is queued into a stage.
    pub epoch: i64,
    /// How many times a worker has started a stage of this job (redeliveries included).
    /// It also identifies the current claim: statements of a running stage match it.
    pub attempts: i64,
    /// Starts of the current stage entry; the delivery limit applies to it. A graceful
    /// hand-back (SIGTERM) does not count.
    pub stage_attempts: i64,
    /// Times the job was sent back to INIT because what RUN needed (its sandbox) was gone.
    pub restarts: i64,
    /// The node that last worked on the job (and owns its sandbox during RUN).
    pub node: Option<String>,
    /// Where RUN must happen: a node name, or `any`.
    pub route: Option<String>,
    /// Until when (epoch ms) the worker running the current stage holds it; a redelivery
    /// may take the stage over after that.
    pub lease_until: Option<i64>,
    /// Output of INIT, handed to RUN and EVAL.
    #[schema(value_type = Option<Object>)]
    pub init_output: Option<serde_json::Value>,
    /// Output of RUN, handed to EVAL.
    #[schema(value_type = Option<Object>)]
    pub run_output: Option<serde_json::Value>,
    /// Error text of a failed, timed-out or cancelled job.
    pub error: Option<String>,
    /// Per-stage timings.
    pub timings: Timings,
    /// Submission time (epoch ms).
    pub created_at: i64,
    /// Last change (epoch ms).
    pub updated_at: i64,
    /// When the job reached its terminal status (epoch ms).
    pub finished_at: Option<i64>,
    /// In lists of jobs (`GET /v1/jobs`): its result's reward, once it has one, so a
    /// batch's jobs can be read with their rewards without fetching every result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// In lists of jobs: its result's finish reason (see the trajectory's), when its
    /// episode has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// Epoch-millisecond timestamps of each stage: when it was queued, started and finished.
/// Queue wait is `started - queued`; stage duration is `finished - started`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Timings {
    /// INIT timestamps.
    pub init: StageTimes,
    /// RUN timestamps.
    pub run: StageTimes,
    /// EVAL timestamps.
    pub eval: StageTimes,
}

/// The three timestamps of one stage (epoch ms); absent until reached.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct StageTimes {
    /// Published to the stage's subject.
    pub queued_at: Option<i64>,
    /// A worker started the stage (the latest start, after redeliveries).
    pub started_at: Option<i64>,
    /// The stage's outcome was recorded.
    pub finished_at: Option<i64>,
}

/// What a terminal transition records: the job's final status and its result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The terminal status.
    pub status: Status,
    /// Reward given by EVAL (only for `done`).
    pub reward: Option<f64>,
    /// Error text (for `failed`, `timed_out`, `cancelled`).
    pub error: Option<String>,
    /// EVAL's output (scoring details), if it ran.
    pub eval_output: Option<serde_json::Value>,
    /// What RUN produced before it failed (a partial trajectory), kept as the result's
    /// `run` output; `None` keeps what the job row holds.
    pub run_output: Option<serde_json::Value>,
}

impl Outcome {
    /// EVAL scored the job: `done` with its reward and EVAL's details.
    pub fn done(reward: f64, eval_output: serde_json::Value) -> Self {
        Self {
            status: Status::Done,
            reward: Some(reward),
            error: None,
            eval_output: Some(eval_output),
            run_output: None,
        }
    }

    /// The job ends without a reward, as `status` (`failed`, `timed_out` or
    /// `cancelled`), for the reason `error`.
    pub fn ended(status: Status, error: impl Into<String>) -> Self {
        Self {
            status,
            reward: None,
            error: Some(error.into()),
            eval_output: None,
            run_output: None,
        }
    }

    /// The job failed for the reason `error`.
    pub fn failed(error: impl Into<String>) -> Self {
        Self::ended(Status::Failed, error)
    }

    /// The job was cancelled for the reason `error`.
    pub fn cancelled(error: impl Into<String>) -> Self {
        Self::ended(Status::Cancelled, error)
    }

    /// Keeps `run_output` (what RUN produced before the end) as the result's `run`
    /// output instead of what the job row holds.
    pub fn with_run_output(mut self, run_output: Option<serde_json::Value>) -> Self {
        self.run_output = run_output;
        self
    }
}

/// A result as stored and delivered to trainers: one per job, written when the job ends.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobResult {
    /// Position in the global result order; results are delivered in increasing `seq`,
    /// and `seq` is the cursor for `GET /v1/results`.
    pub seq: i64,
    /// The job.
    pub job_id: String,
    /// Its batch.
    pub batch_id: String,
    /// Its prompt group.
    pub group_id: Option<String>,
    /// The caller's idempotency key.
    pub client_id: Option<String>,
    /// The terminal status.
    pub status: Status,
    /// Reward from EVAL; absent unless `status` is `done` (or `stale`: scored, and kept
    /// for inspection).
    pub reward: Option<f64>,
    /// Error text for failed, timed-out and cancelled jobs.
    pub error: Option<String>,
    /// Everything the stages produced, including partial output of a job that did not
    /// finish: `{"init": …, "run": …, "eval": …}` plus the task's `metadata`.
    #[schema(value_type = Object)]
    pub output: serde_json::Value,
    /// When the result was written (epoch ms).
    pub created_at: i64,
}

/// Counters of one batch, updated in the same transaction as each result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct BatchCounters {
    /// Batch id.
    pub id: String,
    /// Jobs submitted to the batch.
    pub submitted: i64,
    /// Jobs of the batch that ended (any terminal status).
    pub finished: i64,
    /// Jobs that ended `done`.
    pub done: i64,
    /// Jobs that ended `failed`.
    pub failed: i64,
    /// Jobs that ended `cancelled`.
    pub cancelled: i64,
    /// Jobs that ended `timed_out`.
    pub timed_out: i64,
    /// Jobs that ended `stale`: scored, but older than their `max_staleness` allowed.
    #[serde(default)]
    pub stale: i64,
    /// When the trainer cancelled the batch (epoch ms): from then on none of its jobs
    /// starts a stage or is scored, and those left are cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    /// Why it ended: the error its cancelled jobs carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
}

/// Counters of one prompt group: how many samples finished and the spread of their
/// rewards, which dynamic sampling uses to tell informative groups from uniform ones.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct GroupCounters {
    /// Group id.
    pub id: String,
    /// Batch id.
    pub batch_id: String,
    /// Jobs submitted to the group.
    pub submitted: i64,
    /// Jobs of the group that ended.
    pub finished: i64,
    /// Jobs of the group that ended `done` with a reward.
    pub rewarded: i64,
    /// Sum of rewards.
    pub reward_sum: f64,
    /// Smallest reward seen.
    pub reward_min: Option<f64>,
    /// Largest reward seen.
    pub reward_max: Option<f64>,
}

/// Characters allowed in ids that become NATS subject tokens (batch ids, node names).
pub fn is_subject_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A problem in a task's `spec`, found at submit time.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SpecError {
    /// Path of the offending field inside `spec`, e.g. `run_ms` (empty for the whole spec).
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl SpecError {
    /// A problem at `path` (a field's path inside `spec`), saying what is wrong.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Parses `spec` into `T`, reporting the path of the first bad field.
    pub fn parse<T: serde::de::DeserializeOwned>(spec: &serde_json::Value) -> Result<T, SpecError> {
        let spec = if spec.is_null() {
            serde_json::Value::Object(Default::default())
        } else {
            spec.clone()
        };
        Self::decode(spec)
    }

    /// Decodes `value` into `T` (taking it, so a large one is not copied), reporting the
    /// path of the first bad field.
    pub fn decode<T: serde::de::DeserializeOwned>(
        value: serde_json::Value,
    ) -> Result<T, SpecError> {
        serde_path_to_error::deserialize(value).map_err(|e| SpecError {
            path: e.path().to_string().trim_start_matches('.').to_string(),
            message: e.inner().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_chain_in_order() {
        assert_eq!(Stage::Init.next(), Some(Stage::Run));
        assert_eq!(Stage::Run.next(), Some(Stage::Eval));
        assert_eq!(Stage::Eval.next(), None);
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn statuses_round_trip_and_terminality() {
        for s in Status::ALL {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert!(!Status::Queued.is_terminal());
        assert!(!Status::Running.is_terminal());
        assert!(Status::TimedOut.is_terminal());
        assert_eq!(
            serde_json::to_string(&Status::TimedOut).unwrap(),
            "\"timed_out\""
        );
    }

    #[test]
    fn msg_id_names_job_stage_and_epoch() {
        let m = WorkMessage {
            job_id: "j".into(),
            stage: Stage::Run,
            epoch: 3,
        };
        assert_eq!(m.msg_id(), "j:run:3");
    }

    #[test]
    fn subject_tokens() {
        assert!(is_subject_token("batch-1_a"));
        assert!(!is_subject_token("a.b"));
        assert!(!is_subject_token("a b"));
        assert!(!is_subject_token(""));
        assert!(!is_subject_token("*"));
    }
}
