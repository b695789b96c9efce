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
//! - [`generation`]: one model turn's generation (weight-update holds, aborts,
//!   versions), shared by the loop and the agent programs' endpoint.
//! - [`episode`]: the multi-turn loop itself.
//! - [`openai`], [`endpoint`]: the OpenAI-compatible endpoint an agent program written
//!   elsewhere calls, and the samples assembled from its calls.
//! - [`replay`]: an episode's recording played back against a fresh sandbox.

pub mod endpoint;
pub mod episode;
pub mod generation;
pub mod openai;
pub mod parse;
pub mod replay;
pub mod tools;
pub mod trajectory;

pub use rollout_model::{iteration, model, render, template, tokenizer};
