//! Inference backends: the servers that run the policy model (vLLM, SGLang).
//!
//! - [`wire`]: their request and response formats, token-in and token-out.

pub mod wire;
