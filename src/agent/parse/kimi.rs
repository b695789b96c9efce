//! Kimi-K2's tool calls, as its chat template writes them and vLLM's `kimi_k2` parser
//! reads them:
//!
//! ```text
//! <|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! A call's header is its id, `functions.NAME:N` (N counts the conversation's calls),
//! and the tool's name is read from it; the id is kept, since the template writes it
//! back in the call and in its result (`## Return of functions.bash:0`). The arguments
//! are a JSON object (nothing is `{}`), kept as written, which the template writes
//! back verbatim. The content is the text around the section.

use super::{
    CallError, ParsedTurn, Sections, ToolCall, marked_sections, object_arguments, outside_reasoning,
};

const MARKS: Sections = Sections {
    begin: "<|tool_calls_section_begin|>",
    end: "<|tool_calls_section_end|>",
    call_begin: "<|tool_call_begin|>",
    call_end: "<|tool_call_end|>",
};
const ARGUMENTS: &str = "<|tool_call_argument_begin|>";

/// Parses Kimi-K2's calls outside the model's reasoning (see [`super::parse_hermes`]).
pub fn parse_kimi_k2(text: &str, reasoning_open: bool) -> ParsedTurn {
    outside_reasoning(text, reasoning_open, |text, turn, content| {
        marked_sections(text, turn, content, &MARKS, call);
    })
}

/// One call's body: `functions.NAME:N<|tool_call_argument_begin|>{…}`.
fn call(body: &str) -> Result<ToolCall, CallError> {
    let form = format!(
        "write {}functions.<tool name>:<n>{ARGUMENTS}{{...}}{}",
        MARKS.call_begin, MARKS.call_end
    );
    let err = |message: String| CallError {
        message: format!("{message}; {form}"),
        raw: body.to_string(),
    };
    let (header, raw) = body
        .split_once(ARGUMENTS)
        .ok_or_else(|| err(format!("the call has no {ARGUMENTS}")))?;
    let id = header.trim();
    // As vLLM: the id is `…:N`, and the name what comes before the first `:`, less
    // `functions.`.
    let numbered = id
        .rsplit_once(':')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let name = id.split(':').next().unwrap_or_default();
    let name = name.strip_prefix("functions.").unwrap_or(name);
    if !numbered || name.is_empty() {
        return Err(err(format!(
            "the call's id {id:?} does not name a tool as functions.NAME:N"
        )));
    }
    let arguments = if raw.trim().is_empty() {
        serde_json::json!({})
    } else {
        object_arguments(raw).map_err(err)?
    };
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
        raw_arguments: Some(raw.to_string()),
        id: Some(id.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn section(calls: &[(&str, &str)]) -> String {
        let mut s = MARKS.begin.to_string();
        for (id, args) in calls {
            s.push_str(&format!(
                "{}{id}{ARGUMENTS}{args}{}",
                MARKS.call_begin, MARKS.call_end
            ));
        }
        s + MARKS.end
    }

    /// Calls as Kimi-K2 writes them: ids kept, names read from them, arguments kept as
    /// written, nothing for none.
    #[test]
    fn calls_as_kimi_writes_them() {
        let text = format!(
            "Let me look.{}",
            section(&[
                ("functions.bash:0", "{\"command\": \"ls\"}"),
                (" functions.read_file:1\n", "{\"path\":\"a.py\"}"),
                ("functions.list:2", ""),
            ])
        );
        let t = parse_kimi_k2(&text, false);
        assert_eq!(t.content, "Let me look.");
        let calls: Vec<ToolCall> = t.calls.into_iter().map(Result::unwrap).collect();
        assert_eq!(calls[0].name, "bash");
        assert_eq!(calls[0].id.as_deref(), Some("functions.bash:0"));
        assert_eq!(calls[0].arguments, json!({"command": "ls"}));
        assert_eq!(calls[1].name, "read_file");
        assert_eq!(calls[1].id.as_deref(), Some("functions.read_file:1"));
        assert_eq!(
            calls[1].raw_arguments.as_deref(),
            Some("{\"path\":\"a.py\"}")
        );
        assert_eq!(calls[2].arguments, json!({}));
    }

    /// Malformed calls are errors shown back; calls in the reasoning do not run.
    #[test]
    fn malformed_calls_and_reasoning() {
        for (id, args) in [
            ("functions.bash", "{}"),
            ("functions.bash:x", "{}"),
            (":0", "{}"),
            ("functions.bash:0", "[1]"),
            ("functions.bash:0", "{\"command\": "),
        ] {
            let t = parse_kimi_k2(&section(&[(id, args)]), false);
            assert!(t.calls[0].is_err(), "{id} {args}: {t:?}");
        }
        let unclosed = format!("{}{}functions.bash:0", MARKS.begin, MARKS.call_begin);
        assert!(parse_kimi_k2(&unclosed, false).calls[0].is_err());
        let thought = format!(
            "<think>{}</think>{}",
            section(&[("functions.rm:0", "{}")]),
            section(&[("functions.ls:1", "{}")])
        );
        let t = parse_kimi_k2(&thought, false);
        assert_eq!(t.calls.len(), 1);
        assert_eq!(t.calls[0].as_ref().unwrap().name, "ls");
    }
}
