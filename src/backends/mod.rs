//! Inference backends: the servers that run the policy model (vLLM, SGLang).
//!
//! - [`wire`]: their request and response formats, token-in and token-out.
//! - [`client`]: the HTTP client (pooled connections, timeouts, retries, abort).
//! - [`pool`]: which backend a job uses: registration, health, sticky and group-affine
//!   assignment with counts kept in the database.
//! - [`session`]: a job's assigned backend across its turns, and the move off a dead one.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub mod client;
pub mod pool;
pub mod session;
pub mod wire;

/// Which wire format a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WireKind {
    /// vLLM's OpenAI-compatible `POST /v1/completions`.
    Vllm,
    /// SGLang's native `POST /generate`.
    Sglang,
}

impl WireKind {
    /// The name used in config files, the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            WireKind::Vllm => "vllm",
            WireKind::Sglang => "sglang",
        }
    }

    /// Parses `vllm` or `sglang`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "vllm" => Some(WireKind::Vllm),
            "sglang" => Some(WireKind::Sglang),
            _ => None,
        }
    }
}

impl std::fmt::Display for WireKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend as registered: where it is and what it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    /// A name unique in the pool (letters, digits, `-`, `_`, `.`).
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub id: String,
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    #[schema(pattern = "^https?://[^\\u0000]*$")]
    pub url: String,
    /// The wire format.
    pub kind: WireKind,
    /// The model it serves; for vLLM also the `model` field of requests. Jobs only move
    /// between backends of the same model.
    #[schema(pattern = "^[^\\u0000]*\\S[^\\u0000]*$")]
    pub model: String,
    /// The model's directory holding `tokenizer.json` and `tokenizer_config.json` (or the
    /// path of `tokenizer.json`, with `tokenizer_config.json` beside it), as seen by the
    /// RUN workers.
    #[schema(pattern = "^[^\\u0000]*\\S[^\\u0000]*$")]
    pub tokenizer: String,
    /// Relative capacity: a backend of weight 2 gets twice the jobs of one of weight 1.
    #[serde(default = "default_weight")]
    #[schema(exclusive_minimum = 0.0, default = 1.0)]
    pub weight: f64,
}

fn default_weight() -> f64 {
    1.0
}

impl BackendSpec {
    /// Checks the fields a user wrote; the error names the field.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, m: &str| Err((f.to_string(), m.to_string()));
        if self.id.is_empty()
            || self.id.len() > 128
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return bad("id", "must be 1-128 letters, digits, `-`, `_` or `.`");
        }
        for (field, v) in [
            ("url", &self.url),
            ("model", &self.model),
            ("tokenizer", &self.tokenizer),
        ] {
            if v.contains('\0') {
                return bad(field, "must not contain NUL");
            }
        }
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return bad("url", "must be an http:// or https:// URL");
        }
        if self.model.trim().is_empty() {
            return bad("model", "must not be empty");
        }
        if self.tokenizer.trim().is_empty() {
            return bad(
                "tokenizer",
                "must name the model directory (tokenizer.json and tokenizer_config.json)",
            );
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return bad("weight", "must be a number above 0");
        }
        Ok(())
    }
}

/// A backend with its state in the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackendState {
    /// What was registered.
    #[serde(flatten)]
    pub spec: BackendSpec,
    /// Whether the last health probe succeeded (a new backend counts as healthy until
    /// probed).
    pub healthy: bool,
    /// Jobs currently assigned to it (in RUN).
    pub active: i64,
    /// When it was last probed (epoch ms).
    pub checked_at: Option<i64>,
    /// The last probe's error, while unhealthy.
    pub last_error: Option<String>,
    /// `config` (from the config file; re-registered at every start) or `api`.
    pub source: String,
}
