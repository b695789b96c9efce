//! The `rollout` binary's command line ([`args`]) and its commands: those that run the
//! service ([`services`]), those that talk to a gateway (jobs, results, batches,
//! status, replay, backends) and what they print, and [`template`], which shows what
//! the service makes of a model. Part of the binary, not the library:
//! each is a few lines over the library (most over [`rollout::client::Client`]), and
//! prints for a person (aligned tables, sentences) or, where asked, JSON lines for a
//! program.

pub mod args;
pub mod backends;
pub mod batches;
pub mod jobs;
pub mod replay;
pub mod services;
pub mod status;
pub mod table;
pub mod tasks;
pub mod template;
