//! gpt-oss's turns, in OpenAI's harmony format, as vLLM's harmony parser reads them.
//!
//! The prompt ends with `<|start|>assistant`; the model writes one or more messages,
//! each a header, `<|message|>` and a body, ended by `<|end|>` (and the next one opened
//! with `<|start|>assistant`), or by `<|call|>` or `<|return|>`, its stop tokens:
//!
//! ```text
//! <|channel|>analysis<|message|>Need to list the files.<|end|><|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"command": "ls"}
//! ```
//!
//! The header names the message's channel after `<|channel|>` and may name a recipient
//! (`to=functions.bash`, before the channel or after it) and a content type (`json`,
//! `<|constrain|>json`). As vLLM sorts them: a message to a `functions.` recipient is a
//! call of that function, its body the arguments; one on the `analysis` channel is
//! reasoning; one on `final`, or on `commentary` without a recipient (a preamble), is
//! content; any other (a built-in tool's, `to=python`) is none of these.

use super::{CallError, ParsedTurn, ToolCall, object_arguments};

const START: &str = "<|start|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
/// What ends a message: `<|end|>` within a turn, the stop tokens at its end.
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// One message of a turn: its header's parts and its body.
#[derive(Debug, PartialEq)]
struct Message<'a> {
    channel: &'a str,
    recipient: Option<&'a str>,
    content_type: &'a str,
    body: &'a str,
    /// Where the body is in the turn's text.
    at: (usize, usize),
}

/// Parses a gpt-oss turn: the calls of its messages to `functions.` recipients, the
/// text of its `final` and preamble messages as the content (joined by newlines, as
/// vLLM joins them), and its `analysis` messages as [`ParsedTurn::reasoning`]. A turn
/// that is not in the format at all (no `<|message|>`) is content as it is.
pub fn parse_gpt_oss(text: &str) -> ParsedTurn {
    let mut turn = ParsedTurn::default();
    let messages = messages(text);
    if messages.is_empty() {
        turn.content = text.trim().to_string();
        return turn;
    }
    let mut content = Vec::new();
    let mut reasoning = Vec::new();
    for m in messages {
        match (m.recipient, m.channel) {
            (Some(r), _) if r.starts_with("functions.") => {
                turn.calls.push(call(&r["functions.".len()..], &m));
            }
            (None, "analysis") => reasoning.push(m.body),
            (None, "final" | "commentary") => content.push(m.body),
            _ => {}
        }
    }
    turn.content = content.join("\n");
    turn.reasoning = reasoning.join("\n");
    turn
}

/// Where the `analysis` messages' bodies are in `text`: the reasoning, which no call
/// is taken from.
pub fn harmony_reasoning(text: &str) -> Vec<(usize, usize)> {
    messages(text)
        .into_iter()
        .filter(|m| m.channel == "analysis" && m.recipient.is_none())
        .map(|m| m.at)
        .collect()
}

/// A call of `name` with the message's body as its arguments.
fn call(name: &str, m: &Message) -> Result<ToolCall, CallError> {
    let form =
        "write <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>";
    let err = |message: String| CallError {
        message: format!("{message}; {form}"),
        raw: m.body.to_string(),
    };
    if name.is_empty() {
        return Err(err("the call names no function".into()));
    }
    if !m.content_type.is_empty() && !m.content_type.contains("json") {
        return Err(err(format!(
            "the call's content type is {:?}, not json",
            m.content_type
        )));
    }
    let arguments = object_arguments(m.body.trim()).map_err(err)?;
    // Not kept as written: gpt-oss's template writes the arguments back through
    // `tojson`, which would quote a string.
    Ok(ToolCall {
        name: name.to_string(),
        arguments,
        raw_arguments: None,
        id: None,
    })
}

