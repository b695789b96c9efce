//! Tokenizers: a model's `tokenizer.json` loaded with the `tokenizers` crate, and small
//! byte-level BPE tokenizers trained on the spot for tests and the stand-in server.
//!
//! Trajectories carry the token IDs the inference server produced; this module is for
//! what the client must tokenize itself (the rendered prompt, observations) and for
//! checking afterwards whether re-tokenizing the conversation would have drifted. It
//! never decodes model output to encode it again.

/// A tokenizer failure.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(String);

impl TokenizerError {
    fn from_any(context: &str, e: impl std::fmt::Display) -> Self {
        TokenizerError(format!("{context}: {e}"))
    }
}

/// A loaded tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens encoded as ordinary text (see
    /// [`Tokenizer::encode_literal`]).
    literal: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .finish()
    }
}

impl Tokenizer {
    fn of(inner: tokenizers::Tokenizer) -> Self {
        let mut literal = inner.clone();
        literal.set_encode_special_tokens(true);
        Tokenizer { inner, literal }
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| TokenizerError::from_any(&format!("cannot load {}", path.display()), e))?;
        Ok(Tokenizer::of(inner))
    }

    /// Parses the contents of a `tokenizer.json`.
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let inner = tokenizers::Tokenizer::from_bytes(json.as_bytes())
            .map_err(|e| TokenizerError::from_any("cannot parse tokenizer JSON", e))?;
        Ok(Tokenizer::of(inner))
    }

    /// The tokenizer as `tokenizer.json` text.
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.inner
            .to_string(false)
            .map_err(|e| TokenizerError::from_any("cannot serialise", e))
    }

    /// Token IDs of `text` as a chat template rendered it: special tokens written in the
    /// text become their IDs, and nothing is added around it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::from_any("cannot encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token IDs of `text` taken as plain text: what spells a special token
    /// (`<|im_end|>`) becomes the ordinary tokens of those characters, never the
    /// special token. For text the model did not write and the template did not add (a
    /// tool's output), which must not be able to end a turn or open one.
    pub fn encode_literal(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .literal
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::from_any("cannot encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token IDs of text in pieces, each `(text, literal)`: a literal piece as
    /// [`Tokenizer::encode_literal`], the others as [`Tokenizer::encode`].
    pub fn encode_pieces(&self, pieces: &[(String, bool)]) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        for (text, literal) in pieces {
            if *literal {
                ids.extend(self.encode_literal(text)?);
            } else {
                ids.extend(self.encode(text)?);
            }
        }
        Ok(ids)
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::from_any("cannot decode", e))
    }

    /// How many token IDs there are, added tokens included: an ID at or above it is
    /// not a token (inference servers refuse such prompts).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ID of one token (a special token, say).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Trains a byte-level BPE tokenizer (the GPT-2 / Qwen / Llama 3 family's kind) of
    /// at most `vocab_size` entries on `corpus`, with `special` tokens that always
    /// encode to one ID each. Deterministic for the same input.
    pub fn train_bpe(
        corpus: &[&str],
        vocab_size: usize,
        special: &[&str],
    ) -> Result<Self, TokenizerError> {
        use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
        use tokenizers::models::{ModelWrapper, TrainerWrapper};
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper};
        let specials: Vec<AddedToken> = special
            .iter()
            .map(|s| AddedToken::from(s.to_string(), true))
            .collect();
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(1)
            .show_progress(false)
            .special_tokens(specials.clone())
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let mut inner = tokenizers::Tokenizer::new(ModelWrapper::BPE(BPE::default()));
        // No prefix space, offsets kept, GPT-2's split regex: the usual byte-level setup.
        inner.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, true, true,
        ))));
        inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
        inner
            .train(&mut trainer, corpus.iter())
            .map_err(|e| TokenizerError::from_any("cannot train", e))?;
        inner
            .add_special_tokens(specials)
            .map_err(|e| TokenizerError::from_any("cannot add special tokens", e))?;
        Ok(Tokenizer::of(inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Tokenizer {
        let corpus = [
            "def add(a, b):\n    return a + b\n",
            "The quick brown fox jumps over the lazy dog.",
            "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}</tool_call>",
            "Hello world! Hello again, world.",
        ];
        Tokenizer::train_bpe(
            &corpus,
            400,
            &["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
        )
        .unwrap()
    }

    #[test]
    fn round_trips_text_and_keeps_special_tokens_whole() {
        let t = small();
        let text = "<|im_start|>user\nHello, wörld — ünseen bytes too!<|im_end|>";
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text);
        let start = t.token_id("<|im_start|>").unwrap();
        assert_eq!(ids[0], start);
        assert_eq!(ids.iter().filter(|&&i| i == start).count(), 1);
        assert_eq!(*ids.last().unwrap(), t.token_id("<|im_end|>").unwrap());
    }

    #[test]
    fn saves_and_loads_as_tokenizer_json() {
        let t = small();
        let again = Tokenizer::from_json(&t.to_json().unwrap()).unwrap();
        let text = "def add(a, b): return a + b";
        assert_eq!(t.encode(text).unwrap(), again.encode(text).unwrap());
    }

    #[test]
    fn training_is_deterministic() {
        assert_eq!(small().to_json().unwrap(), small().to_json().unwrap());
    }

    #[test]
    fn re_encoding_can_differ_from_what_a_model_emitted() {
        // A model may emit "Hello" as two tokens; decoding and encoding again merges
        // them: the drift that makes re-tokenized trajectories wrong.
        let t = small();
        let merged = t.encode("Hello").unwrap();
        assert_eq!(merged.len(), 1, "the corpus makes `Hello` one token");
        let split: Vec<u32> = ["He", "llo"]
            .iter()
            .flat_map(|p| t.encode(p).unwrap())
            .collect();
        assert!(split.len() > 1);
        let text = t.decode(&split).unwrap();
        assert_eq!(text, "Hello");
        assert_ne!(t.encode(&text).unwrap(), split);
    }
}
