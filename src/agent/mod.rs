//! The agent loop's building blocks: how a conversation becomes the exact prompt a policy
//! model was trained on.
//!
//! - [`template`], [`iteration`], [`tokenizer`], [`model`], [`render`]: a model's
//!   files (tokenizer and chat template) and rendering conversations with them as
//!   transformers does; the crate `rollout-model`, re-exported here, which the stand-in
//!   server uses too.
//! - [`parse`]: tool-call parsers (Hermes `<tool_call>` blocks, one bash block per turn).
//! - [`tools`]: the tools offered to the model and how results become observations.
//! - [`trajectory`]: what an episode hands the trainer.
//! - [`episode`]: the multi-turn loop itself.

pub mod episode;
pub mod parse;
pub mod tools;
pub mod trajectory;

pub use rollout_model::{iteration, model, render, template, tokenizer};
