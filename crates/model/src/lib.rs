//! A policy model's files as the agent loop and the stand-in server need them: the
//! tokenizer and the chat template, and conversations rendered with them exactly as
//! transformers renders them, so prompts and observations are the token IDs the model
//! was trained on.
//!
//! - [`template`]: chat templates rendered as transformers renders them.
//! - [`iteration`]: Jinja2's refusal to loop over null, which minijinja lacks, and its
//!   `is iterable`; `literals`: Jinja2's string literals (Python's escapes); `percent`:
//!   its `format` filter (Python's `%`).
//! - [`tokenizer`]: `tokenizer.json` loading, and small BPE tokenizers trained for tests.
//! - [`model`]: a model directory (tokenizer and chat template) loaded together.
//! - [`render`]: the text a template puts between turns, for token-exact observations.
//!
//! A crate of its own because both the RUN worker (through the service's `agent`
//! module, which re-exports it) and the stand-in inference server load a model
//! directory, and the stand-in should not link the service to do so.

#![forbid(unsafe_code)]

pub mod iteration;
mod literals;
pub mod model;
mod percent;
mod pyrepr;
pub mod render;
mod tags;
pub mod template;
pub mod tokenizer;
