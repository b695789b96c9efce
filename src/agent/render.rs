//! The text a chat template puts between the model's turns, so observations can be
//! tokenized exactly as the template renders them.
//!
//! The model's own tokens are never rendered again: after a turn the loop appends only
//! what the template writes *after* the model's end-of-turn token and up to the next
//! assistant turn's opening (ChatML's `"\n<|im_start|>user\n<tool_response>…"`). To find
//! that text for any template, [`TurnGlue`] renders a small fixed conversation whose
//! last assistant turn holds a sentinel, once without and once with the new messages
//! and the generation prompt, and takes the difference after the sentinel's
//! end-of-turn token. The cost is one render of a short conversation per observation,
//! whatever the episode's length, and none for the usual single tool result when probes
//! at construction show the template inserts a result's content unchanged; a template
//! that renders earlier turns differently once messages follow them is detected rather
//! than silently mis-tokenized.

use serde_json::Value;

use super::template::{ChatTemplate, TemplateError};

/// Text no model writes, marking where the model's part of an assistant turn ends.
const SENTINEL: &str = "ROLLOUT_TURN_SENTINEL";

/// Why the template cannot be used for multi-turn episodes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The template failed or refused the conversation.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The template does not end an assistant turn with the end-of-turn token, so the
    /// model's turns cannot be told from what follows them.
    #[error(
        "the chat template does not end an assistant turn with the end-of-turn token `{0}`; \
         multi-turn episodes need one (set eos_token in tokenizer_config.json to the token that ends an assistant turn)"
    )]
    NoEndOfTurn(String),
    /// Rendering more messages changed the text of earlier ones.
    #[error(
        "the chat template renders an assistant turn differently once messages follow it, \
         so observations cannot be appended token by token"
    )]
    NotAppendOnly,
}

/// What the template writes between turns; built once per episode.
#[derive(Debug)]
pub struct TurnGlue<'a> {
    template: &'a ChatTemplate,
    tools: Option<&'a [Value]>,
    extra: &'a serde_json::Map<String, Value>,
    base: Vec<Value>,
    base_text: String,
    /// Byte offset in `base_text` right after the sentinel (the model's text).
    sentinel_end: usize,
    /// Byte offset right after the end-of-turn token that follows the sentinel.
    turn_end: usize,
    /// For the common case of one tool result: the text before and after its content,
    /// when the template inserts the content unchanged (checked with probes at
    /// construction), so a turn costs no render.
    single_tool: Option<(String, String)>,
}

/// Contents that reveal a template that changes a tool result (trims it, escapes it,
/// rewrites newlines or tabs) instead of inserting it as it is.
const PROBES: [&str; 2] = [
    "ROLLOUT_PROBE",
    "  first\tline\r\n<tool_call>ü{{ x }}</tool_call> & 'q' \"d\"\n\n  last  ",
];

impl<'a> TurnGlue<'a> {
    /// Prepares for `template` with end-of-turn token `eos`, offering `tools`.
    pub fn new(
        template: &'a ChatTemplate,
        eos: &str,
        tools: Option<&'a [Value]>,
        extra: &'a serde_json::Map<String, Value>,
    ) -> Result<Self, RenderError> {
        let base = vec![
            serde_json::json!({"role": "user", "content": "Begin."}),
            serde_json::json!({"role": "assistant", "content": SENTINEL}),
        ];
        let base_text = template.render(&base, tools, false, extra)?;
        let sentinel_end = base_text
            .rfind(SENTINEL)
            .map(|i| i + SENTINEL.len())
            .ok_or(RenderError::NotAppendOnly)?;
        let eos_at = if eos.is_empty() {
            None
        } else {
            base_text[sentinel_end..].find(eos)
        };
        let turn_end = match eos_at {
            Some(i) => sentinel_end + i + eos.len(),
            None => return Err(RenderError::NoEndOfTurn(eos.to_string())),
        };
        let mut glue = TurnGlue {
            template,
            tools,
            extra,
            base,
            base_text,
            sentinel_end,
            turn_end,
            single_tool: None,
        };
        glue.single_tool = glue.find_single_tool_frame();
        Ok(glue)
    }

    /// The text around one tool result's content, if the template inserts every probe
    /// content unchanged between the same two pieces of text.
    fn find_single_tool_frame(&self) -> Option<(String, String)> {
        let tool = |c: &str| [serde_json::json!({"role": "tool", "content": c})];
        let first = self.render_after(&tool(PROBES[0])).ok()?;
        let at = first.find(PROBES[0])?;
        let (pre, post) = (&first[..at], &first[at + PROBES[0].len()..]);
        PROBES[1..]
            .iter()
            .all(|p| {
                self.render_after(&tool(p)).is_ok_and(|t| {
                    t.len() == pre.len() + p.len() + post.len()
                        && t.starts_with(pre)
                        && t[pre.len()..].starts_with(p)
                        && t.ends_with(post)
                })
            })
            .then(|| (pre.to_string(), post.to_string()))
    }

