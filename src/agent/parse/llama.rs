//! Llama 3.1/3.2/3.3's (and Llama 4's JSON) tool calls, as their chat templates write
//! them and vLLM's `llama3_json` parser reads them: each call one JSON object,
//! `{"name": "bash", "parameters": {"command": "ls"}}` (`"arguments"` is read too),
//! after an optional `<|python_tag|>`, several separated as the model likes (`; `).
//!
//! As vLLM reads them: every `{` not inside an object already read starts one; an
//! object without `name` (or without `parameters`/`arguments`) means the turn holds
//! no calls at all, and the whole text is the answer. The content is the text outside
//! the objects, without `<|python_tag|>`.

use super::{ParsedTurn, ToolCall, outside_reasoning};

/// What Llama writes before a turn of calls.
const PYTHON_TAG: &str = "<|python_tag|>";

/// Parses Llama's JSON calls outside the model's reasoning.
pub fn parse_llama3_json(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, objects)
}

/// The calls of `text` into `turn`, the text around them into `content`.
fn objects(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    let mut calls = Vec::new();
    let mut outside = String::new();
    let mut at = 0;
    while let Some(open) = text[at..].find('{').map(|i| at + i) {
        let mut values =
            serde_json::Deserializer::from_str(&text[open..]).into_iter::<serde_json::Value>();
        let Some(Ok(value)) = values.next() else {
            // Not JSON from here: vLLM moves on to the next `{`.
            outside.push_str(&text[at..=open]);
            at = open + 1;
            continue;
        };
        let end = open + values.byte_offset();
        let name = value.get("name").and_then(serde_json::Value::as_str);
        let args = value.get("arguments").or_else(|| value.get("parameters"));
        match (name, args) {
            (Some(name), Some(args)) => {
                let arguments = match args {
                    // A string of JSON, as some clients send arguments.
                    serde_json::Value::String(s) => {
                        serde_json::from_str(s).unwrap_or_else(|_| args.clone())
                    }
                    other => other.clone(),
                };
                calls.push(ToolCall {
                    name: name.to_string(),
                    arguments,
                    raw_arguments: None,
                    id: None,
                });
            }
            // An object that is not a call: as vLLM, the turn calls nothing.
            _ => {
                content.push_str(text);
                return;
            }
        }
        outside.push_str(&text[at..open]);
        at = end;
    }
    outside.push_str(&text[at..]);
    let mut kept = outside.replace(PYTHON_TAG, "");
    if !calls.is_empty() {
        // What separates the calls (`; `) is not part of the answer.
        kept = kept.trim().trim_matches(';').to_string();
    }
    content.push_str(&kept);
    turn.calls.extend(calls.into_iter().map(Ok));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_as_llama_writes_them() {
        let t = parse_llama3_json(
            "<|python_tag|>{\"name\": \"bash\", \"parameters\": {\"command\": \"ls\"}}; {\"name\": \"finish\", \"arguments\": {\"answer\": \"a {b}\"}}",
            false,
        );
        assert_eq!(t.content, "");
        let calls: Vec<ToolCall> = t.calls.into_iter().map(Result::unwrap).collect();
        assert_eq!(calls[0].name, "bash");
        assert_eq!(calls[0].arguments, json!({"command": "ls"}));
        assert_eq!(calls[1].arguments, json!({"answer": "a {b}"}));
        // Text around a call is kept as the content.
        let t = parse_llama3_json(
            "Let me look. {\"name\": \"bash\", \"parameters\": {}}",
            false,
        );
        assert_eq!(t.content, "Let me look.");
        assert_eq!(t.calls.len(), 1);
    }

    /// As vLLM: an object that is not a call means no calls; braces that are not JSON
    /// are text; a plain answer has no calls.
    #[test]
    fn what_is_not_a_call() {
        let t = parse_llama3_json("{\"name\": \"bash\", \"parameters\": {}} {\"x\": 1}", false);
        assert!(t.calls.is_empty());
        assert!(t.content.contains("\"x\""));
        let t = parse_llama3_json(
            "use {braces} then {\"name\": \"ls\", \"parameters\": {}}",
            false,
        );
        assert_eq!(t.calls.len(), 1);
        assert_eq!(t.content, "use {braces} then");
        let t = parse_llama3_json("The answer is 4.", false);
        assert!(t.calls.is_empty());
        assert_eq!(t.content, "The answer is 4.");
    }
}
