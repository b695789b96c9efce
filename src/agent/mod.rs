//! The agent loop's building blocks: how a conversation becomes the exact prompt a policy
//! model was trained on.
//!
//! - [`template`]: chat templates rendered as transformers renders them.

pub mod template;
