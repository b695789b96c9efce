//! Task kinds: the code that gives a job's stages their meaning, each a
//! [`TaskKind`](crate::stage::TaskKind) (the contract is `stage`'s).
//!
//! - [`synthetic`]: no sandbox, no model: a stand-in for measuring the backbone.
//! - [`shell`]: a fixed list of tool calls replayed in a sandbox, graded as `agent`'s
//!   episodes are.
//! - [`agent`]: the built-in multi-turn tool-using episode against the policy model,
//!   in a sandbox, graded by `grading`.
//! - [`agent_program`]: an agent written elsewhere, run in the sandbox against a
//!   per-episode model endpoint.

use std::sync::Arc;

use crate::stage::Registry;

pub mod agent;
pub mod agent_program;
pub mod shell;
pub mod synthetic;

/// Every kind this build ships; the sandboxed ones use this node's `sandboxes`, and
/// `agent` the backend pool and the jobs in `store` (each kind is handed only the
/// concerns it uses) with `settings`' defaults, tagging model tokens with `policy`'s
/// current version.
pub fn builtin(
    sandboxes: Arc<crate::sandbox::NodeSandboxes>,
    store: Arc<dyn crate::store::Store>,
    settings: Arc<crate::config::Settings>,
    policy: crate::policy::PolicyWatch,
) -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(synthetic::Synthetic));
    r.register(Arc::new(shell::Shell::new(sandboxes.clone())));
    let agent = Arc::new(agent::Agent::new(
        sandboxes,
        store.clone(),
        store,
        settings,
        policy,
    ));
    r.register(agent.clone());
    r.register(Arc::new(agent_program::AgentProgram::new(agent)));
    r
}
