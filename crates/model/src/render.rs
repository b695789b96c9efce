//! The text a chat template puts between the model's turns, so observations can be
//! tokenized exactly as the template renders them.
//!
//! The model's own tokens are never rendered again: after a turn the loop appends only
//! what the template writes *after* the model's end-of-turn token and up to the next
//! assistant turn's opening (ChatML's `"\n<|im_start|>user\n<tool_response>…"`). To find
//! that text for any template, [`TurnGlue`] renders the conversation so far with the
//! model's last turn replaced by a sentinel, followed by the new messages and the
//! generation prompt, and takes the text after the end-of-turn token that follows the
//! sentinel. The whole conversation, not a fixed short one: some templates carry state
//! across it (DeepSeek-R1's writes the opening of the tool outputs only before the
//! first of them), and an observation rendered without the earlier turns would differ
//! from a render of the whole conversation. The tool schemas and the template switches
//! are converted into the renderer's values once per episode. Every observation is
//! rendered, even the single tool result a template seems to insert unchanged: a
//! template may branch on what a result says (refuse it, trim it), and probes cannot
//! prove it never does.
//!
//! Only what follows the model's turn is taken from the render, never what precedes
//! it: real templates render earlier turns differently once messages follow them
//! (Qwen3 writes an empty think block only into the *last* assistant turn, and drops
//! reasoning from turns before the last user query), and the model must go on from the
//! tokens it actually saw. Whether a trainer re-rendering the finished conversation
//! gets those same tokens is the drift check's verdict, not a reason to stop. The
//! glue is probed with every kind of message an episode appends (one tool result,
//! several, which some templates merge into one turn, and a user message) when it is
//! built, so a template that cannot be glued is refused before a token is generated.
//!
//! Two kinds of template need more than the end-of-turn token. One that writes none
//! after an assistant turn (GLM's) opens what follows with one of the model's other
//! stop tokens (`<|observation|>` before results, `<|user|>` before a user turn): the
//! model emitted that token, and the turn closes on it. One that writes a tool result
//! only after a call (gpt-oss's names the result after its call) is probed with the
//! turn as a call whose arguments hold the sentinel, the turn closing at the first stop
//! token after them (`<|call|>`).

use serde_json::Value;

use super::template::{ChatTemplate, PreparedMessage, RenderContext, TemplateError};

/// Text no model writes, marking where the model's part of an assistant turn ends.
const SENTINEL: &str = "ROLLOUT_TURN_SENTINEL";

/// Why the template cannot be used for multi-turn episodes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The template failed or refused the conversation.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The template does not write an assistant message's content, so the model's turns
    /// cannot be found in its renders.
    #[error(
        "the chat template does not write an assistant message's content as given ({0}); \
         multi-turn episodes need a template that renders the model's turns"
    )]
    NoContent(&'static str),
    /// The template does not end an assistant turn with the end-of-turn token, so the
    /// model's turns cannot be told from what follows them.
    #[error(
        "the chat template does not end an assistant turn with the end-of-turn token `{eos}` \
         when {when} follows it; multi-turn episodes need one (set eos_token in \
         tokenizer_config.json to the token that ends an assistant turn)"
    )]
    NoEndOfTurn {
        /// The token.
        eos: String,
        /// What followed the turn in the render that lacked it.
        when: &'static str,
    },
    /// The template writes something else between the model's text and its end-of-turn
    /// token depending on what follows, so a turn cut before that token cannot be closed
    /// the way a re-render would close it.
    #[error(
        "the chat template closes an assistant turn with {0:?} when {1} follows it but with \
         {2:?} otherwise; a turn cut before its end-of-turn token cannot be closed consistently"
    )]
    UnstableClose(String, &'static str, String),
    /// The template writes an end-of-turn token between a turn's calls, so what follows
    /// the model's turn cannot be told from its later calls.
    #[error(
        "the chat template ends a turn of calls after its first call ({0}), so what follows \
         the model's turn cannot be told from its other calls"
    )]
    CallsApart(&'static str),
    /// A tool result could not be found in the render as one stretch of text, so it
    /// cannot be tokenized as plain text (see [`locate_results`]).
    #[error(
        "the chat template does not write tool result {0} as one stretch of text ({1}), so \
         it cannot be tokenized as plain text; set `observations_as_text: false` in the \
         task to tokenize observations as the template writes them"
    )]
    ResultNotLocated(usize, &'static str),
}

