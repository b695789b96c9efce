//! Mistral's tool calls, as its chat templates write them and vLLM's `mistral` parser
//! reads them. Every call follows a `[TOOL_CALLS]` token, in one of two shapes:
//!
//! ```text
//! [TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}, "id": "c00000000"}]
//! [TOOL_CALLS]bash[ARGS]{"command": "ls"}[TOOL_CALLS]pwd[ARGS]{}
//! ```
//!
//! The first is the tokenizers' before v11 (Mistral 7B v0.3, Nemo, Small 3.1): one JSON
//! list of calls (or one call object), each with its name, its arguments (an object,
//! or a JSON string of one; none is `{}`) and maybe the id the templates write back.
//! The second is v11's on (Devstral, Magistral, Small 3.2, Ministral 3): a name, then
//! `[ARGS]` (or straight away the `{` of) the arguments' JSON object, kept as written
//! since those templates write a string argument back verbatim; a `[CALL_ID]ID` may
//! follow the name. Text before the first marker is the content, and so is text after a
//! call's JSON. Magistral's `[THINK]…[/THINK]` reasoning is reasoning, as `<think>` is.

use super::{CallError, ParsedTurn, ToolCall, marked_reasoning, outside_reasoning, outside_spans};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
const THINK: &str = "[THINK]";
const THINK_END: &str = "[/THINK]";

/// Parses Mistral's calls outside the model's reasoning (see [`super::parse_hermes`]).
pub fn parse_mistral(text: &str, reasoning_open: bool) -> ParsedTurn {
    match think_spans(text, reasoning_open) {
        Some(spans) => outside_spans(text, &spans, markers),
        None => outside_reasoning(text, reasoning_open, markers),
    }
}

/// Where Magistral's `[THINK]…[/THINK]` reasoning is in `text`, when it writes those
/// tokens (`None` when it does not: then `<think>` marks it, as for the other families).
pub(super) fn think_spans(text: &str, reasoning_open: bool) -> Option<Vec<(usize, usize)>> {
    (text.contains(THINK) || text.contains(THINK_END))
        .then(|| marked_reasoning(text, reasoning_open, THINK, THINK_END))
}

/// The calls after each `[TOOL_CALLS]` of `text` into `turn`, the rest into `content`.
fn markers(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    let mut parts = text.split(TOOL_CALLS);
    content.push_str(parts.next().unwrap_or_default());
    for part in parts {
        let body = part.trim_start();
        if body.is_empty() {
            // Markers with nothing between them count as one, as vLLM reads them.
            continue;
        }
        if body.starts_with(['[', '{']) {
            json_calls(body, turn, content);
        } else {
            named_call(part, turn, content);
        }
    }
}

/// The JSON value at the start of `text` and the byte offset just past it.
fn leading_json(text: &str) -> Result<(serde_json::Value, usize), serde_json::Error> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    match values.next() {
        Some(Ok(v)) => Ok((v, values.byte_offset())),
        Some(Err(e)) => Err(e),
        None => Err(serde::de::Error::custom("nothing follows")),
    }
}

/// A list of calls (or one call object) in JSON, as tokenizers before v11 write them.
fn json_calls(body: &str, turn: &mut ParsedTurn, content: &mut String) {
    let form = format!("write {TOOL_CALLS} [{{\"name\": <tool name>, \"arguments\": {{...}}}}]");
    let (value, end) = match leading_json(body) {
        Ok(v) => v,
        Err(e) => {
            turn.calls.push(Err(CallError {
                message: format!("the calls are not valid JSON ({e}); {form}"),
                raw: format!("{TOOL_CALLS}{body}"),
            }));
            return;
        }
    };
    let items = match value {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    };
    for item in items {
        turn.calls
            .push(json_call(&item).map_err(|message| CallError {
                message: format!("{message}; {form}"),
                raw: item.to_string(),
            }));
    }
    content.push_str(&body[end..]);
}

/// One call object of a JSON list.
fn json_call(item: &serde_json::Value) -> Result<ToolCall, String> {
    let serde_json::Value::Object(call) = item else {
        return Err("each call must be a JSON object".into());
    };
    let name = call
        .get("name")
        .and_then(serde_json::Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or("the call has no \"name\" string")?;
    let arguments = match call.get("arguments") {
        None | Some(serde_json::Value::Null) => serde_json::json!({}),
        Some(v @ serde_json::Value::Object(_)) => v.clone(),
        Some(serde_json::Value::String(s)) => match serde_json::from_str(s) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            _ => return Err("\"arguments\" must be a JSON object".into()),
        },
        Some(_) => return Err("\"arguments\" must be a JSON object".into()),
    };
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
        raw_arguments: None,
        id: call
            .get("id")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    })
}

