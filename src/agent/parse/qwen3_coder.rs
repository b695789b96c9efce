//! Qwen3-Coder's XML tool calls (also Qwen3.5's), as its chat template writes them and
//! vLLM's `qwen3_coder` parser reads them:
//!
//! ```text
//! <tool_call>
//! <function=bash>
//! <parameter=command>
//! ls -la
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Each parameter's value is its text, without the one newline the template writes
//! after the opening tag and the one before the closing tag; a value ends at its
//! `</parameter>` or where the next `<parameter=` begins, and a last one that does
//! neither is dropped, as vLLM drops it (`tests/parsers.rs` holds these against vLLM's
//! own converter). Values stay strings, as
//! vLLM 0.32 hands them on (the template writes a string back with `|string`, so a
//! re-render of the call is the model's own text). A `<function=…>` with no
//! `<tool_call>` before it is a call too, as vLLM reads it.

use super::{CLOSE, CallError, OPEN, ParsedTurn, ToolCall, outside_reasoning};

const FUNCTION: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_CLOSE: &str = "</parameter>";

/// Parses Qwen3-Coder's calls outside the model's reasoning (see
/// [`super::parse_hermes`]); the content is the text around them.
pub fn parse_qwen3_coder(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, blocks)
}

/// The calls of `text` into `turn`, the text around them into `content`.
fn blocks(text: &str, turn: &mut ParsedTurn, content: &mut String) {
    let mut rest = text;
    loop {
        let call = rest.find(OPEN);
        let bare = rest.find(FUNCTION);
        let (start, wrapped) = match (call, bare) {
            (Some(c), Some(f)) if f < c => (f, false),
            (Some(c), _) => (c, true),
            (None, Some(f)) => (f, false),
            (None, None) => break,
        };
        content.push_str(&rest[..start]);
        if wrapped {
            let body = &rest[start + OPEN.len()..];
            match body.find(CLOSE) {
                Some(end) => {
                    turn.calls.push(function(&body[..end], &rest[start..]));
                    rest = &body[end + CLOSE.len()..];
                }
                None => {
                    turn.calls.push(Err(CallError {
                        message: format!("a {OPEN} block was not closed with {CLOSE}"),
                        raw: rest[start..].to_string(),
                    }));
                    rest = "";
                }
            }
        } else {
            let body = &rest[start..];
            let end = body
                .find(FUNCTION_CLOSE)
                .map_or(body.len(), |e| e + FUNCTION_CLOSE.len());
            turn.calls.push(function(&body[..end], body));
            rest = &body[end..];
        }
    }
    content.push_str(rest);
}

/// One `<function=NAME>…</function>` (the inside of a `<tool_call>` block, or a bare
/// one); `raw` is the text shown back with an error.
fn function(block: &str, raw: &str) -> Result<ToolCall, CallError> {
    let fail = |message: String| CallError {
        message,
        raw: raw.chars().take(2000).collect(),
    };
    let Some(at) = block.find(FUNCTION) else {
        return Err(fail(format!(
            "a {OPEN} block must hold {FUNCTION}NAME>, with each argument in a {PARAMETER}NAME> block"
        )));
    };
    let after = &block[at + FUNCTION.len()..];
    let Some(close) = after.find('>') else {
        return Err(fail(format!("{FUNCTION} must end its name with >")));
    };
    let name = after[..close].trim();
    if name.is_empty() {
        return Err(fail(format!("{FUNCTION}> names no function")));
    }
    let body = &after[close + 1..];
    let body = body.find(FUNCTION_CLOSE).map_or(body, |e| &body[..e]);
    let mut arguments = serde_json::Map::new();
    let mut rest = body;
    while let Some(open) = rest.find(PARAMETER) {
        let after = &rest[open + PARAMETER.len()..];
        let Some(close) = after.find('>') else {
            return Err(fail(format!("{PARAMETER} must end its name with >")));
        };
        let key = after[..close].trim();
        let value = &after[close + 1..];
        let end = match (value.find(PARAMETER_CLOSE), value.find(PARAMETER)) {
            (Some(c), Some(n)) if n < c => n,
            (Some(c), _) => c,
            (None, Some(n)) => n,
            // Neither closed nor followed by another: vLLM drops it (a call cut short).
            (None, None) => break,
        };
        let text = value[..end].strip_prefix('\n').unwrap_or(&value[..end]);
        let text = text.strip_suffix('\n').unwrap_or(text);
        arguments.insert(key.to_string(), serde_json::Value::String(text.to_string()));
        rest = &value[end..];
        rest = rest.strip_prefix(PARAMETER_CLOSE).unwrap_or(rest);
    }
    Ok(ToolCall {
        name: name.to_string(),
        arguments: serde_json::Value::Object(arguments),
        raw_arguments: None,
        id: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &[(&str, &str)]) -> String {
        let mut s = format!("<tool_call>\n<function={name}>\n");
        for (k, v) in args {
            s.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
        }
        s.push_str("</function>\n</tool_call>");
        s
    }

    /// Output shaped as Qwen3-Coder writes it: text, then calls, values that span lines
    /// and hold markup, parameters the model did not close.
    #[test]
    fn calls_as_the_model_writes_them() {
        let text = format!(
            "I will look first.\n{}\n{}",
            call("bash", &[("command", "ls -la")]),
            call(
                "write_file",
                &[
                    ("path", "a.py"),
                    ("content", "def f():\n    return '<b>'\n\n")
                ]
            )
        );
        let t = parse_qwen3_coder(&text, false);
        assert_eq!(t.content, "I will look first.");
        let calls: Vec<ToolCall> = t.calls.into_iter().map(Result::unwrap).collect();
        assert_eq!(calls[0].name, "bash");
        assert_eq!(calls[0].arguments, serde_json::json!({"command": "ls -la"}));
        assert_eq!(
            calls[1].arguments,
            serde_json::json!({"path": "a.py", "content": "def f():\n    return '<b>'\n\n"})
        );
        // A parameter cut by the next one, and a bare function block.
        let t = parse_qwen3_coder(
            "<function=bash>\n<parameter=command>\npwd\n<parameter=timeout>\n5\n</parameter>\n</function> done",
            false,
        );
        assert_eq!(t.content, "done");
        assert_eq!(
            t.calls[0].as_ref().unwrap().arguments,
            serde_json::json!({"command": "pwd", "timeout": "5"})
        );
    }

    /// Calls in the reasoning are not run; malformed ones are errors shown back.
    #[test]
    fn reasoning_and_malformed_calls() {
        let rm = call("bash", &[("command", "rm -rf /")]);
        let ls = call("bash", &[("command", "ls")]);
        let t = parse_qwen3_coder(&format!("<think>maybe {rm}</think>\n{ls}"), false);
        assert_eq!(t.calls.len(), 1);
        assert_eq!(t.calls[0].as_ref().unwrap().arguments["command"], "ls");
        for bad in [
            "<tool_call>\n<function=bash>\n<parameter=command>\nls",
            "<tool_call>\nno function here\n</tool_call>",
            "<tool_call>\n<function=>\n</function>\n</tool_call>",
            "<tool_call>\n<function=bash\n</tool_call>",
        ] {
            let t = parse_qwen3_coder(bad, false);
            assert!(t.calls[0].is_err(), "{bad}: {t:?}");
        }
    }
}