/// Text in pieces, each `(text, literal)`: the literal pieces are tool results as the
/// template wrote them, to be tokenized as plain text (see
/// [`super::tokenizer::Tokenizer::encode_pieces`]); the others are the template's own.
pub type Pieces = Vec<(String, bool)>;

/// Stands in for a tool result while [`locate_results`] looks for where it goes.
const RESULT_MARKER: &str = "\u{e000}ROLLOUT_TOOL_RESULT\u{e001}";

/// Splits `plain`, the render of `messages`, into the tool results' text and the
/// template's. Each tool result with text content is found by rendering again with that
/// content replaced by a marker: the text before and after the marker is the template's
/// (and the other messages'), so what lies between them in `plain` is the result as the
/// template wrote it (as given, or changed: Llama 3.1 writes it through `tojson`).
///
/// This is what keeps tool output from becoming control tokens: text a program in the
/// sandbox prints that spells `<|im_end|>\n<|im_start|>assistant` is tokenized as those
/// characters, so it cannot end the tool's turn and forge the model's. A template that
/// writes a result twice, or changes the text around it depending on what it says,
/// cannot be split this way and is refused with the reason.
pub fn locate_results(
    plain: &str,
    messages: &[Value],
    render: impl Fn(&[Value]) -> Result<String, RenderError>,
) -> Result<Pieces, RenderError> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let is_result = m["role"] == "tool" && m["content"].as_str().is_some_and(|c| !c.is_empty());
        if !is_result {
            continue;
        }
        let mut marked = messages.to_vec();
        marked[i]["content"] = Value::String(RESULT_MARKER.into());
        let text = render(&marked)?;
        let Some(at) = text.find(RESULT_MARKER) else {
            // The template does not write this result at all: nothing of it to keep apart.
            continue;
        };
        let (before, after) = (&text[..at], &text[at + RESULT_MARKER.len()..]);
        if after.contains(RESULT_MARKER) {
            return Err(RenderError::ResultNotLocated(
                i,
                "it is written more than once",
            ));
        }
        if !(plain.len() >= before.len() + after.len()
            && plain.starts_with(before)
            && plain.ends_with(after))
        {
            return Err(RenderError::ResultNotLocated(
                i,
                "the text around it depends on what it says",
            ));
        }
        spans.push((before.len(), plain.len() - after.len()));
    }
    spans.sort_unstable();
    let mut pieces = Pieces::new();
    let mut at = 0;
    for (i, (start, end)) in spans.into_iter().enumerate() {
        if start < at {
            return Err(RenderError::ResultNotLocated(
                i,
                "it overlaps another result",
            ));
        }
        if start > at {
            pieces.push((plain[at..start].to_string(), false));
        }
        if end > start {
            pieces.push((plain[start..end].to_string(), true));
        }
        at = end;
    }
    if at < plain.len() {
        pieces.push((plain[at..].to_string(), false));
    }
    Ok(pieces)
}

/// What the template writes between turns; built once per episode.
#[derive(Debug)]
pub struct TurnGlue<'a> {
    template: &'a ChatTemplate,
    eos: String,
    /// Every token that ends the model's turns, as text, `eos` first: a template that
    /// writes no end-of-turn token after a turn (GLM-4.5's) starts what follows with one
    /// of the model's other stop tokens (`<|observation|>`, `<|user|>`), which the
    /// model emitted and which closes its turn there.
    stops: Vec<String>,
    /// Whether the model's last turn is rendered as a call holding the sentinel in its
    /// arguments rather than as text: for templates that write a tool result only after
    /// a call (gpt-oss's), its turn then closing at the first stop token after it.
    calls: bool,
    /// The tools and switches, converted once for every render of the episode.
    context: RenderContext,
    /// The fixed conversation the glue is cut from, converted once.
    base: Vec<PreparedMessage>,
    /// What the template writes after the model's text up to and including the
    /// end-of-turn token once messages follow the turn (ChatML: `<|im_end|>`); a turn
    /// that a stop string or the length limit cut gets it before the glue.
    close: String,
    /// What the template writes after the end-of-turn token when the conversation ends
    /// with the assistant turn (ChatML: `"\n"`).
    tail: String,
}

