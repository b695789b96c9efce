//! The agent loop's building blocks: how a conversation becomes the exact prompt a policy
//! model was trained on.
//!
//! - [`template`]: chat templates rendered as transformers renders them.
//! - [`tokenizer`]: `tokenizer.json` loading, and small BPE tokenizers trained for tests.
//! - [`model`]: a model directory (tokenizer and chat template) loaded together.
//! - [`parse`]: tool-call parsers (Hermes `<tool_call>` blocks, one bash block per turn).

pub mod model;
pub mod parse;
pub mod template;
pub mod tokenizer;
