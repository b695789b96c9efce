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

use serde::{Deserialize, Serialize};

/// One well-formed tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments: always a JSON object.
    pub arguments: serde_json::Value,
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
    /// The calls in order, each parsed or not.
    pub calls: Vec<Result<ToolCall, CallError>>,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Parses Hermes-style `<tool_call>` blocks.
pub fn parse_hermes(text: &str) -> ParsedTurn {
    let mut turn = ParsedTurn::default();
    let mut content = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        match after.find(CLOSE) {
            Some(end) => {
                turn.calls.push(hermes_call(&after[..end]));
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
    turn.content = content.trim().to_string();
    turn
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
        serde_json::Value::Null => serde_json::json!({}),
        // Some models send the arguments as a JSON string, as OpenAI's API does.
        serde_json::Value::String(s) => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            _ => return Err(err("\"arguments\" must be a JSON object".into())),
        },
        _ => return Err(err("\"arguments\" must be a JSON object".into())),
    };
    Ok(ToolCall { name, arguments })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_and_surrounding_text() {
        let t = parse_hermes(
            "Let me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n\
             <tool_call>{\"name\": \"python\", \"arguments\": \"{\\\"code\\\": \\\"1+1\\\"}\"}</tool_call>",
        );
        assert_eq!(t.content, "Let me look.");
        assert_eq!(
            t.calls,
            vec![
                Ok(ToolCall {
                    name: "bash".into(),
                    arguments: serde_json::json!({"command": "ls"})
                }),
                Ok(ToolCall {
                    name: "python".into(),
                    arguments: serde_json::json!({"code": "1+1"})
                }),
            ]
        );
    }

    #[test]
    fn hermes_malformed_calls_become_errors_not_failures() {
        let t = parse_hermes(
            "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": }</tool_call>",
        );
        let e = t.calls[0].as_ref().unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{e:?}");
        let t = parse_hermes("<tool_call>{\"arguments\": {}}</tool_call>");
        assert!(
            t.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("no \"name\"")
        );
        let t = parse_hermes("<tool_call>{\"name\": \"x\", \"arguments\": [1]}</tool_call>");
        assert!(
            t.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("must be a JSON object")
        );
        let t = parse_hermes("thinking... <tool_call>{\"name\": \"x\"");
        assert!(
            t.calls[0]
                .as_ref()
                .unwrap_err()
                .message
                .contains("not closed")
        );
        assert_eq!(t.content, "thinking...");
        assert_eq!(parse_hermes("just an answer").calls, vec![]);
    }

    #[test]
    fn one_bash_block_per_turn() {
        let t = parse_bash_block("I will list files.\n```bash\nls -la\ncd src\n```\n");
        assert_eq!(t.content, "I will list files.");
        assert_eq!(
            t.calls,
            vec![Ok(ToolCall {
                name: "bash".into(),
                arguments: serde_json::json!({"command": "ls -la\ncd src"})
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
}