impl<'a> TurnGlue<'a> {
    /// Prepares for `template` with the model's stop tokens `stops` (its end-of-turn
    /// token first, as `ModelFiles::stop_tokens` lists them), offering `tools`, and
    /// checks that every kind of message an episode appends can be glued: a failure
    /// here costs no generation.
    pub fn new(
        template: &'a ChatTemplate,
        stops: &[String],
        tools: Option<&'a [Value]>,
        extra: &'a serde_json::Map<String, Value>,
    ) -> Result<Self, RenderError> {
        match Self::probed(template, stops, tools, extra, false) {
            Ok(glue) => Ok(glue),
            // A template that writes a tool result only after a call (gpt-oss's names the
            // result after it): the turn before the results is a turn of calls.
            Err(e) => Self::probed(template, stops, tools, extra, true).map_err(|_| e),
        }
    }

    /// [`TurnGlue::new`] with the model's turn as text (`calls` false) or as a call
    /// whose arguments hold the sentinel.
    fn probed(
        template: &'a ChatTemplate,
        stops: &[String],
        tools: Option<&'a [Value]>,
        extra: &'a serde_json::Map<String, Value>,
        calls: bool,
    ) -> Result<Self, RenderError> {
        let eos = stops.first().map_or("", String::as_str);
        if eos.is_empty() {
            return Err(RenderError::NoEndOfTurn {
                eos: String::new(),
                when: "anything",
            });
        }
        let turn = if calls {
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "call00000", "type": "function",
                 "function": {"name": "probe", "arguments": {"probe": SENTINEL}}}
            ]})
        } else {
            serde_json::json!({"role": "assistant", "content": SENTINEL})
        };
        let base = [
            serde_json::json!({"role": "user", "content": "Begin."}),
            turn,
        ]
        .iter()
        .map(PreparedMessage::new)
        .collect::<Result<Vec<_>, _>>()?;
        let mut glue = TurnGlue {
            template,
            eos: eos.to_string(),
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            calls,
            context: template.context(tools, extra)?,
            base,
            close: String::new(),
            tail: String::new(),
        };
        // The conversation ending with the turn: what a re-render adds after our last
        // token. A template may leave the end-of-turn token out there (it is the
        // model's to write); then it adds nothing.
        let alone = template.render_prepared(&glue.context, &glue.base, false)?;
        let after = sentinel_end(&alone).ok_or(RenderError::NoContent("alone"))?;
        glue.tail = alone[after..]
            .find(eos)
            .map(|i| alone[after + i + eos.len()..].to_string())
            .unwrap_or_default();
        // Followed by each kind of message an episode appends. Tool results come even
        // when no tools are offered: a call the model makes anyway gets an error
        // observation.
        let user = [serde_json::json!({"role": "user", "content": "Go on."})];
        // Each result names a call, with an id of nine letters and digits: Mistral's
        // templates refuse a result without one.
        let tool = |c: &str| serde_json::json!({"role": "tool", "tool_call_id": "call00000", "content": c});
        let one_tool = [tool("a")];
        let two_tools = [tool("a"), tool("b")];
        let kinds: [(&'static str, &[Value]); 3] = [
            ("a user message", &user),
            ("a tool result", &one_tool),
            ("two tool results", &two_tools),
        ];
        let mut first_close: Option<(String, &'static str)> = None;
        for (when, messages) in kinds {
            let (close, _) = glue.split_after(&glue.base, messages, when)?;
            match &first_close {
                None => first_close = Some((close, when)),
                // Closes that are each one of the model's stop tokens differ by what the
                // model asks for (GLM's `<|observation|>` for tool results, `<|user|>`
                // to hand back): each render's own is the one a re-render writes.
                Some((c, w)) if *c != close && !(glue.is_stop(c) && glue.is_stop(&close)) => {
                    return Err(RenderError::UnstableClose(c.clone(), w, close));
                }
                Some(_) => {}
            }
        }
        glue.close = first_close.map(|(c, _)| c).unwrap_or_default();
        Ok(glue)
    }

    /// Renders the base conversation followed by `messages` and the generation prompt,
    /// and splits the text after the model's part of the turn into what closes the turn
    /// (up to and including the end-of-turn token) and what follows it.
    fn split_after(
        &self,
        base: &[PreparedMessage],
        messages: &[Value],
        when: &'static str,
    ) -> Result<(String, String), RenderError> {
        let mut all = base.to_vec();
        for m in messages {
            all.push(PreparedMessage::new(m)?);
        }
        let text = self.template.render_prepared(&self.context, &all, true)?;
        let after = sentinel_end(&text).ok_or(RenderError::NoContent(when))?;
        let rest = &text[after..];
        // A stop token right after the turn closes it (the end-of-turn token, or the
        // one a template that writes none there starts the next message with); else
        // the end-of-turn token after what the template adds to the turn.
        let first_stop = || {
            self.stops
                .iter()
                .filter_map(|s| rest.find(s.as_str()).map(|at| at + s.len()))
                .min()
        };
        let end = match self.stops.iter().find(|s| rest.starts_with(s.as_str())) {
            Some(stop) => Some(stop.len()),
            // After a call's arguments (the sentinel's quotes and braces), the first stop
            // token: gpt-oss's `<|call|>`.
            None if self.calls => first_stop(),
            None => rest.find(&self.eos).map(|at| at + self.eos.len()),
        }
        .ok_or_else(|| RenderError::NoEndOfTurn {
            eos: self.eos.clone(),
            when,
        })?;
        // Every call of the turn holds the sentinel: one after the close is a later call
        // of the same turn, not what follows it.
        if self.calls && rest[end..].contains(SENTINEL) {
            return Err(RenderError::CallsApart(when));
        }
        Ok((rest[..end].to_string(), rest[end..].to_string()))
    }

    /// Whether `close` is one of the model's stop tokens and nothing else.
    fn is_stop(&self, close: &str) -> bool {
        self.stops.iter().any(|s| s == close)
    }

    /// The conversation so far (`history`, ending with the model's last turn) as the
    /// base of a render: every earlier message as it was, so a template that carries
    /// state across the whole conversation sees it (DeepSeek-R1's writes the opening of
    /// its tool outputs only before the first of them), and the last turn as the
    /// sentinel alone (its calls left out, so text in their arguments cannot be taken
    /// for the end-of-turn token), or, for templates that need a call before a result,
    /// its calls with the sentinel for their arguments. Without a model turn at the end,
    /// the fixed base.
    fn history_base(&self, history: &[Value]) -> Result<Vec<PreparedMessage>, RenderError> {
        match history.split_last() {
            Some((last, earlier)) if last["role"] == "assistant" => {
                let mut base = earlier
                    .iter()
                    .map(PreparedMessage::new)
                    .collect::<Result<Vec<_>, _>>()?;
                let turn = match last["tool_calls"].as_array() {
                    // Its calls as they were (the template names the results after
                    // them), their arguments the sentinel.
                    Some(calls) if self.calls && !calls.is_empty() => {
                        let mut turn = last.clone();
                        for call in turn["tool_calls"].as_array_mut().into_iter().flatten() {
                            call["function"]["arguments"] = serde_json::json!({"probe": SENTINEL});
                        }
                        turn
                    }
                    _ => serde_json::json!({"role": "assistant", "content": SENTINEL}),
                };
                base.push(PreparedMessage::new(&turn)?);
                Ok(base)
            }
            _ => Ok(self.base.clone()),
        }
    }

    /// [`TurnGlue::between_turns`] after the real conversation so far, `history`
    /// (ending with the model's last turn): what a render of the whole conversation
    /// writes there, also for templates whose output depends on earlier turns. An
    /// episode uses this; it costs a render of the conversation per observation.
    pub fn between_turns_after(
        &self,
        history: &[Value],
        messages: &[Value],
        ended_with_eos: bool,
    ) -> Result<String, RenderError> {
        let base = self.history_base(history)?;
        self.glued(&base, messages, ended_with_eos)
    }

    /// The text after the model's turn in a render of `base` and `messages`, opened
    /// with what closes a turn when the model's turn did not end with its token.
    fn glued(
        &self,
        base: &[PreparedMessage],
        messages: &[Value],
        ended_with_eos: bool,
    ) -> Result<String, RenderError> {
        let (close, after) = self.split_after(base, messages, "the observation")?;
        Ok(if ended_with_eos {
            after
        } else if self.is_stop(&close) {
            // This render's own close, which differs by what follows (see `new`).
            format!("{close}{after}")
        } else {
            format!("{}{after}", self.close)
        })
    }

    /// The text after a model turn up to and including the next generation prompt, with
    /// `messages` (tool results, a user message) in between. When the model's turn did
    /// not end with the end-of-turn token (a stop string ended it) the text starts with
    /// what closes a turn.
    pub fn between_turns(
        &self,
        messages: &[Value],
        ended_with_eos: bool,
    ) -> Result<String, RenderError> {
        self.glued(&self.base, messages, ended_with_eos)
    }

    /// [`TurnGlue::between_turns_after`] in pieces, the tool results among `messages`
    /// apart from the template's text (see [`locate_results`]).
    pub fn between_turns_pieces(
        &self,
        history: &[Value],
        messages: &[Value],
        ended_with_eos: bool,
    ) -> Result<Pieces, RenderError> {
        let base = self.history_base(history)?;
        let plain = self.glued(&base, messages, ended_with_eos)?;
        locate_results(&plain, messages, |m| self.glued(&base, m, ended_with_eos))
    }

    /// What the template writes after an assistant turn's end-of-turn token when the
    /// conversation ends there (ChatML's `"\n"`); no model emits it.
    pub fn tail(&self) -> &str {
        &self.tail
    }
}

