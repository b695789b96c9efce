//! Tool-call parsers: how a model's turn text becomes tool calls.
//!
//! A parse never fails as a whole. Each call the model attempted comes back either as a
//! [`ToolCall`] or as a [`CallError`] whose message the agent loop shows the model as an
//! observation, so a malformed call teaches the policy instead of crashing the episode.
//!
//! - [`parse_hermes`]: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks, the
//!   format of the Hermes / Qwen family (the default).
//! - [`parse_bash_block`]: one fenced ```` ```bash ```` block per turn, run by the `bash`
//!   tool (SWE-agent style scaffolds).
//! - [`parse_deepseek_r1`]: DeepSeek-R1's (and V3's) `<｜tool▁calls▁begin｜>` section,
//!   a call per `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` with its arguments in a
//!   ```` ```json ```` block, as their chat template writes calls and vLLM's
//!   `deepseek_v3` parser reads them; and V3.1's `NAME<｜tool▁sep｜>JSON` calls in the
//!   same section, as `deepseek_v31` reads them.
//! - [`parse_qwen3_coder`]: Qwen3-Coder's XML calls (`<function=…>` with a
//!   `<parameter=…>` block per argument), as vLLM's `qwen3_coder` reads them.
//! - [`parse_glm45`]: GLM-4.5's `<tool_call>NAME<arg_key>…</arg_key><arg_value>…`
//!   calls, as vLLM's `glm45` reads them.
//! - [`parse_llama3_json`]: Llama 3.x's (and Llama 4's JSON) `{"name", "parameters"}`
//!   calls, as vLLM's `llama3_json` reads them.
//! - [`parse_pythonic`]: Llama 3.2's and Llama 4's pythonic `[f(x=1), g()]` turns, as
//!   vLLM's `pythonic` reads them.
//! - [`parse_mistral`]: Mistral's `[TOOL_CALLS]` calls, both the JSON list of the
//!   tokenizers before v11 and the `NAME[ARGS]{…}` calls after, as vLLM's `mistral`
//!   reads them.
//! - [`parse_kimi_k2`]: Kimi-K2's `<|tool_calls_section_begin|>` sections, each call
//!   named by its id `functions.NAME:N`, as vLLM's `kimi_k2` reads them.
//! - [`parse_gpt_oss`]: gpt-oss's harmony messages (channels, `to=functions.NAME`
//!   recipients), as vLLM's harmony parser reads them.

use serde::{Deserialize, Serialize};

mod detect;
mod glm;
mod harmony;
mod kimi;
mod llama;
mod mistral;
mod pythonic;
mod qwen3_coder;

pub use detect::{choose, detect};
pub use glm::parse_glm45;
pub use harmony::parse_gpt_oss;
pub use kimi::parse_kimi_k2;
pub use llama::parse_llama3_json;
pub use mistral::parse_mistral;
pub use pythonic::parse_pythonic;
pub use qwen3_coder::parse_qwen3_coder;

use crate::domain::parser::Parser;

/// One well-formed tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments: always a JSON object.
    pub arguments: serde_json::Value,
    /// The arguments' text exactly as the model wrote it, for formats whose chat
    /// templates write a call's arguments back as that string (DeepSeek-R1's): a
    /// re-render of the conversation then gives the model's own text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
    /// The call's id: the one the model wrote, in the formats whose calls carry one
    /// (Kimi-K2's `functions.NAME:N`, Mistral's JSON lists), else the one the agent loop
    /// gave it ([`call_id`]). The assistant message and the tool result of a re-render
    /// carry it, as templates that pair them (Mistral's, Kimi's) need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// A call the model attempted that could not be understood.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallError {
    /// What was wrong, written for the model to read and correct.
    pub message: String,
    /// The offending text, as the model wrote it.
    pub raw: String,
}

/// What a turn contained.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedTurn {
    /// The text outside tool calls, trimmed.
    pub content: String,
    /// The reasoning, for formats that keep it apart from the content (gpt-oss's
    /// `analysis` channel); empty for the others, whose content holds it as written.
    pub reasoning: String,
    /// The calls in order, each parsed or not.
    pub calls: Vec<Result<ToolCall, CallError>>,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// Where the model's reasoning is in `text`, as the reasoning models' templates read a
