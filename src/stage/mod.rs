//! The stage contract: what the backbone asks of a task kind, and what a kind hands
//! back.
//!
//! The backbone knows nothing about sandboxes, models or graders. It claims a stage,
//! calls the task kind's hook for that stage with a [`StageContext`], and records what
//! the hook returns: an output handed to the next stage, a route for RUN, a reward from
//! EVAL, or a [`StageError`]. Timeouts, cancellation, retries and hand-offs are the
//! worker's business, so a kind's hooks are plain async functions that may be dropped at
//! any `.await` (when the stage times out or the job is cancelled) and must tolerate
//! being run again after a crash (a redelivered stage starts over).
//!
//! Kinds that hold node-local resources (a sandbox) route RUN to their node with
//! [`Route::ThisNode`] and release resources in [`TaskKind::cleanup`], which the worker
//! calls whenever a job ends while it holds one of its stages; [`sandboxed`] holds the
//! stage steps those kinds share (a sandbox made in INIT and kept for RUN and EVAL,
//! the export of its work, a fresh sandbox for grading).
//!
//! The kinds themselves live above (`kinds`, which also builds the registry of every
//! kind this build ships), and so does grading (`grading`), which the kinds' EVAL uses:
//! the worker and the gateway need only this contract.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::domain::Job;
pub use crate::domain::SpecError;

pub mod sandboxed;

/// Why a stage did not produce an output.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// A permanent failure: the job ends `failed` with this message.
    #[error("{0}")]
    Failed(String),
    /// A permanent failure that still produced output, e.g. the partial trajectory of an
    /// episode whose backends all died: the job ends `failed` with `message`, and
    /// `output` is kept as the result's output of the failing stage (RUN), so the
    /// trainer sees how far the rollout got.
    #[error("{message}")]
    FailedWith {
        /// What went wrong.
        message: String,
        /// What the stage produced before it failed.
        output: serde_json::Value,
    },
    /// A transient fault (a service unreachable, a resource busy): the stage is retried
    /// with backoff until the delivery limit, then the job fails with this message.
    #[error("{0}")]
    Transient(String),
    /// The node-local state this stage needs (the job's sandbox) is gone, or cannot be
    /// trusted: the job goes back to INIT to build it afresh, at most
    /// `sandbox.max_restarts` times, then fails with this message.
    #[error("{0}")]
    Restart(String),
    /// [`StageError::Restart`] of a stage that had finished its work when the sandbox
    /// failed (an episode over, its export lost with the sandbox): the job goes back to
    /// INIT like `Restart`; once the restarts are used up it ends `failed` with `output`
    /// kept as RUN's output, so a finished episode never ends with nothing recorded.
    #[error("{message}")]
    RestartWith {
        /// Why the sandbox is gone.
        message: String,
        /// What the stage produced.
        output: serde_json::Value,
    },
}

impl StageError {
    /// This error, keeping `output` where the error would otherwise lose it: a
    /// [`StageError::Restart`] becomes [`StageError::RestartWith`]; the others are
    /// returned as they are.
    pub fn keeping(self, output: serde_json::Value) -> StageError {
        match self {
            StageError::Restart(message) => StageError::RestartWith { message, output },
            other => other,
        }
    }
}

/// Where a job's RUN stage must happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Any RUN worker (nothing node-local was created).
    Any,
    /// A RUN worker on the node that ran INIT (its sandbox lives there).
    ThisNode,
}

/// What a stage hook sees.
#[derive(Debug, Clone)]
pub struct StageContext {
    /// The job as claimed for this stage (task, earlier stages' outputs, attempts).
    pub job: Job,
    /// The node the stage runs on.
    pub node: String,
    /// Fires when the job is cancelled or the worker must hand the stage back; a hook
    /// that does blocking or external work should watch it. Hooks are also dropped at
    /// their next `.await` in those cases.
    pub cancel: CancellationToken,
}

/// What INIT hands on.
#[derive(Debug, Clone)]
pub struct InitOutput {
    /// Stored on the job and given to RUN and EVAL.
    pub output: serde_json::Value,
    /// Where RUN must happen.
    pub route: Route,
}

/// What EVAL produces.
#[derive(Debug, Clone)]
pub struct EvalOutput {
    /// The reward.
    pub reward: f64,
    /// Scoring details returned with the result.
    pub details: serde_json::Value,
}

/// The code behind one task kind: a hook per stage.
#[async_trait]
pub trait TaskKind: Send + Sync + 'static {
    /// The kind's name as written in a task's `kind` field.
    fn name(&self) -> &'static str;

    /// Checks a task's `spec` at submit time, so bad input is refused before any job is
    /// written.
    fn validate(&self, spec: &serde_json::Value) -> Result<(), SpecError>;

    /// INIT: prepare what RUN needs.
    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError>;

    /// RUN: produce the episode's output.
    async fn run(&self, ctx: &StageContext) -> Result<serde_json::Value, StageError>;

    /// EVAL: score RUN's output.
    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError>;

    /// Whether a RUN stage handed back at shutdown must start again from INIT, because
    /// what it used (a sandbox, part-way through an episode) does not survive the
    /// hand-back. Such restarts do not count against `sandbox.max_restarts`.
    fn restart_on_hand_back(&self) -> bool {
        false
    }

    /// Releases node-local resources of a job that ended (cancelled, timed out, failed)
    /// while this node held one of its stages. Best effort; the default does nothing.
    async fn cleanup(&self, _job: &Job) {}
}

/// The task kinds a process knows, by name.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: HashMap<&'static str, Arc<dyn TaskKind>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.kinds.keys()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a kind.
    pub fn register(&mut self, kind: Arc<dyn TaskKind>) {
        self.kinds.insert(kind.name(), kind);
    }

    /// Looks a kind up by name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn TaskKind>> {
        self.kinds.get(name)
    }

    /// The names, sorted (for error messages).
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.kinds.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod stage_error_tests {
    use super::StageError;

    #[test]
    fn keeping_an_output_turns_only_a_restart_into_restart_with() {
        let out = serde_json::json!({"steps": [1]});
        match StageError::Restart("gone".into()).keeping(out.clone()) {
            StageError::RestartWith { message, output } => {
                assert_eq!((message.as_str(), output), ("gone", out.clone()));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            StageError::Transient("busy".into()).keeping(out),
            StageError::Transient(m) if m == "busy"
        ));
    }
}
