//! A model's files as the agent loop needs them: the tokenizer and the chat template.
//!
//! A Hugging Face model directory holds `tokenizer.json` and `tokenizer_config.json`
//! (which carries the chat template and the special tokens). Both the RUN worker (to
//! render prompts and observations) and the stand-in server (to turn its script into
//! token IDs) load them from there, so the two always agree on the vocabulary.

use std::path::{Path, PathBuf};

use super::render::{RenderError, TurnGlue};
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
    /// The chat template cannot carry a multi-turn episode.
    #[error("the chat template of {path} cannot run agent episodes: {source}")]
    Turns {
        /// The model directory.
        path: PathBuf,
        /// Why.
        source: RenderError,
    },
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
    /// The chat template (`default`, when the model names several).
    pub template: ChatTemplate,
    /// The template named `tool_use`, when the model names one: transformers renders
    /// with it whenever tools are given.
    pub tool_use: Option<ChatTemplate>,
    /// The token that ends an assistant turn (`eos_token`), as text.
    pub eos_token: String,
    /// Its ID.
    pub eos_id: u32,
    /// Every token that ends the model's turns: `eos_id` first, then the other
    /// end-of-sequence tokens of `generation_config.json` (Llama 3.1's `<|eom_id|>`
    /// after a tool call, `<|end_of_text|>`). Sent as `stop_token_ids`; a turn that ends
    /// on any of them is a complete turn.
    pub stop_ids: Vec<u32>,
}

impl ModelFiles {
    /// Loads `path`: a directory holding `tokenizer.json` and `tokenizer_config.json`, or
    /// the `tokenizer.json` file itself with the config beside it, and
    /// `generation_config.json` when there is one (its stop tokens).
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
        let mut config = read_json(&cfg_path)?;
        if let Some(templates) = template_files(&dir)? {
            config["chat_template"] = templates;
        }
        let mut files = Self::from_parts(Tokenizer::from_json(&tok_text)?, &config)?;
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let gen_config = read_json(&gen_path)?;
            let ids = match &gen_config["eos_token_id"] {
                serde_json::Value::Array(list) => list.iter().filter_map(|v| v.as_u64()).collect(),
                v => v.as_u64().into_iter().collect::<Vec<_>>(),
            };
            for id in ids {
                if let Ok(id) = u32::try_from(id)
                    && !files.stop_ids.contains(&id)
                {
                    files.stop_ids.push(id);
                }
            }
        }
        Ok(files)
    }

    /// The template transformers would render with: `tool_use` when tools are given and
    /// the model has one, else the default.
    pub fn template_for(&self, with_tools: bool) -> &ChatTemplate {
        match &self.tool_use {
            Some(t) if with_tools => t,
            _ => &self.template,
        }
    }

    /// Checks that the model's templates (without tools, and with `tool_schemas`) can
    /// carry a multi-turn episode, as [`TurnGlue`] needs: a model that cannot is refused
    /// when it is loaded for episodes, with the reason, rather than after its first
    /// generation. Task-specific template arguments (`enable_thinking`) are checked
    /// again when each episode starts.
    pub fn check_turns(&self, tool_schemas: &[serde_json::Value]) -> Result<(), RenderError> {
        let extra = serde_json::Map::new();
        let stops = self.stop_tokens();
        TurnGlue::new(self.template_for(false), &stops, None, &extra)?;
        TurnGlue::new(self.template_for(true), &stops, Some(tool_schemas), &extra)?;
        Ok(())
    }

    /// The text of every token that ends the model's turns ([`ModelFiles::stop_ids`]),
    /// the end-of-turn token first: what [`TurnGlue`] closes a turn with.
    pub fn stop_tokens(&self) -> Vec<String> {
        let mut stops = vec![self.eos_token.clone()];
        for &id in &self.stop_ids {
            if let Ok(text) = self.tokenizer.decode(&[id])
                && !stops.contains(&text)
            {
                stops.push(text);
            }
        }
        stops
    }

    /// Builds from a loaded tokenizer and a parsed `tokenizer_config.json`.
    pub fn from_parts(
        tokenizer: Tokenizer,
        config: &serde_json::Value,
    ) -> Result<Self, ModelError> {
        let template = ChatTemplate::from_tokenizer_config(config, None)?;
        let tool_use = match &config["chat_template"] {
            serde_json::Value::Array(list) if list.iter().any(|t| t["name"] == "tool_use") => Some(
                ChatTemplate::from_tokenizer_config(config, Some("tool_use"))?,
            ),
            _ => None,
        };
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
            tool_use,
            eos_token,
            eos_id,
            stop_ids: vec![eos_id],
        })
    }
}

/// A JSON file of the model directory.
fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// The templates of transformers 5's layout, which wins over `tokenizer_config.json`'s
/// `chat_template` as it does in transformers: `chat_template.jinja` (the default) and
/// `additional_chat_templates/<name>.jinja`, as a named list. `None` without the file.
fn template_files(dir: &Path) -> Result<Option<serde_json::Value>, ModelError> {
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path, source })
    };
    let main = dir.join("chat_template.jinja");
    if !main.is_file() {
        return Ok(None);
    }
    let mut list = vec![serde_json::json!({"name": "default", "template": read(main)?})];
    if let Ok(entries) = std::fs::read_dir(dir.join("additional_chat_templates")) {
        let mut extra: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        extra.sort();
        for path in extra {
            let name = path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            list.push(serde_json::json!({"name": name, "template": read(path)?}));
        }
    }
    Ok(Some(serde_json::Value::Array(list)))
}

/// Model directories loaded once per process and shared by every job that uses them:
/// loading a real `tokenizer.json` takes long enough that it must not happen per job.
#[derive(Debug, Default)]
pub struct ModelCache {
    loaded: tokio::sync::Mutex<std::collections::HashMap<PathBuf, std::sync::Arc<ModelFiles>>>,
    /// The tools the episodes offer, as the chat template receives them: every model
    /// loaded is checked to carry a multi-turn episode with them.
    tool_schemas: std::sync::Arc<Vec<serde_json::Value>>,
}

impl ModelCache {
    /// An empty cache for episodes that offer the tools `tool_schemas`.
    pub fn new(tool_schemas: Vec<serde_json::Value>) -> Self {
        Self {
            loaded: tokio::sync::Mutex::default(),
            tool_schemas: std::sync::Arc::new(tool_schemas),
        }
    }

    /// The model at `path`, loaded off the async threads the first time it is asked for
    /// and checked for multi-turn use ([`ModelFiles::check_turns`]). Concurrent first
    /// requests for one path wait for a single load.
    pub async fn get(&self, path: &Path) -> Result<std::sync::Arc<ModelFiles>, ModelError> {
        let mut loaded = self.loaded.lock().await;
        if let Some(m) = loaded.get(path) {
            return Ok(m.clone());
        }
        let owned = path.to_path_buf();
        let schemas = self.tool_schemas.clone();
        let files = tokio::task::spawn_blocking(move || {
            let files = ModelFiles::load(&owned)?;
            files
                .check_turns(&schemas)
                .map_err(|source| ModelError::Turns {
                    path: owned.clone(),
                    source,
                })?;
            Ok::<_, ModelError>(files)
        })
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
