//! The `rollout` binary's commands that talk to a gateway: jobs, results, batches and
//! what they print. Part of the binary, not the library: each is a few lines over
//! [`rollout::client::Client`], and prints for a person (aligned tables, sentences)
//! or, where asked, JSON lines for a program.

pub mod batches;
pub mod jobs;
pub mod table;
pub mod tasks;