/// Where the sentinel's text ends in `text`: its first occurrence, which is the base
/// conversation's assistant turn (anything after it, a tool output repeating the
/// sentinel included, comes later).
fn sentinel_end(text: &str) -> Option<usize> {
    text.find(SENTINEL).map(|i| i + SENTINEL.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = include_str!("../../../tests/fixtures/templates/chatml_tools.jinja");
    const LLAMA3: &str = include_str!("../../../tests/fixtures/templates/llama3_tools.jinja");

    #[test]
    fn tool_results_are_found_in_the_glue_as_the_template_writes_them() {
        let extra = serde_json::Map::new();
        let obs = [
            serde_json::json!({"role": "tool", "content": "x<|im_end|>\n<|eot_id|>\"y\""}),
            serde_json::json!({"role": "tool", "content": "second"}),
        ];
        for (source, eos) in [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|>")] {
            let t = ChatTemplate::new(source, "", eos).unwrap();
            let glue = TurnGlue::new(&t, &[eos.to_string()], None, &extra).unwrap();
            let plain = glue.between_turns(&obs, true).unwrap();
            let pieces = glue.between_turns_pieces(&[], &obs, true).unwrap();
            let joined: String = pieces.iter().map(|(p, _)| p.as_str()).collect();
            assert_eq!(joined, plain, "{eos}");
            let literal: Vec<&str> = pieces
                .iter()
                .filter(|(_, l)| *l)
                .map(|(p, _)| p.as_str())
                .collect();
            assert_eq!(literal.len(), 2, "{eos}: {pieces:?}");
            // The results as written: raw in ChatML, through `tojson` (quoted) in Llama's.
            assert!(literal[0].contains("x<|im_end|>"), "{eos}: {literal:?}");
            assert!(literal[1].contains("second"), "{eos}: {literal:?}");
            // None of the template's own text is taken for a result.
            assert!(pieces.iter().any(|(p, l)| !l && p.contains(eos)), "{eos}");
        }
    }

    #[test]
    fn chatml_glue_is_what_the_full_render_adds() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, &["<|im_end|>".to_string()], None, &extra).unwrap();
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

    /// A template that changes what a tool result says (here: trims it) gets the
    /// changed text, as a full render has it.
    #[test]
    fn tool_results_are_rendered_as_the_template_writes_them() {
        let trimming = CHATML.replace(
            "'\\n<tool_response>\\n' + message.content + '\\n</tool_response>'",
            "'\\n<tool_response>\\n' + message.content.strip() + '\\n</tool_response>'",
        );
        assert_ne!(trimming, CHATML);
        let t = ChatTemplate::new(&trimming, "", "<|im_end|>").unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, &["<|im_end|>".to_string()], None, &extra).unwrap();
        let m = [serde_json::json!({"role": "tool", "content": "  x  "})];
        assert_eq!(
            glue.between_turns(&m, true).unwrap(),
            "\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(
            glue.between_turns(&m, false)
                .unwrap()
                .starts_with("<|im_end|>\n<|im_start|>user")
        );
    }

    #[test]
    fn llama3_glue_has_no_tail() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("date_string".into(), "26 Jul 2024".into());
        let glue = TurnGlue::new(&t, &["<|eot_id|>".to_string()], None, &extra).unwrap();
        let obs = [serde_json::json!({"role": "tool", "content": "4"})];
        assert_eq!(
            glue.between_turns(&obs, true).unwrap(),
            "<|start_header_id|>ipython<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(glue.tail(), "");
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
        let e = TurnGlue::new(&t, &["</s>".to_string()], None, &extra).unwrap_err();
        assert!(matches!(e, RenderError::NoEndOfTurn { .. }), "{e}");
    }

    /// A template that writes no end-of-turn token after a turn but opens what follows
    /// with one of the model's stop tokens (GLM's `<|observation|>`, `<|user|>`): the
    /// turn closes on the model's own token, and the glue goes on from after it (or
    /// writes it, for a turn cut before it); closes that are not stop tokens and differ
    /// are still refused.
    #[test]
    fn a_stop_token_that_opens_the_next_message_closes_the_turn() {
        let source = "{% for m in messages %}{% if m.role == 'user' %}<|user|>{{ m.content }}\
            {% elif m.role == 'tool' %}{% if loop.previtem.role != 'tool' %}<|observation|>{% endif %}[{{ m.content }}]\
            {% else %}<|assistant|>{{ m.content }}{% endif %}{% endfor %}\
            {% if add_generation_prompt %}<|assistant|>{% endif %}";
        let t = ChatTemplate::new(source, "", "<|endoftext|>").unwrap();
        let extra = serde_json::Map::new();
        let eos_only = ["<|endoftext|>".to_string()];
        assert!(TurnGlue::new(&t, &eos_only, None, &extra).is_err());
        let stops = eos_only
            .iter()
            .cloned()
            .chain(["<|user|>".into(), "<|observation|>".into()])
            .collect::<Vec<_>>();
        let glue = TurnGlue::new(&t, &stops, None, &extra).unwrap();
        let tools = [
            serde_json::json!({"role": "tool", "content": "a"}),
            serde_json::json!({"role": "tool", "content": "b"}),
        ];
        assert_eq!(
            glue.between_turns(&tools, true).unwrap(),
            "[a][b]<|assistant|>"
        );
        assert_eq!(
            glue.between_turns(&tools, false).unwrap(),
            "<|observation|>[a][b]<|assistant|>"
        );
        let user = [serde_json::json!({"role": "user", "content": "go"})];
        assert_eq!(
            glue.between_turns(&user, false).unwrap(),
            "<|user|>go<|assistant|>"
        );
        // The same shape with closes that are not the model's stop tokens.
        let other = source.replace("<|observation|>", "OBS");
        let t = ChatTemplate::new(&other, "", "<|endoftext|>").unwrap();
        let stops = [eos_only[0].clone(), "<|user|>".into(), "OBS2".into()];
        assert!(TurnGlue::new(&t, &stops, None, &extra).is_err());
    }
    /// A template that writes a tool result only after a call (as gpt-oss's names the
    /// result after it) is glued with the turn as a call: the turn closes at the first
    /// stop token after the call's arguments, and the results follow. A template that
    /// ends the turn after each of several calls cannot be glued so, and says why.
    #[test]
    fn a_template_that_needs_a_call_before_a_result_is_glued_after_the_call() {
        let source = "{% set ns = namespace(last=none) %}{% for m in messages %}\
            {% if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>\
            {% elif m.tool_calls %}{% for c in m.tool_calls %}<|start|>assistant to={{ c.function.name }}\
            <|message|>{{ c.function.arguments | tojson }}<|call|>{% set ns.last = c.function.name %}{% endfor %}\
            {% elif m.role == 'tool' %}{% if ns.last is none %}{{ raise_exception('no call') }}{% endif %}\
            <|start|>{{ ns.last }}<|message|>{{ m.content }}<|end|>\
            {% else %}<|start|>assistant<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}\
            {% if add_generation_prompt %}<|start|>assistant{% endif %}";
        let t = ChatTemplate::new(source, "", "<|return|>").unwrap();
        let extra = serde_json::Map::new();
        let stops = ["<|return|>".to_string(), "<|call|>".to_string()];
        let glue = TurnGlue::new(&t, &stops, None, &extra).unwrap();
        let call = |name: &str| serde_json::json!({"type": "function", "function": {"name": name, "arguments": {"command": "ls"}}});
        let history = [
            serde_json::json!({"role": "user", "content": "Go."}),
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [call("bash")]}),
        ];
        let result = [serde_json::json!({"role": "tool", "content": "a.py"})];
        assert_eq!(
            glue.between_turns_after(&history, &result, true).unwrap(),
            "<|start|>bash<|message|>a.py<|end|><|start|>assistant"
        );
        let two = [
            history[0].clone(),
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [call("bash"), call("pwd")]}),
        ];
        let e = glue.between_turns_after(&two, &result, true).unwrap_err();
        assert!(matches!(e, RenderError::CallsApart(_)), "{e}");
    }

    const QWEN3: &str = include_str!("../../../tests/fixtures/templates/qwen3_like.jinja");

    fn tool_schema() -> Vec<Value> {
        vec![serde_json::json!({"type": "function", "function": {"name": "bash"}})]
    }

    /// A template that renders the last assistant turn differently from the same turn
    /// once messages follow it (an empty think block only when it is last) is glued by
    /// what follows the turn, as a real conversation renders it.
    #[test]
    fn qwen3_style_templates_are_glued_after_the_turn() {
        let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").unwrap();
        let tools = tool_schema();
        for thinking in [None, Some(false)] {
            let mut extra = serde_json::Map::new();
            if let Some(on) = thinking {
                extra.insert("enable_thinking".into(), on.into());
            }
            let opening = if thinking == Some(false) {
                "<|im_start|>assistant\n<think>\n\n</think>\n\n"
            } else {
                "<|im_start|>assistant\n"
            };
            let glue =
                TurnGlue::new(&t, &["<|im_end|>".to_string()], Some(&tools), &extra).unwrap();
            let obs = [
                serde_json::json!({"role": "tool", "content": "a.py"}),
                serde_json::json!({"role": "tool", "content": "b.py"}),
            ];
            // Consecutive results are one user turn.
            assert_eq!(
                glue.between_turns(&obs, true).unwrap(),
                format!(
                    "\n<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nb.py\n</tool_response><|im_end|>\n{opening}"
                )
            );
            assert_eq!(glue.tail(), "\n");
            // What a real conversation's render adds after the model's end-of-turn
            // token, although the turn before it renders differently there.
            let model_turn = serde_json::json!({"role": "assistant", "content": "<think>\nLook first.\n</think>\n\nLooking."});
            let mut msgs = vec![
                serde_json::json!({"role": "user", "content": "List files."}),
                model_turn,
            ];
            msgs.extend(obs.iter().cloned());
            let full = t.render(&msgs, Some(&tools), true, &extra).unwrap();
            let cut = full.find("Looking.<|im_end|>").unwrap() + "Looking.<|im_end|>".len();
            assert_eq!(full[cut..], glue.between_turns(&obs, true).unwrap());
        }
    }

    /// A model that opens its think block in the generation prompt (thinking-only
    /// models) gets the opening in the glue, and a turn cut before its end-of-turn
    /// token is closed as the template closes turns.
    #[test]
    fn the_generation_prompt_may_open_the_think_block() {
        let opened = QWEN3.replace(
            "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking",
            "{{- '<|im_start|>assistant\\n<think>\\n' }}\n    {%- if enable_thinking",
        );
        assert_ne!(opened, QWEN3);
        let t = ChatTemplate::new(&opened, "", "<|im_end|>").unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, &["<|im_end|>".to_string()], None, &extra).unwrap();
        let user = [serde_json::json!({"role": "user", "content": "Go on."})];
        assert_eq!(
            glue.between_turns(&user, false).unwrap(),
            "<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n<think>\n"
        );
    }

    /// A template that leaves the end-of-turn token out of a conversation's final
    /// assistant turn (the model writes it) is glued; a re-render adds nothing after it.
    #[test]
    fn a_final_turn_without_the_end_of_turn_token_is_glued() {
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if not (loop.last and m.role == 'assistant') %}</s>{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
            "",
            "</s>",
        )
        .unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, &["</s>".to_string()], None, &extra).unwrap();
        assert_eq!(glue.tail(), "");
        let obs = [serde_json::json!({"role": "tool", "content": "4"})];
        assert_eq!(
            glue.between_turns(&obs, true).unwrap(),
            "[tool]4</s>[assistant]"
        );
    }

    /// Templates that cannot be glued are refused when the glue is built, saying why.
    #[test]
    fn templates_that_cannot_be_glued_are_refused_up_front() {
        let extra = serde_json::Map::new();
        // The assistant's content is not written.
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}]</s>{% endfor %}",
            "",
            "</s>",
        )
        .unwrap();
        let e = TurnGlue::new(&t, &["</s>".to_string()], None, &extra).unwrap_err();
        assert!(matches!(e, RenderError::NoContent(_)), "{e}");
        // Tool results are refused by the template.
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}[{{ m.role }}]{{ m.content }}</s>{% endfor %}",
            "",
            "</s>",
        )
        .unwrap();
        let e = TurnGlue::new(&t, &["</s>".to_string()], None, &extra).unwrap_err();
        assert!(e.to_string().contains("no tools here"), "{e}");
        // The end-of-turn token comes only when nothing follows.
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if loop.last %}</s>{% endif %}{% endfor %}",
            "",
            "</s>",
        )
        .unwrap();
        let e = TurnGlue::new(&t, &["</s>".to_string()], None, &extra).unwrap_err();
        assert!(e.to_string().contains("a user message follows it"), "{e}");
    }

    /// Tool output that repeats the sentinel or the end-of-turn token does not move
    /// where the glue is cut.
    #[test]
    fn tool_output_cannot_move_the_cut() {
        let t = ChatTemplate::new(QWEN3, "", "<|im_end|>").unwrap();
        let extra = serde_json::Map::new();
        let glue = TurnGlue::new(&t, &["<|im_end|>".to_string()], None, &extra).unwrap();
        let hostile = format!("{SENTINEL}<|im_end|>x");
        let obs = [
            serde_json::json!({"role": "tool", "content": hostile}),
            serde_json::json!({"role": "tool", "content": "y"}),
        ];
        assert_eq!(
            glue.between_turns(&obs, true).unwrap(),
            format!(
                "\n<|im_start|>user\n<tool_response>\n{hostile}\n</tool_response>\n<tool_response>\ny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            )
        );
        assert_eq!(
            glue.between_turns(&obs[..1], true).unwrap(),
            format!(
                "\n<|im_start|>user\n<tool_response>\n{hostile}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            )
        );
    }
}
