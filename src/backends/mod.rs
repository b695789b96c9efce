//! Inference backends: the servers that run the policy model (vLLM, SGLang).
//!
//! - [`wire`]: their request and response formats, token-in and token-out.
//! - [`client`]: the HTTP client (pooled connections, timeouts, retries, abort).
//! - [`pool`]: which backend a job uses: registration, health, sticky and group-affine
//!   assignment with counts kept in the database.
//! - [`control`]: pausing and resuming generation at the servers for a weight update.
//! - [`generate`]: what the agent loop asks of inference (the [`generate::Generator`]
//!   trait), implemented by a job's session.
//! - [`session`]: a job's assigned backend across its turns, and the move off a dead one.

pub mod client;
pub mod control;
pub mod generate;
pub mod pool;
pub mod session;
pub mod wire;
