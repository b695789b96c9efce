//! Sandboxes: the [`rollout_sandbox`] crate (a sandbox on one machine, and the server
//! inside it), and what ties sandboxes to jobs across a cluster, which needs the store
//! and so lives in the service: [`node`], a node's sandboxes and their reaper, and
//! [`root`], where they live.

pub use rollout_sandbox::*;

pub mod node;
pub mod root;

pub use node::{LimitReport, NodeSandboxes, Purpose, SandboxReport};