/// The messages of `text`, in order: the first starts at the text's start (the prompt
/// opened it), each later one after a `<|start|>`. A message whose header has no
/// `<|message|>` is left out.
fn messages(text: &str) -> Vec<Message<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while from <= text.len() {
        let rest = &text[from..];
        let Some(open) = rest.find(MESSAGE) else {
            break;
        };
        let header = &rest[..open];
        let body_start = from + open + MESSAGE.len();
        let after = &text[body_start..];
        let (body_len, next) = match ENDS
            .iter()
            .filter_map(|e| after.find(e).map(|at| (at, at + e.len())))
            .min()
        {
            Some((end, past)) => (end, body_start + past),
            None => (after.len(), text.len() + 1),
        };
        out.push(header_parts(
            header,
            &text[body_start..body_start + body_len],
            (body_start, body_start + body_len),
        ));
        // The next message opens with `<|start|>` and its role.
        from = match text.get(next..).and_then(|t| t.find(START)) {
            Some(at) => next + at + START.len(),
            None => break,
        };
    }
    out
}

/// A message's header read into its channel, recipient and content type.
fn header_parts<'a>(header: &'a str, body: &'a str, at: (usize, usize)) -> Message<'a> {
    let (role_part, channel_part) = match header.find(CHANNEL) {
        Some(i) => (&header[..i], &header[i + CHANNEL.len()..]),
        None => (header, ""),
    };
    let channel_end = channel_part
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(channel_part.len());
    let channel = &channel_part[..channel_end];
    // The recipient may follow the role or the channel; after the channel, any other
    // word is the content type.
    let recipient_of = |word: &'a str| {
        // An older harmony wrote the constraint against the recipient.
        word.strip_prefix("to=")
            .map(|to| to.split(CONSTRAIN).next().unwrap_or_default())
    };
    let mut recipient = role_part.split_whitespace().find_map(recipient_of);
    let mut content_type = "";
    for word in channel_part[channel_end..].split_whitespace() {
        match recipient_of(word) {
            Some(to) => recipient = Some(to),
            None => content_type = word.trim_start_matches(CONSTRAIN),
        }
    }
    let recipient = recipient.filter(|r| !r.is_empty());
    Message {
        channel,
        recipient,
        content_type,
        body,
        at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Reasoning, a preamble and a call, the recipient after the channel or before it;
    /// a final answer.
    #[test]
    fn turns_as_gpt_oss_writes_them() {
        let t = parse_gpt_oss(
            "<|channel|>analysis<|message|>Need ls.<|end|><|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{\"command\": \"ls\"}",
        );
        assert_eq!(t.reasoning, "Need ls.");
        assert_eq!(t.content, "");
        let c = t.calls[0].as_ref().unwrap();
        assert_eq!(
            (c.name.as_str(), &c.arguments),
            ("bash", &json!({"command": "ls"}))
        );
        let t = parse_gpt_oss(
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.read_file<|channel|>commentary json<|message|>{\"path\": \"a.py\"}",
        );
        assert_eq!(t.content, "Checking.");
        assert_eq!(t.calls[0].as_ref().unwrap().name, "read_file");
        let t = parse_gpt_oss(
            "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>All good.",
        );
        assert_eq!(
            (t.reasoning.as_str(), t.content.as_str()),
            ("Done.", "All good.")
        );
        assert!(t.calls.is_empty());
    }

    /// Calls whose arguments are not a JSON object are errors shown back; built-in
    /// tools' messages are none of calls, reasoning and content; text outside the format
    /// is content.
    #[test]
    fn malformed_calls_and_other_recipients() {
        for bad in [
            "<|channel|>commentary to=functions.bash json<|message|>{\"command\": ",
            "<|channel|>commentary to=functions.bash json<|message|>[1]",
            "<|channel|>commentary to=functions.bash code<|message|>ls",
            "<|channel|>commentary to=functions. json<|message|>{}",
        ] {
            let t = parse_gpt_oss(bad);
            assert!(t.calls[0].is_err(), "{bad}: {t:?}");
        }
        let t = parse_gpt_oss("<|channel|>analysis to=python code<|message|>print(1)");
        assert!(t.calls.is_empty() && t.content.is_empty() && t.reasoning.is_empty());
        let t = parse_gpt_oss("Just text.");
        assert_eq!(t.content, "Just text.");
        let spans = harmony_reasoning("<|channel|>analysis<|message|>Hm.<|end|>");
        assert_eq!(spans, vec![(30, 33)]);
    }
}