    /// The full render's text after the model's end-of-turn token.
    fn render_after(&self, messages: &[Value]) -> Result<String, RenderError> {
        let mut all = self.base.clone();
        all.extend_from_slice(messages);
        let text = self.template.render(&all, self.tools, true, self.extra)?;
        if !text.starts_with(&self.base_text[..self.turn_end]) {
            return Err(RenderError::NotAppendOnly);
        }
        Ok(text[self.turn_end..].to_string())
    }

    /// The text after a model turn up to and including the next generation prompt, with
    /// `messages` (tool results, a user message) in between. When the model's turn did
    /// not end with the end-of-turn token (a stop string ended it) the text starts with
    /// that token.
    pub fn between_turns(
        &self,
        messages: &[Value],
        ended_with_eos: bool,
    ) -> Result<String, RenderError> {
        let after = match (&self.single_tool, messages) {
            (Some((pre, post)), [m]) if m["role"] == "tool" && m["content"].is_string() => {
                let content = m["content"].as_str().unwrap_or_default();
                let mut t = String::with_capacity(pre.len() + content.len() + post.len());
                t.push_str(pre);
                t.push_str(content);
                t.push_str(post);
                t
            }
            _ => self.render_after(messages)?,
        };
        Ok(if ended_with_eos {
            after
        } else {
            format!(
                "{}{after}",
                &self.base_text[self.sentinel_end..self.turn_end]
            )
        })
    }

    /// What the template writes after an assistant turn's end-of-turn token when the
    /// conversation ends there (ChatML's `"\n"`); no model emits it.
    pub fn tail(&self) -> &str {
        &self.base_text[self.turn_end..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = include_str!("../../tests/fixtures/templates/chatml_tools.jinja");
    const LLAMA3: &str = include_str!("../../tests/fixtures/templates/llama3_tools.jinja");

    #[test]
    fn chatml_glue_is_what_the_full_render_adds() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, "<|im_end|>", None, &extra).unwrap();
        let obs = [
            serde_json::json!({"role": "tool", "content": "a.py"}),
            serde_json::json!({"role": "tool", "content": "b.py"}),
        ];
        assert_eq!(
            glue.between_turns(&obs, true).unwrap(),
            "\n<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(
            glue.between_turns(&obs, false)
                .unwrap()
                .starts_with("<|im_end|>\n<|im_start|>user")
        );
        assert_eq!(glue.tail(), "\n");
        // The same as rendering a real conversation and cutting after the model's turn.
        let user = serde_json::json!({"role": "user", "content": "List files."});
        let model_turn = serde_json::json!({"role": "assistant", "content": "Looking."});
        let before = t
            .render(
                &[user.clone(), model_turn.clone()],
                None::<&[Value]>,
                false,
                &extra,
            )
            .unwrap();
        let mut msgs = vec![user, model_turn];
        msgs.extend(obs.iter().cloned());
        let after = t.render(&msgs, None::<&[Value]>, true, &extra).unwrap();
        let cut = before.len() - glue.tail().len();
        assert_eq!(after[cut..], glue.between_turns(&obs, true).unwrap());
    }

    #[test]
    fn one_tool_result_is_framed_exactly_as_the_template_renders_it() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, "<|im_end|>", None, &extra).unwrap();
        assert!(glue.single_tool.is_some());
        for content in ["ok", "", "  spaced\n\n", "<tool_response>ü\t"] {
            let m = [serde_json::json!({"role": "tool", "content": content})];
            for eos in [true, false] {
                let fast = glue.between_turns(&m, eos).unwrap();
                let mut slow = glue.render_after(&m).unwrap();
                if !eos {
                    slow.insert_str(0, "<|im_end|>");
                }
                assert_eq!(fast, slow, "{content:?}");
            }
        }
        // A template that trims tool results does not get the shortcut.
        let trimming = CHATML.replace(
            "'\\n<tool_response>\\n' + message.content + '\\n</tool_response>'",
            "'\\n<tool_response>\\n' + message.content.strip() + '\\n</tool_response>'",
        );
        assert_ne!(trimming, CHATML);
        let t = ChatTemplate::new(&trimming, "", "<|im_end|>").unwrap();
        let glue = TurnGlue::new(&t, "<|im_end|>", None, &extra).unwrap();
        assert!(glue.single_tool.is_none());
        let m = [serde_json::json!({"role": "tool", "content": "  x  "})];
        assert!(glue.between_turns(&m, true).unwrap().contains("\nx\n"));
    }

    #[test]
    fn llama3_glue_has_no_tail() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("date_string".into(), "26 Jul 2024".into());
        let glue = TurnGlue::new(&t, "<|eot_id|>", None, &extra).unwrap();
        let obs = [serde_json::json!({"role": "tool", "content": "4"})];
        assert_eq!(
            glue.between_turns(&obs, true).unwrap(),
            "<|start_header_id|>ipython<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(glue.tail(), "");
        assert!(glue.single_tool.is_some());
    }

    #[test]
    fn a_template_without_the_end_of_turn_token_is_refused() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
            "",
            "</s>",
        )
        .unwrap();
        let extra = serde_json::Map::new();
        let e = TurnGlue::new(&t, "</s>", None, &extra).unwrap_err();
        assert!(matches!(e, RenderError::NoEndOfTurn(_)), "{e}");
    }
}