/// turn back (Qwen3's keep only what follows the last `</think>` as the answer, and drop
/// the rest): everything up to the last `</think>`; with none, all of it when the prompt
/// opened the reasoning (`opened`: the generation prompt ends with `<think>`, as
/// Qwen3-2507's thinking template writes it); and everything from a `<think>` left
/// unclosed after that on. Tool calls are never taken from it.
pub fn reasoning_spans(text: &str, opened: bool) -> Vec<(usize, usize)> {
    marked_reasoning(text, opened, THINK_OPEN, THINK_CLOSE)
}

/// [`reasoning_spans`] with other markers than `<think>` and `</think>` (Magistral's
/// `[THINK]` and `[/THINK]` tokens).
fn marked_reasoning(text: &str, opened: bool, open: &str, close: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut from = 0;
    if let Some(at) = text.rfind(close) {
        from = at + close.len();
        spans.push((0, from));
    } else if opened {
        return vec![(0, text.len())];
    }
    // A reasoning opened again after the last close and never closed: thinking to the
    // end, whatever it writes.
    if let Some(at) = text[from..].find(open) {
        spans.push((from + at, text.len()));
    }
    spans
}

/// Where `parser`'s model reasons in `text` ([`reasoning_spans`], Magistral's
/// `[THINK]` tokens for `mistral`, the `analysis` messages for `gpt_oss`): what its
/// calls are never taken from.
pub fn reasoning_for(parser: Parser, text: &str, opened: bool) -> Vec<(usize, usize)> {
    match parser {
        Parser::Mistral => {
            mistral::think_spans(text, opened).unwrap_or_else(|| reasoning_spans(text, opened))
        }
        Parser::GptOss => harmony::harmony_reasoning(text),
        _ => reasoning_spans(text, opened),
    }
}

/// A turn's content that opens with its reasoning (`<think>R</think>rest`) split into the
/// reasoning and the rest, both as written; `None` when it does not open so.
pub fn split_reasoning(content: &str) -> Option<(&str, &str)> {
    content.strip_prefix(THINK_OPEN)?.split_once(THINK_CLOSE)
}

/// Parses `text` with `parser`, a turn whose prompt opened the model's reasoning when
/// `reasoning_open` (see [`opens_reasoning`]). The parser is named in the shared words
/// ([`Parser`]); what each one does is here.
pub fn parse_turn(parser: Parser, text: &str, reasoning_open: bool) -> ParsedTurn {
    match parser {
        Parser::Hermes => parse_hermes(text, reasoning_open),
        Parser::BashBlock => parse_bash_block(text),
        Parser::DeepseekR1 => parse_deepseek_r1(text, reasoning_open),
        Parser::Qwen3Coder => parse_qwen3_coder(text, reasoning_open),
        Parser::Glm45 => parse_glm45(text, reasoning_open),
        Parser::Llama3Json => parse_llama3_json(text, reasoning_open),
        Parser::Pythonic => parse_pythonic(text, reasoning_open),
        Parser::Mistral => parse_mistral(text, reasoning_open),
        Parser::KimiK2 => parse_kimi_k2(text, reasoning_open),
        Parser::GptOss => parse_gpt_oss(text),
    }
}

/// The id the agent loop (or the agent-program endpoint) gives the `index`-th call of
/// turn (or call) `turn` when the model wrote none, shaped as `parser`'s template
/// accepts: Mistral's templates refuse any id that is not nine letters or digits
/// (`c` + the turn in five digits + the call in three, wrapping past 99,999 turns or
/// 999 calls, which no episode reaches); every other template ignores ids, and gets
/// OpenAI's `call_…` shape.
pub fn call_id(parser: Parser, turn: usize, index: usize) -> String {
    match parser {
        Parser::Mistral => format!("c{:05}{:03}", turn % 100_000, index % 1000),
        _ => format!("call_{turn}_{index}"),
    }
}

/// Gives each call of `parsed` that has no id the one [`call_id`] makes for it, and
/// returns the ids of every attempted call in order (a call that did not parse gets
/// one too: its error observation is that id's tool result).
pub fn give_ids(parser: Parser, parsed: &mut ParsedTurn, turn: usize) -> Vec<String> {
    parsed
        .calls
        .iter_mut()
        .enumerate()
        .map(|(i, call)| match call {
            Ok(c) => c.id.get_or_insert_with(|| call_id(parser, turn, i)).clone(),
            Err(_) => call_id(parser, turn, i),
        })
        .collect()
}

