//! The tools an agent is offered: their JSON schemas (as chat templates receive them)
//! and how a call's result becomes the observation text the model reads.
//!
//! `bash`, `python` and `file` run in the job's sandbox through its server; `finish` ends
//! the episode with an answer and runs nothing. The schemas describe the sandbox
//! protocol's argument types (`crate::sandbox::protocol`), so a call the model writes
//! is passed to the sandbox as it is, and the server's own argument errors reach the
//! model as observations it can act on.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::sandbox::SandboxError;
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::{BashResult, FileResult, PythonResult, Response};

/// The tools this build offers, in the order they are listed to the model.
pub const TOOL_NAMES: [&str; 4] = ["bash", "python", "file", "finish"];

/// The name of the tool that ends an episode.
pub const FINISH: &str = "finish";

/// The schemas of every tool this build offers, in [`TOOL_NAMES`] order.
pub fn schemas() -> Vec<Value> {
    TOOL_NAMES.iter().filter_map(|t| schema(t)).collect()
}

/// The schema of tool `name` in the OpenAI function format transformers passes to chat
/// templates, or `None` for a tool this build does not have.
pub fn schema(name: &str) -> Option<Value> {
    let (description, parameters) = match name {
        "bash" => (
            "Run a command in a persistent bash shell inside the sandbox. State (working directory, variables, background jobs) carries over between calls. Output is truncated in the middle when long.",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command to run, as typed at a prompt."}
                },
                "required": ["command"]
            }),
        ),
        "python" => (
            "Run Python code in a persistent interpreter inside the sandbox, like a notebook cell: variables carry over and the value of a final expression is shown.",
            json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The code to run."}
                },
                "required": ["code"]
            }),
        ),
        "file" => (
            "View, create and edit files in the workspace. `view` shows a file with line numbers (or lists a directory); `create` writes a whole file; `str_replace` replaces the one occurrence of `old_str` with `new_str`; `insert` adds `new_str` after line `insert_line`; `undo_edit` reverts the last edit of a file.",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                    "path": {"type": "string", "description": "File or directory, relative to the workspace."},
                    "file_text": {"type": "string", "description": "For `create`: the file's content."},
                    "old_str": {"type": "string", "description": "For `str_replace`: text occurring exactly once."},
                    "new_str": {"type": "string", "description": "For `str_replace` and `insert`: the new text."},
                    "insert_line": {"type": "integer", "description": "For `insert`: the line after which to insert (0 for the top)."},
                    "view_range": {"type": "array", "items": {"type": "integer"}, "description": "For `view`: [first, last] line, 1-based; -1 for the end."}
                },
                "required": ["command", "path"]
            }),
        ),
        "finish" => (
            "End the task. Call it once the work is done, with the final answer if the task asks for one.",
            json!({
                "type": "object",
                "properties": {
                    "answer": {"type": "string", "description": "The final answer, if any."}
                },
                "required": []
            }),
        ),
        _ => return None,
    };
    Some(json!({
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters}
    }))
}

/// Where tool calls run: the job's sandbox, or a stand-in in unit tests.
#[async_trait]
pub trait ToolRunner: Send + Sync {
    /// Runs `tool` with `args`. `Err` means the sandbox itself failed (gone, or not
    /// answering); a tool that ran and refused is an `Ok` response with an error.
    async fn call(
        &self,
        tool: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Response, SandboxError>;
}

#[async_trait]
impl ToolRunner for SandboxClient {
    async fn call(
        &self,
        tool: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Response, SandboxError> {
        SandboxClient::call(self, tool, args, Some(timeout)).await
    }
}

/// The observation text of a sandbox response, capped at `max_bytes` (head and tail
/// kept), and whether the call succeeded.
pub fn observation(tool: &str, resp: &Response, max_bytes: usize) -> (String, bool) {
    let (text, ok) = match (&resp.result, &resp.error) {
        (Some(result), _) if resp.ok => (describe(tool, result), true),
        (_, Some(e)) => (format!("Error: {}", e.message), false),
        _ => ("Error: the tool gave no result".to_string(), false),
    };
    (cap(&text, max_bytes), ok)
}

fn describe(tool: &str, result: &Value) -> String {
    let mut out = String::new();
    match tool {
        "bash" => match serde_json::from_value::<BashResult>(result.clone()) {
            Ok(r) => {
                out.push_str(&r.output);
                if r.exit_code != Some(0) {
                    push_line(
                        &mut out,
                        &match r.exit_code {
                            Some(c) => format!("[exit code {c}]"),
                            None => "[no exit code: the shell was replaced]".to_string(),
                        },
                    );
                }
                if let Some(note) = r.note {
                    push_line(&mut out, &format!("[{note}]"));
                }
            }
            Err(_) => out = result.to_string(),
        },
        "python" => match serde_json::from_value::<PythonResult>(result.clone()) {
            Ok(r) => {
                out.push_str(&r.output);
                if let Some(v) = r.value {
                    push_line(&mut out, &v);
                }
                if let Some(e) = r.error {
                    push_line(&mut out, &e);
                }
                if let Some(note) = r.note {
                    push_line(&mut out, &format!("[{note}]"));
                }
            }
            Err(_) => out = result.to_string(),
        },
        "file" => match serde_json::from_value::<FileResult>(result.clone()) {
            Ok(r) => out = r.output,
            Err(_) => out = result.to_string(),
        },
        _ => out = result.to_string(),
    }
    if out.trim().is_empty() {
        out = "(no output)".to_string();
    }
    out
}

fn push_line(out: &mut String, line: &str) {
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
}

/// Keeps the head and the tail of `text` within `max` bytes, saying how much was cut.
pub fn cap(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let half = max / 2;
    let mut head = half;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - half;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::protocol::ErrorCode;

    #[test]
    fn every_tool_has_a_schema_in_the_openai_shape() {
        for name in TOOL_NAMES {
            let s = schema(name).unwrap();
            assert_eq!(s["function"]["name"], name);
            assert_eq!(s["function"]["parameters"]["type"], "object");
        }
        assert!(schema("rm").is_none());
    }

    #[test]
    fn observations_say_what_happened() {
        let bash = Response::ok(
            1,
            json!({"output": "boom", "exit_code": 2, "omitted_bytes": 0, "timed_out": false,
                   "shell_restarted": false, "elapsed_us": 5}),
        );
        assert_eq!(
            observation("bash", &bash, 1000),
            ("boom\n[exit code 2]".to_string(), true)
        );
        let py = Response::ok(
            2,
            json!({"output": "", "value": "3", "omitted_bytes": 0, "timed_out": false,
                   "restarted": false, "engine": "cpython", "elapsed_us": 5}),
        );
        assert_eq!(observation("python", &py, 1000).0, "3");
        let err = Response::err(3, ErrorCode::ToolFailed, "old_str not found");
        assert_eq!(
            observation("file", &err, 1000),
            ("Error: old_str not found".to_string(), false)
        );
    }

    #[test]
    fn caps_keep_head_and_tail() {
        let s = "a".repeat(50) + &"b".repeat(50);
        let c = cap(&s, 20);
        assert!(
            c.starts_with("aaaaaaaaaa\n[… 80 bytes omitted …]\nbbbbbbbbbb"),
            "{c}"
        );
        assert_eq!(cap("short", 20), "short");
    }
}
