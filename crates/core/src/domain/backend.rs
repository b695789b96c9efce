//! Inference backends as the service records them: a registered server's spec (URL,
//! wire format, served model name, key), its health and load, and the logprob
//! convention its numbers follow. Plain data shared by the configuration, the store,
//! the pool and the API.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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

/// A server's API key (`--api-key`), sent as `Authorization: Bearer <key>`. It never
/// appears in logs or `Debug` output, and the API never returns it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = String, pattern = "^[!-~]{1,512}$")]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// What a server's logprobs are the logprobs of. A trainer computing importance ratios
/// or KL against its own forward pass must compare like with like, so every turn of a
/// trajectory records which one produced its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogprobsMode {
    /// The model's own distribution, before temperature and top-k/top-p: vLLM's
    /// default (`--logprobs-mode raw_logprobs`).
    Raw,
    /// The distribution actually sampled from, after temperature (and, for vLLM,
    /// the other logit processing): SGLang's, and vLLM's with `--logprobs-mode
    /// processed_logprobs`.
    Processed,
}

impl LogprobsMode {
    /// The name used in the API, the database and trajectories.
    pub fn as_str(self) -> &'static str {
        match self {
            LogprobsMode::Raw => "raw",
            LogprobsMode::Processed => "processed",
        }
    }

    /// Parses `raw` or `processed`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "raw" => Some(LogprobsMode::Raw),
            "processed" => Some(LogprobsMode::Processed),
            _ => None,
        }
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
    // Not blank and no NUL, as `validate` checks: whitespace is spelled out as Rust's
    // `char::is_whitespace` has it, since `\s` differs between regex engines, and `\S`
    // would take a NUL.
    #[schema(
        pattern = "^[^\\u0000]*[^\\u0000\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub model: String,
    /// The model's directory holding `tokenizer.json` and `tokenizer_config.json` (or the
    /// path of `tokenizer.json`, with `tokenizer_config.json` beside it), as seen by the
    /// RUN workers.
    #[schema(
        pattern = "^[^\\u0000]*[^\\u0000\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub tokenizer: String,
    /// Relative capacity: a backend of weight 2 gets twice the jobs of one of weight 1.
    #[serde(default = "default_weight")]
    #[schema(exclusive_minimum = 0.0, default = 1.0)]
    pub weight: f64,
    /// The name the server serves the model under, when it is not `model` (vLLM's
    /// `--served-model-name`): sent as each request's `model`, and looked for in the
    /// server's `GET /v1/models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = "^[^\\u0000]*[^\\u0000\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub served_model_name: Option<String>,
    /// The server's API key, when it was started with `--api-key`. Write-only: the API
    /// answers with `api_key_set` instead. It is kept in the `backends` table, which
    /// dashboards should not show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<ApiKey>,
    /// Which logprobs the server returns; by default `raw` for vLLM and `processed` for
    /// SGLang, their defaults. Set `processed` for a vLLM started with
    /// `--logprobs-mode processed_logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs_mode: Option<LogprobsMode>,
}

fn default_weight() -> f64 {
    1.0
}

impl Default for BackendSpec {
    /// An empty spec of weight 1, for building one field by field.
    fn default() -> Self {
        BackendSpec {
            id: String::new(),
            url: String::new(),
            kind: WireKind::Vllm,
            model: String::new(),
            tokenizer: String::new(),
            weight: 1.0,
            served_model_name: None,
            api_key: None,
            logprobs_mode: None,
        }
    }
}

impl BackendSpec {
    /// The name requests ask the server for: `served_model_name`, else `model`.
    pub fn served_name(&self) -> &str {
        self.served_model_name.as_deref().unwrap_or(&self.model)
    }

    /// The logprobs the server returns: as registered, else the server kind's default.
    pub fn logprobs(&self) -> LogprobsMode {
        self.logprobs_mode.unwrap_or(match self.kind {
            WireKind::Vllm => LogprobsMode::Raw,
            WireKind::Sglang => LogprobsMode::Processed,
        })
    }

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
        if let Some(name) = &self.served_model_name
            && (name.trim().is_empty() || name.contains('\0'))
        {
            return bad(
                "served_model_name",
                "must be the name the server serves (--served-model-name), not empty, without NUL",
            );
        }
        if let Some(ApiKey(key)) = &self.api_key
            && (key.is_empty() || key.len() > 512 || !key.bytes().all(|b| b.is_ascii_graphic()))
        {
            return bad(
                "api_key",
                "must be 1-512 printable ASCII characters without spaces (what the server's --api-key was)",
            );
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
    /// Whether an API key is registered (the key itself is never returned).
    #[serde(default)]
    pub api_key_set: bool,
}

impl BackendState {
    /// The state as the API shows it: without the API key.
    pub fn redacted(mut self) -> Self {
        self.api_key_set = self.spec.api_key.is_some();
        self.spec.api_key = None;
        self
    }
}