/// Whether a prompt ends inside the model's reasoning: its generation prompt opened
/// `<think>` for the model (see [`parse_hermes`]).
pub fn opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with(THINK_OPEN)
}

/// Parses Hermes-style `<tool_call>` blocks outside the model's reasoning (see
/// `reasoning_spans`; `reasoning_open` when the prompt opened it, see
/// [`opens_reasoning`]): a call the model only thought about is not run. The content
/// keeps the reasoning as written.
pub fn parse_hermes(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, hermes_blocks)
}

/// Parses the calls of `text` outside the model's reasoning with `calls` (which takes a
/// part of the text, adds the calls it finds to the turn and the text around them to
/// the content); the reasoning joins the content as written.
fn outside_reasoning(
    text: &str,
    reasoning_open: bool,
    calls: fn(&str, &mut ParsedTurn, &mut String),
) -> ParsedTurn {
    outside_spans(text, &reasoning_spans(text, reasoning_open), calls)
}

/// [`outside_reasoning`] with the reasoning at `spans` (ordered, apart).
fn outside_spans(
    text: &str,
    spans: &[(usize, usize)],
    calls: fn(&str, &mut ParsedTurn, &mut String),
) -> ParsedTurn {
    let mut turn = ParsedTurn::default();
    let mut content = String::new();
    let mut at = 0;
    for &(a, b) in spans {
        calls(&text[at..a], &mut turn, &mut content);
        content.push_str(&text[a..b]);
        at = b;
    }
    calls(&text[at..], &mut turn, &mut content);
    turn.content = content.trim().to_string();
    turn
}

/// The `<tool_call>` blocks of `text` into `turn`, the text around them into `content`.
fn hermes_blocks(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    tool_call_blocks(text, turn, content, block_end, hermes_call);
}

/// The `<tool_call>…</tool_call>` blocks of `text` into `turn`, each block's inside
/// (up to where `end` says it closes) read by `call`, and the text around them into
/// `content`; a block that is not closed is an error holding the rest of the text.
/// The Hermes and GLM formats share the frame and differ inside it.
fn tool_call_blocks(
    text: &str,
    turn: &mut ParsedTurn,
    content: &mut String,
    end: fn(&str) -> Option<usize>,
    call: impl Fn(&str) -> Result<ToolCall, CallError>,
) {
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        match end(after) {
            Some(end) => {
                turn.calls.push(call(&after[..end]));
                rest = &after[end + CLOSE.len()..];
            }
            None => {
                turn.calls.push(Err(CallError {
                    message: format!("a {OPEN} block was not closed with {CLOSE}"),
                    raw: rest[start..].to_string(),
                }));
                rest = "";
            }
        }
    }
    content.push_str(rest);
}

/// Where the `</tool_call>` that closes a block starting at `body` is. A JSON object
/// that parses is skipped whole, so a `</tool_call>` inside one of its strings does not
/// end the block; otherwise the first `</tool_call>` does.
fn block_end(body: &str) -> Option<usize> {
    let lead = body.len() - body.trim_start().len();
    if body[lead..].starts_with('{') {
        let mut values =
            serde_json::Deserializer::from_str(&body[lead..]).into_iter::<serde::de::IgnoredAny>();
        if let Some(Ok(_)) = values.next() {
            let json_end = lead + values.byte_offset();
            let tail = &body[json_end..];
            let gap = tail.len() - tail.trim_start().len();
            if tail[gap..].starts_with(CLOSE) {
                return Some(json_end + gap);
            }
        }
    }
    body.find(CLOSE)
}

