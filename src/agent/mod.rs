//! The agent loop's building blocks: how a conversation becomes the exact prompt a policy
//! model was trained on.
//!
//! - [`template`]: chat templates rendered as transformers renders them.
//! - [`iteration`]: Jinja2's refusal to loop over null, which minijinja lacks.
//! - [`tokenizer`]: `tokenizer.json` loading, and small BPE tokenizers trained for tests.
//! - [`model`]: a model directory (tokenizer and chat template) loaded together.
//! - [`parse`]: tool-call parsers (Hermes `<tool_call>` blocks, one bash block per turn).
//! - [`render`]: the text a template puts between turns, for token-exact observations.
//! - [`tools`]: the tools offered to the model and how results become observations.
//! - [`trajectory`]: what an episode hands the trainer.
//! - [`episode`]: the multi-turn loop itself.

pub mod episode;
pub mod iteration;
pub mod model;
pub mod parse;
pub(crate) mod pyrepr;
pub mod render;
pub mod template;
pub mod tokenizer;
pub mod tools;
pub mod trajectory;
