//! GLM-4.5's (and 4.6's, 4.7's) tool calls, as its chat template writes them and vLLM's
//! `glm45` parser reads them:
//!
//! ```text
//! <tool_call>bash
//! <arg_key>command</arg_key>
//! <arg_value>ls -la</arg_value>
//! </tool_call>
//! ```
//!
//! The function's name runs from `<tool_call>` to the first `<arg_key>` (or the
//! block's end), trimmed; each key is trimmed and its value kept exactly as written (a
//! string, as vLLM 0.32 hands it on: the template writes a string argument back as it
//! is). A call may have no arguments.

use super::{CLOSE, CallError, OPEN, ParsedTurn, ToolCall, outside_reasoning, tool_call_blocks};

const KEY: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";

/// Parses GLM's calls outside the model's reasoning (see [`super::parse_hermes`]); the
/// content is the text around them.
pub fn parse_glm45(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, blocks)
}

/// The `<tool_call>` blocks of `text` into `turn`, the text around them into `content`.
fn blocks(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    tool_call_blocks(
        text,
        turn,
        content,
        |body| body.find(CLOSE),
        |body| {
            call(body).map_err(|message| CallError {
                message,
                raw: format!("{OPEN}{body}{CLOSE}"),
            })
        },
    );
}

/// One block's inside: the name, then `<arg_key>…</arg_key><arg_value>…</arg_value>`
/// pairs (whitespace between them ignored).
fn call(body: &str) -> Result<ToolCall, String> {
    let form = format!("write {OPEN}NAME{KEY}key{KEY_CLOSE}{VALUE}value{VALUE_CLOSE}…{CLOSE}");
    let name_end = body.find(KEY).unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() || name.contains(['<', '>', '{']) {
        return Err(format!("the call must start with the tool's name; {form}"));
    }
    let mut arguments = serde_json::Map::new();
    let mut rest = &body[name_end..];
    loop {
        let trimmed = rest.trim_start();
        if trimmed.is_empty() {
            break;
        }
        let after_key = trimmed.strip_prefix(KEY).ok_or_else(|| {
            format!(
                "unexpected text {:?} among the arguments; {form}",
                head(trimmed)
            )
        })?;
        let (key, after) = after_key
            .split_once(KEY_CLOSE)
            .ok_or_else(|| format!("an {KEY} was not closed with {KEY_CLOSE}; {form}"))?;
        let after_value = after
            .trim_start()
            .strip_prefix(VALUE)
            .ok_or_else(|| format!("the key {:?} has no {VALUE}; {form}", key.trim()))?;
        let (value, after) = after_value
            .split_once(VALUE_CLOSE)
            .ok_or_else(|| format!("an {VALUE} was not closed with {VALUE_CLOSE}; {form}"))?;
        arguments.insert(
            key.trim().to_string(),
            serde_json::Value::String(value.to_string()),
        );
        rest = after;
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments: serde_json::Value::Object(arguments),
        raw_arguments: None,
        id: None,
    })
}

/// The first characters of `s`, for a message.
fn head(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls shaped as GLM writes them: newlines between the parts, values that span
    /// lines, a call without arguments, text before.
    #[test]
    fn calls_as_the_model_writes_them() {
        let text = "I will check.\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la\npwd</arg_value>\n</tool_call>\n<tool_call>list_tools</tool_call><tool_call>write<arg_key> path </arg_key><arg_value> a.py</arg_value></tool_call>";
        let t = parse_glm45(text, false);
        assert_eq!(t.content, "I will check.");
        let calls: Vec<ToolCall> = t.calls.into_iter().map(Result::unwrap).collect();
        assert_eq!(calls[0].name, "bash");
        assert_eq!(
            calls[0].arguments,
            serde_json::json!({"command": "ls -la\npwd"})
        );
        assert_eq!(calls[1].name, "list_tools");
        assert_eq!(calls[1].arguments, serde_json::json!({}));
        assert_eq!(calls[2].arguments, serde_json::json!({"path": " a.py"}));
    }

    /// Malformed calls are errors shown back; calls in the reasoning do not run.
    #[test]
    fn malformed_calls_and_reasoning() {
        for bad in [
            "<tool_call>bash<arg_key>command</arg_key>ls</tool_call>",
            "<tool_call>bash<arg_key>command<arg_value>ls</arg_value></tool_call>",
            "<tool_call><arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
            "<tool_call>{\"name\": \"bash\"}</tool_call>",
            "<tool_call>bash<arg_key>k</arg_key><arg_value>v",
        ] {
            let t = parse_glm45(bad, false);
            assert!(t.calls[0].is_err(), "{bad}: {t:?}");
        }
        let t = parse_glm45(
            "<think>maybe <tool_call>rm</tool_call></think><tool_call>ls</tool_call>",
            false,
        );
        assert_eq!(t.calls.len(), 1);
        assert_eq!(t.calls[0].as_ref().unwrap().name, "ls");
    }
}