fn hermes_call(body: &str) -> Result<ToolCall, CallError> {
    let err = |message: String| CallError {
        message,
        raw: body.trim().to_string(),
    };
    let value: serde_json::Value = serde_json::from_str(body.trim()).map_err(|e| {
        err(format!(
            "the tool call is not valid JSON ({e}); write {{\"name\": <tool name>, \"arguments\": {{...}}}}"
        ))
    })?;
    let name = value["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err("the tool call has no \"name\" string".into()))?
        .to_string();
    let arguments = match &value["arguments"] {
        serde_json::Value::Object(_) => value["arguments"].clone(),
        // Some models send the arguments as a JSON string, as OpenAI's API does.
        serde_json::Value::String(s) => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            _ => return Err(err("\"arguments\" must be a JSON object".into())),
        },
        // A call with its arguments under another key (`parameters`, say) or none is
        // not run with nothing: the model is told, as vLLM's parser would fail it.
        serde_json::Value::Null => {
            return Err(err(
                "the tool call has no \"arguments\" object; write {\"name\": <tool name>, \"arguments\": {...}} (use {} for none)".into(),
            ));
        }
        _ => return Err(err("\"arguments\" must be a JSON object".into())),
    };
    Ok(ToolCall {
        name,
        arguments,
        raw_arguments: None,
        id: None,
    })
}

/// Parses a turn that may hold one fenced bash block (```` ```bash ````, ```` ```sh ````
/// or a bare ```` ``` ````); its text becomes a `bash` call.
pub fn parse_bash_block(text: &str) -> ParsedTurn {
    let mut turn = ParsedTurn::default();
    let mut content = String::new();
    let mut blocks = Vec::new();
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        let fence = line.trim_start();
        let lang = fence.strip_prefix("```").map(str::trim);
        match lang {
            Some(l) if l.is_empty() || l == "bash" || l == "sh" || l == "shell" => {
                let mut body = String::new();
                let mut closed = false;
                for inner in lines.by_ref() {
                    if inner.trim() == "```" {
                        closed = true;
                        break;
                    }
                    body.push_str(inner);
                }
                blocks.push((body, closed));
            }
            // A block in another language is prose, not a command: keep it whole.
            Some(_) => {
                content.push_str(line);
                for inner in lines.by_ref() {
                    content.push_str(inner);
                    if inner.trim() == "```" {
                        break;
                    }
                }
            }
            None => content.push_str(line),
        }
    }
    turn.content = content.trim().to_string();
    match blocks.as_slice() {
        [] => {}
        [(body, true)] => turn.calls.push(Ok(ToolCall {
            name: "bash".into(),
            arguments: serde_json::json!({"command": body.trim_end_matches('\n')}),
            raw_arguments: None,
            id: None,
        })),
        [(body, false)] => turn.calls.push(Err(CallError {
            message: "the ```bash block was not closed with ```".into(),
            raw: body.clone(),
        })),
        many => turn.calls.push(Err(CallError {
            message: format!(
                "found {} code blocks; write exactly one ```bash block per turn",
                many.len()
            ),
            raw: text.to_string(),
        })),
    }
    turn
}

const R1_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const R1_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const R1_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const R1_CALL_END: &str = "<｜tool▁call▁end｜>";
const R1_SEP: &str = "<｜tool▁sep｜>";

/// Parses DeepSeek-R1's tool calls outside the model's reasoning (as [`parse_hermes`]
/// keeps calls in reasoning from running): a `<｜tool▁calls▁begin｜>` section holding,
/// per call, `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`.
/// The content is the text before the section (and after it, if any). Each call keeps
/// its arguments' text ([`ToolCall::raw_arguments`]), which R1's template writes back
/// verbatim.
pub fn parse_deepseek_r1(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, r1_section)
}

/// The calls sections of `text` into `turn`, the text around them into `content`.
fn r1_section(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    let marks = Sections {
        begin: R1_CALLS_BEGIN,
        end: R1_CALLS_END,
        call_begin: R1_CALL_BEGIN,
        call_end: R1_CALL_END,
    };
    marked_sections(text, turn, content, &marks, r1_call);
}

/// The markers of a format whose calls come in a section, each call between its own
/// begin and end markers (DeepSeek's, Kimi-K2's).
pub(super) struct Sections {
    pub begin: &'static str,
    pub end: &'static str,
    pub call_begin: &'static str,
    pub call_end: &'static str,
}