/// One `NAME[ARGS]{…}` (or `NAME{…}`, or `NAME[CALL_ID]ID[ARGS]{…}`) call, as v11's
/// tokenizers on write them; text after its JSON joins the content.
fn named_call(part: &str, turn: &mut ParsedTurn, content: &mut String) {
    let form = format!("write {TOOL_CALLS}<tool name>{ARGS}{{...}}");
    let err = |message: String| CallError {
        message: format!("{message}; {form}"),
        raw: format!("{TOOL_CALLS}{part}"),
    };
    let (head, json) = match part.find(ARGS) {
        Some(at) => (&part[..at], &part[at + ARGS.len()..]),
        None => match part.find('{') {
            Some(at) => (&part[..at], &part[at..]),
            None => {
                turn.calls
                    .push(Err(err("the call has no arguments after its name".into())));
                return;
            }
        },
    };
    let (name, id) = match head.split_once(CALL_ID) {
        Some((name, id)) => (name.trim(), Some(id.trim().to_string())),
        None => (head.trim(), None),
    };
    if name.is_empty() || name.contains(['{', '[', '"']) {
        turn.calls
            .push(Err(err("the call must start with the tool's name".into())));
        return;
    }
    let lead = json.len() - json.trim_start().len();
    match leading_json(&json[lead..]) {
        Ok((arguments @ serde_json::Value::Object(_), end)) => {
            turn.calls.push(Ok(ToolCall {
                name: name.to_string(),
                arguments,
                raw_arguments: Some(json[lead..lead + end].to_string()),
                id,
            }));
            content.push_str(&json[lead + end..]);
        }
        Ok(_) => turn
            .calls
            .push(Err(err("the arguments must be a JSON object".into()))),
        Err(e) => turn
            .calls
            .push(Err(err(format!("the arguments are not valid JSON ({e})")))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(t: &ParsedTurn) -> Vec<ToolCall> {
        t.calls.iter().map(|c| c.clone().unwrap()).collect()
    }

    /// The JSON list of the tokenizers before v11: several calls, ids kept, arguments
    /// as an object, as a JSON string, or missing.
    #[test]
    fn json_lists_as_mistral_7b_writes_them() {
        let t = parse_mistral(
            r#"Let me see. [TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}, "id": "a1B2c3D4e"}, {"name": "python", "arguments": "{\"code\": \"1\"}"}, {"name": "list_tools"}]"#,
            false,
        );
        assert_eq!(t.content, "Let me see.");
        let calls = ok(&t);
        assert_eq!(calls[0].name, "bash");
        assert_eq!(calls[0].arguments, json!({"command": "ls"}));
        assert_eq!(calls[0].id.as_deref(), Some("a1B2c3D4e"));
        assert_eq!(calls[0].raw_arguments, None);
        assert_eq!(calls[1].arguments, json!({"code": "1"}));
        assert_eq!(calls[1].id, None);
        assert_eq!(calls[2].arguments, json!({}));
        // One object rather than a list.
        let t = parse_mistral(r#"[TOOL_CALLS]{"name": "pwd", "arguments": {}}"#, false);
        assert_eq!(ok(&t)[0].name, "pwd");
    }

    /// v11's calls: one per marker, `[ARGS]` or a bare `{`, an optional `[CALL_ID]`,
    /// the arguments kept as written.
    #[test]
    fn named_calls_as_devstral_writes_them() {
        let t = parse_mistral(
            "I will look.[TOOL_CALLS]bash[ARGS]{\"command\":  \"ls -la\"}[TOOL_CALLS]finish{\"answer\": \"done\"}[TOOL_CALLS]read[CALL_ID]x9Y8z7W6v[ARGS]{}",
            false,
        );
        assert_eq!(t.content, "I will look.");
        let calls = ok(&t);
        assert_eq!(calls[0].name, "bash");
        assert_eq!(calls[0].arguments, json!({"command": "ls -la"}));
        assert_eq!(
            calls[0].raw_arguments.as_deref(),
            Some("{\"command\":  \"ls -la\"}")
        );
        assert_eq!(calls[1].name, "finish");
        assert_eq!(calls[2].id.as_deref(), Some("x9Y8z7W6v"));
    }

    /// Malformed calls are errors the model is shown; calls in the reasoning (either
    /// marker) do not run; text with no marker calls nothing.
    #[test]
    fn malformed_calls_and_reasoning() {
        for bad in [
            "[TOOL_CALLS] [{\"name\": \"bash\", \"arguments\": {\"command\": }]",
            "[TOOL_CALLS] [{\"arguments\": {}}]",
            "[TOOL_CALLS] [\"bash\"]",
            "[TOOL_CALLS] [{\"name\": \"bash\", \"arguments\": [1]}]",
            "[TOOL_CALLS]bash[ARGS]not json",
            "[TOOL_CALLS]bash[ARGS][1, 2]",
            "[TOOL_CALLS]bash",
            "[TOOL_CALLS][ARGS]{}",
        ] {
            let t = parse_mistral(bad, false);
            assert!(t.calls.first().is_some_and(Result::is_err), "{bad}: {t:?}");
        }
        let t = parse_mistral(
            "[THINK]maybe [TOOL_CALLS]rm[ARGS]{}[/THINK][TOOL_CALLS]ls[ARGS]{}",
            false,
        );
        assert_eq!(ok(&t).len(), 1);
        assert_eq!(ok(&t)[0].name, "ls");
        let t = parse_mistral("<think>[TOOL_CALLS]rm[ARGS]{}</think>Done.", false);
        assert!(t.calls.is_empty());
        let t = parse_mistral("No calls: {\"name\": \"bash\"}", false);
        assert!(t.calls.is_empty());
        assert_eq!(t.content, "No calls: {\"name\": \"bash\"}");
    }
}
