//! A model's files as the agent loop needs them: the tokenizer and the chat template.
//!
//! A Hugging Face model directory holds `tokenizer.json` and `tokenizer_config.json`
//! (which carries the chat template and the special tokens). Both the RUN worker (to
//! render prompts and observations) and the stand-in server (to turn its script into
//! token IDs) load them from there, so the two always agree on the vocabulary.

use std::path::{Path, PathBuf};

use super::template::{ChatTemplate, TemplateError};
use super::tokenizer::{Tokenizer, TokenizerError};

/// Why a model directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file is missing or unreadable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `tokenizer_config.json` is not JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
    /// The tokenizer would not load.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template would not load.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The end-of-turn token is not in the vocabulary.
    #[error(
        "the end-of-turn token `{0}` (eos_token in tokenizer_config.json) is not one token of tokenizer.json"
    )]
    NoEos(String),
}

/// A loaded model directory.
#[derive(Debug)]
pub struct ModelFiles {
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template.
    pub template: ChatTemplate,
    /// The token that ends an assistant turn (`eos_token`), as text.
    pub eos_token: String,
    /// Its ID.
    pub eos_id: u32,
}

impl ModelFiles {
    /// Loads `path`: a directory holding `tokenizer.json` and `tokenizer_config.json`, or
    /// the `tokenizer.json` file itself with the config beside it.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        };
        let tok_path = if path.is_dir() {
            dir.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let cfg_path = dir.join("tokenizer_config.json");
        let tok_text = std::fs::read_to_string(&tok_path).map_err(|source| ModelError::Io {
            path: tok_path.clone(),
            source,
        })?;
        let cfg_text = std::fs::read_to_string(&cfg_path).map_err(|source| ModelError::Io {
            path: cfg_path.clone(),
            source,
        })?;
        let config: serde_json::Value =
            serde_json::from_str(&cfg_text).map_err(|source| ModelError::Json {
                path: cfg_path,
                source,
            })?;
        Self::from_parts(Tokenizer::from_json(&tok_text)?, &config)
    }

    /// Builds from a loaded tokenizer and a parsed `tokenizer_config.json`.
    pub fn from_parts(
        tokenizer: Tokenizer,
        config: &serde_json::Value,
    ) -> Result<Self, ModelError> {
        let template = ChatTemplate::from_tokenizer_config(config, None)?;
        let eos_token = match &config["eos_token"] {
            serde_json::Value::String(s) => s.clone(),
            v => v["content"].as_str().unwrap_or_default().to_string(),
        };
        let eos_id = tokenizer
            .token_id(&eos_token)
            .ok_or_else(|| ModelError::NoEos(eos_token.clone()))?;
        Ok(ModelFiles {
            tokenizer,
            template,
            eos_token,
            eos_id,
        })
    }
}

/// Model directories loaded once per process and shared by every job that uses them:
/// loading a real `tokenizer.json` takes long enough that it must not happen per job.
#[derive(Debug, Default)]
pub struct ModelCache {
    loaded: tokio::sync::Mutex<std::collections::HashMap<PathBuf, std::sync::Arc<ModelFiles>>>,
}

impl ModelCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The model at `path`, loaded off the async threads the first time it is asked for.
    /// Concurrent first requests for one path wait for a single load.
    pub async fn get(&self, path: &Path) -> Result<std::sync::Arc<ModelFiles>, ModelError> {
        let mut loaded = self.loaded.lock().await;
        if let Some(m) = loaded.get(path) {
            return Ok(m.clone());
        }
        let owned = path.to_path_buf();
        let files = tokio::task::spawn_blocking(move || ModelFiles::load(&owned))
            .await
            .map_err(|e| ModelError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other(e.to_string()),
            })??;
        let files = std::sync::Arc::new(files);
        loaded.insert(path.to_path_buf(), files.clone());
        Ok(files)
    }
}