/// The sections `marks` delimit in `text` into `turn`, each call's body read by `call`,
/// and the text around the sections into `content`. A section whose end is missing
/// (a turn cut short) holds the rest of the text; a call whose end is missing is an
/// error.
pub(super) fn marked_sections(
    text: &str,
    turn: &mut ParsedTurn,
    content: &mut String,
    marks: &Sections,
    call: fn(&str) -> Result<ToolCall, CallError>,
) {
    let mut rest = text;
    while let Some(start) = rest.find(marks.begin) {
        content.push_str(&rest[..start]);
        let section = &rest[start + marks.begin.len()..];
        let (calls, tail) = match section.find(marks.end) {
            Some(end) => (&section[..end], &section[end + marks.end.len()..]),
            // A turn cut short (max_tokens) may lack the end: its whole calls are run.
            None => (section, ""),
        };
        let mut calls = calls;
        while let Some(open) = calls.find(marks.call_begin) {
            let body = &calls[open + marks.call_begin.len()..];
            match body.find(marks.call_end) {
                Some(end) => {
                    turn.calls.push(call(&body[..end]));
                    calls = &body[end + marks.call_end.len()..];
                }
                None => {
                    turn.calls.push(Err(CallError {
                        message: format!(
                            "a {} call was not closed with {}",
                            marks.call_begin, marks.call_end
                        ),
                        raw: calls[open..].to_string(),
                    }));
                    calls = "";
                }
            }
        }
        rest = tail;
    }
    content.push_str(rest);
}

/// One call's body: `function<｜tool▁sep｜>NAME\n```json\nARGS\n````.
fn r1_call(body: &str) -> Result<ToolCall, CallError> {
    let err = |message: String| CallError {
        message,
        raw: body.to_string(),
    };
    let form = format!(
        "write {R1_CALL_BEGIN}function{R1_SEP}<tool name>\n```json\n{{...}}\n```{R1_CALL_END}"
    );
    let (kind, rest) = body
        .split_once(R1_SEP)
        .ok_or_else(|| err(format!("the call has no {R1_SEP}; {form}")))?;
    if kind.trim() != "function" {
        // DeepSeek-V3.1's shape (vLLM's `deepseek_v31`): `NAME<｜tool▁sep｜>ARGS`, the
        // arguments' JSON right after the separator, with no type and no fence. (A
        // tool named `function` is read in R1's shape.)
        return v31_call(kind, rest).map_err(err);
    }
    let (name, fenced) = rest.split_once('\n').ok_or_else(|| {
        err(format!(
            "the tool name is not followed by its arguments; {form}"
        ))
    })?;
    let name = name.trim();
    if name.is_empty() {
        return Err(err(format!("the call names no tool; {form}")));
    }
    let raw = fenced
        .strip_prefix("```json\n")
        .and_then(|a| a.strip_suffix("\n```"))
        .ok_or_else(|| err(format!("the arguments are not in a ```json block; {form}")))?;
    let arguments = object_arguments(raw).map_err(err)?;
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
        raw_arguments: Some(raw.to_string()),
        id: None,
    })
}

/// A call's arguments written as a JSON object (`raw`), or what is wrong with them, for
/// the model to read.
pub(super) fn object_arguments(raw: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(_) => Err("the arguments must be a JSON object".into()),
        Err(e) => Err(format!("the arguments are not valid JSON ({e})")),
    }
}

/// A DeepSeek-V3.1 call: the tool's name before the separator, the arguments' JSON
/// (kept as written, which its template writes back) after it.
fn v31_call(name: &str, raw: &str) -> Result<ToolCall, String> {
    let form = format!("write {R1_CALL_BEGIN}<tool name>{R1_SEP}{{...}}{R1_CALL_END}");
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("the call names no tool; {form}"));
    }
    let arguments = object_arguments(raw).map_err(|e| format!("{e}; {form}"))?;
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
        raw_arguments: Some(raw.to_string()),
        id: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3.1's calls (`NAME<｜tool▁sep｜>JSON`), several in one section, beside
    /// R1's; their arguments kept as written.
    #[test]
    fn deepseek_v31_calls_are_read_as_vllm_reads_them() {
        let v31 =
            |name: &str, args: &str| format!("{R1_CALL_BEGIN}{name}{R1_SEP}{args}{R1_CALL_END}");
        let text = format!(
            "Let me check.{R1_CALLS_BEGIN}{}{}{R1_CALLS_END}",
            v31("bash", r#"{"command": "ls"}"#),
            v31("read_file", r#"{"path":"a.py","lines":[1,2]}"#)
        );
        let t = parse_deepseek_r1(&text, false);
        assert_eq!(t.content, "Let me check.");
        let calls: Vec<ToolCall> = t.calls.into_iter().map(Result::unwrap).collect();
        assert_eq!(calls[0].name, "bash");
        assert_eq!(calls[0].arguments, serde_json::json!({"command": "ls"}));
        assert_eq!(
            calls[1].raw_arguments.as_deref(),
            Some(r#"{"path":"a.py","lines":[1,2]}"#)
        );
        for bad in [v31("", "{}"), v31("bash", "not json"), v31("bash", "[1]")] {
            let t = parse_deepseek_r1(&format!("{R1_CALLS_BEGIN}{bad}{R1_CALLS_END}"), false);
            assert!(t.calls[0].is_err(), "{bad}: {t:?}");
        }
    }

    /// A turn parsed after a prompt that did not open the reasoning.
    fn hermes(text: &str) -> ParsedTurn {
        parse_hermes(text, false)
    }

    #[test]
    fn hermes_calls_and_surrounding_text() {
        let t = hermes(
            "Let me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n\
             <tool_call>{\"name\": \"python\", \"arguments\": \"{\\\"code\\\": \\\"1+1\\\"}\"}</tool_call>",
        );
        assert_eq!(t.content, "Let me look.");
        assert_eq!(
            t.calls,
            vec![
                Ok(ToolCall {
                    name: "bash".into(),
                    arguments: serde_json::json!({"command": "ls"}),
                    raw_arguments: None,
                    id: None,
                }),
                Ok(ToolCall {
                    name: "python".into(),
                    arguments: serde_json::json!({"code": "1+1"}),
                    raw_arguments: None,
                    id: None,
                }),
            ]
        );
    }

    #[test]
    fn hermes_malformed_calls_become_errors_not_failures() {
        let t =
            hermes("<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": }</tool_call>");
        let e = t.calls[0].as_ref().unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{e:?}");
        let t = hermes("<tool_call>{\"arguments\": {}}</tool_call>");
        assert!(
            t.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("no \"name\"")
        );
        let t = hermes("<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>");
        assert!(
            t.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("must be a JSON object")
        );
        let t = hermes("thinking... <tool_call>{\"name\": \"x\"");
        assert!(
            t.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("not closed")
        );
        assert_eq!(t.content, "thinking...");
        assert_eq!(hermes("just an answer").calls, vec![]);
    }

    #[test]
    fn calls_in_reasoning_are_not_run() {
        let call = "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": \"rm -rf /\"}}</tool_call>";
        // Closed reasoning, opened in the text or in the prompt: only the call after it.
        for text in [
            format!(
                "<think>maybe {call}</think>\nDone. {}",
                call.replace("rm -rf /", "ls")
            ),
            format!(
                "maybe {call}</think>\nDone. {}",
                call.replace("rm -rf /", "ls")
            ),
        ] {
            let t = hermes(&text);
            assert_eq!(t.calls.len(), 1, "{text}");
            assert_eq!(t.calls[0].as_ref().unwrap().arguments["command"], "ls");
            assert!(
                t.content.contains("rm -rf /"),
                "the text is kept as written"
            );
        }
        // Unclosed reasoning: nothing after `<think>` is run.
        let t = hermes(&format!("<think>still thinking {call}"));
        assert!(t.calls.is_empty());
        // A prompt that opened `<think>` (Qwen3-2507 thinking): a turn with no
        // `</think>` is all reasoning.
        let t = parse_hermes(&format!("still thinking {call}"), true);
        assert!(t.calls.is_empty(), "{t:?}");
        let t = parse_hermes(&format!("done</think>\n{call}"), true);
        assert_eq!(t.calls.len(), 1);
        // A second reasoning block: everything before the last `</think>` is reasoning,
        // as the Qwen3 templates read the turn back.
        let text = format!(
            "<think>a</think>\n{call}\n<think>b {call}</think>\nDone. {}",
            call.replace("rm -rf /", "ls")
        );
        let t = hermes(&text);
        assert_eq!(t.calls.len(), 1, "{t:?}");
        assert_eq!(t.calls[0].as_ref().unwrap().arguments["command"], "ls");
        // A `<think>` opened again after the last `</think>` and never closed: what
        // follows it is reasoning, the call before it runs.
        let text = format!(
            "<think>a</think>\n{}\n<think>b {call}",
            call.replace("rm -rf /", "ls")
        );
        for parse in [hermes, |t: &str| parse_hermes(t, true)] {
            let t = parse(&text);
            assert_eq!(t.calls.len(), 1, "{t:?}");
            assert_eq!(t.calls[0].as_ref().unwrap().arguments["command"], "ls");
            assert!(t.content.contains("rm -rf /"), "kept as written: {t:?}");
        }
        assert!(opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!opens_reasoning(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!opens_reasoning("<|im_start|>assistant\n"));
    }

    #[test]
    fn a_call_needs_its_arguments_and_strings_may_hold_the_closing_tag() {
        let t = hermes(
            "<tool_call>{\"name\": \"bash\", \"parameters\": {\"command\": \"ls\"}}</tool_call>",
        );
        let e = t.calls[0].as_ref().unwrap_err();
        assert!(e.message.contains("\"arguments\""), "{e:?}");
        let t = hermes(
            "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"echo '</tool_call>'\"}}\n</tool_call> after",
        );
        assert_eq!(
            t.calls[0].as_ref().unwrap().arguments["command"],
            "echo '</tool_call>'"
        );
        assert_eq!(t.content, "after");
    }

    #[test]
    fn one_bash_block_per_turn() {
        let t = parse_bash_block("I will list files.\n```bash\nls -la\ncd src\n```\n");
        assert_eq!(t.content, "I will list files.");
        assert_eq!(
            t.calls,
            vec![Ok(ToolCall {
                name: "bash".into(),
                arguments: serde_json::json!({"command": "ls -la\ncd src"}),
                raw_arguments: None,
                id: None,
            })]
        );
        let two = parse_bash_block("```bash\nls\n```\nand\n```\npwd\n```");
        assert!(
            two.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("exactly one")
        );
        let open = parse_bash_block("```sh\nls\n");
        assert!(
            open.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("not closed")
        );
        let python = parse_bash_block("```python\nprint(1)\n```");
        assert!(python.calls.is_empty());
    }

    #[test]
    fn deepseek_r1_calls_outside_reasoning_keep_their_argument_text() {
        let call = |name: &str, args: &str| {
            format!("{R1_CALL_BEGIN}function{R1_SEP}{name}\n```json\n{args}\n```{R1_CALL_END}")
        };
        let text = format!(
            "Let me think.\n</think>\n\nI will look.{R1_CALLS_BEGIN}{}\n{}{R1_CALLS_END}",
            call("bash", r#"{"command": "ls"}"#),
            call("python", "{\"code\":\"1+1\"}"),
        );
        let t = parse_deepseek_r1(&text, true);
        assert_eq!(t.content, "Let me think.\n</think>\n\nI will look.");
        assert_eq!(
            t.calls,
            vec![
                Ok(ToolCall {
                    name: "bash".into(),
                    arguments: serde_json::json!({"command": "ls"}),
                    raw_arguments: Some(r#"{"command": "ls"}"#.into()),
                    id: None,
                }),
                Ok(ToolCall {
                    name: "python".into(),
                    arguments: serde_json::json!({"code": "1+1"}),
                    raw_arguments: Some("{\"code\":\"1+1\"}".into()),
                    id: None,
                }),
            ]
        );
        // A call the model only thought about is not run.
        let thought = format!(
            "<think>\n{R1_CALLS_BEGIN}{}{R1_CALLS_END}\n</think>\nNo.",
            call("bash", "{}")
        );
        let t = parse_deepseek_r1(&thought, false);
        assert!(t.calls.is_empty(), "{t:?}");
        // Malformed calls are observations for the model, not failures.
        for bad in [
            format!("{R1_CALLS_BEGIN}{R1_CALL_BEGIN}function{R1_SEP}bash\n{{}}{R1_CALL_END}"),
            format!(
                "{R1_CALLS_BEGIN}{R1_CALL_BEGIN}function{R1_SEP}bash\n```json\n[1]\n```{R1_CALL_END}"
            ),
            format!("{R1_CALLS_BEGIN}{R1_CALL_BEGIN}function bash"),
            format!(
                "{R1_CALLS_BEGIN}{R1_CALL_BEGIN}file{R1_SEP}bash\n```json\n{{}}\n```{R1_CALL_END}"
            ),
        ] {
            let t = parse_deepseek_r1(&bad, false);
            assert_eq!(t.calls.len(), 1, "{bad}");
            assert!(t.calls[0].is_err(), "{bad}: {t:?}");
        }
    }
}
