//! The sandbox wire protocol: length-prefixed JSON frames over one Unix socket.
//!
//! Each frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON
//! (`docs/sandbox-protocol.md` is the reference for people writing other clients). A
//! request names a tool and carries its own `id`, so several requests can be in flight on
//! one connection and their responses come back in completion order, not request order.
//! Every frame carries the protocol version `v`; a server answers a request of another
//! version with an `unsupported_version` error rather than guessing.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use tokio_util::codec::LengthDelimitedCodec;

/// The protocol version this build speaks. Bump it on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;

/// The largest frame either side accepts (16 MiB): a tool's output is capped far below
/// this, so a larger frame means a confused peer.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// The frame codec both sides use: a 4-byte big-endian length prefix, then the JSON body.
pub fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// One tool call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Request {
    /// Protocol version; must equal [`PROTOCOL_VERSION`].
    pub v: u32,
    /// Chosen by the client, echoed in the response; unique among its in-flight requests.
    pub id: u64,
    /// Which tool: `bash`, `python`, `exec`, `file`, `export`, `baseline`, `apply`,
    /// `endpoint_open`, `endpoint_next`, `endpoint_reply` or `ping`.
    pub tool: String,
    /// How long the tool may run, in milliseconds; each tool has a default. Escalation
    /// after a timeout (interrupt, kill, restart) adds a bounded grace on top.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The tool's arguments (see the `*Args` types).
    #[serde(default)]
    pub args: Value,
}

/// The answer to one [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Response {
    /// Protocol version of the server.
    pub v: u32,
    /// The request's id.
    pub id: u64,
    /// Whether the tool ran. A command that exits non-zero still ran: `ok` is about the
    /// call, the exit code is in the result.
    pub ok: bool,
    /// The tool's result when `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// What went wrong when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
}

impl Response {
    /// A successful response carrying `result`.
    pub fn ok(id: u64, result: Value) -> Self {
        Response {
            v: PROTOCOL_VERSION,
            id,
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A failed response.
    pub fn err(id: u64, code: ErrorCode, message: impl Into<String>) -> Self {
        Response {
            v: PROTOCOL_VERSION,
            id,
            ok: false,
            result: None,
            error: Some(ToolError {
                code,
                message: message.into(),
            }),
        }
    }
}

/// Why a call did not produce a result. The message is written for the agent (and the
/// person debugging it): it says what was wrong and, where it can, what to do instead.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolError {
    /// Machine-readable class of the failure.
    pub code: ErrorCode,
    /// Human- (and model-) readable explanation.
    pub message: String,
}

/// Classes of tool failure.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame was not a valid request, or an argument is missing or malformed.
    BadRequest,
    /// The request's `v` is not one this server speaks.
    UnsupportedVersion,
    /// No tool of that name.
    UnknownTool,
    /// The tool ran and refused, e.g. `str_replace` found no match or several.
    ToolFailed,
    /// The answer would exceed the frame limit (or the call's own cap, e.g. an export
    /// larger than `max_bytes`); nothing was truncated silently.
    TooLarge,
    /// The sandbox server itself failed (could not start bash, I/O error).
    Internal,
}

/// Arguments of the `bash` tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The command text, run by the persistent shell as if typed at its prompt (several
    /// lines, functions and here-documents are fine).
    pub command: String,
    /// Output cap in bytes; the head and the tail are kept, the middle is dropped and
    /// counted. Defaults to 32 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
}

/// What happened when a call ran past its timeout, in the order the server tries.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Escalation {
    /// SIGINT to the foreground process group (or the interpreter) was enough.
    Interrupted,
    /// The foreground process group ignored SIGINT and was killed with SIGKILL.
    Killed,
    /// Nothing else helped: the shell or interpreter was replaced by a fresh one, so its
    /// state (variables, working directory, background jobs) is gone.
    Restarted,
}

/// Result of the `bash` tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BashResult {
    /// stdout and stderr as the terminal showed them, capped, lossily decoded as UTF-8.
    pub output: String,
    /// The command's exit status (`$?`); absent when the shell had to be replaced.
    pub exit_code: Option<i32>,
    /// Bytes dropped from the middle of the output by the cap.
    pub omitted_bytes: u64,
    /// Whether the command hit its timeout.
    pub timed_out: bool,
    /// How far the server had to go after a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
    /// Whether this call ended with a new shell (after `exit`, a crash, or escalation).
    pub shell_restarted: bool,
    /// A sentence for the agent when something unusual happened (timeout, new shell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Time the command took inside the server, in microseconds.
    pub elapsed_us: u64,
}

/// Arguments of the `exec` tool: one command as a process of its own, outside the
/// persistent shell.
///
/// Why it exists: the persistent shell reports a command's status through a marker in
/// its terminal output, which any process that learns the marker's token could print.
/// `exec` takes the status from the kernel (`waitpid`), so nothing the command prints can
/// change it. EVAL runs its check this way.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The command, run by `bash -c` in the workspace with standard input closed.
    pub command: String,
    /// Output cap in bytes (head and tail kept); defaults to 32 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
    /// Start from the persistent shell's exported variables and working directory (so a
    /// setup command's `source venv/bin/activate` or `cd` carries over), instead of the
    /// sandbox's initial environment and the workspace.
    #[serde(default)]
    pub shell_state: bool,
    /// Keep only printable text: ANSI escape sequences and other control characters
    /// (all but newline and tab) are dropped. A grader reading a test log asks for this:
    /// such characters carry nothing a log parser reads, and each would take six bytes
    /// as JSON, so a log of them could not come back within a frame.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub printable: bool,
    /// Variables set for the command on top of its environment (an agent program's
    /// `OPENAI_BASE_URL`, say).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Arguments of `endpoint_open`: opens the sandbox's model endpoint (an HTTP listener
/// on the sandbox's loopback whose requests the host answers; see
/// `endpoint_next` and `endpoint_reply`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointOpenArgs {
    /// The key every request must carry (`Authorization: Bearer <key>`); at least 16
    /// characters. Requests without it are answered 401 by the server itself.
    pub key: String,
    /// The largest request body taken (413 above it); 8 MiB when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
}

/// Result of `endpoint_open`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndpointOpenResult {
    /// The port on `127.0.0.1` inside the sandbox.
    pub port: u16,
}

/// One HTTP request an agent made to the model endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndpointCall {
    /// Names the request in `endpoint_reply`.
    pub id: u64,
    /// The HTTP method.
    pub method: String,
    /// The path and query (`/v1/chat/completions`).
    pub path: String,
    /// The body, as sent.
    pub body: String,
}

/// Result of `endpoint_next`: the next request, or none when the call's timeout ran
/// out first (not an error: the host asks again).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndpointNext {
    /// The request.
    pub call: Option<EndpointCall>,
}

/// Arguments of `endpoint_reply`: the answer to one request taken with
/// `endpoint_next`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EndpointReplyArgs {
    /// The request's id.
    pub id: u64,
    /// The HTTP status.
    pub status: u16,
    /// The `content-type`; `application/json` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The body.
    pub body: String,
}

/// Result of `endpoint_reply`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndpointReplyResult {
    /// False when no such request was waiting (answered already, or the agent hung up).
    pub delivered: bool,
}

/// Result of the `exec` tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecResult {
    /// stdout and stderr, interleaved as written, capped, lossily decoded as UTF-8.
    pub output: String,
    /// The exit status the kernel reported; absent when the process was killed by a
    /// signal or did not end.
    pub exit_code: Option<i32>,
    /// The signal that ended the process, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Bytes dropped from the middle of the output by the cap.
    pub omitted_bytes: u64,
    /// Whether the command hit its timeout (its process group was then killed).
    pub timed_out: bool,
    /// Time the command took inside the server, in microseconds.
    pub elapsed_us: u64,
}

/// Arguments of the `python` tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PythonArgs {
    /// Source to run in the persistent interpreter, like a notebook cell: if the last
    /// statement is an expression its value's `repr` is returned.
    pub code: String,
    /// Output cap in bytes (head and tail kept); defaults to 32 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
}

/// Result of the `python` tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PythonResult {
    /// Everything the cell printed to stdout and stderr (including its subprocesses').
    pub output: String,
    /// `repr` of the final expression's value, when there was one and it was not `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The formatted traceback when the cell raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes dropped from the middle of the output by the cap.
    pub omitted_bytes: u64,
    /// Whether the cell hit its timeout.
    pub timed_out: bool,
    /// How far the server had to go after a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
    /// Whether the interpreter was (re)started during this call, losing its variables.
    pub restarted: bool,
    /// A sentence for the agent when something unusual happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// `ipython` or `cpython`: which engine ran the cell.
    pub engine: String,
    /// Time the cell took inside the server, in microseconds.
    pub elapsed_us: u64,
}

/// Arguments of the `file` tool, modelled on the `str_replace_editor` tool agents are
/// trained with (SWE-agent, OpenHands), so prompts written for it carry over.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileArgs {
    /// Show a file with line numbers (optionally only `view_range` = `[first, last]`,
    /// 1-based, `last` = -1 for the end), or list a directory two levels deep.
    View {
        /// File or directory, absolute or relative to the workspace.
        path: String,
        /// Inclusive 1-based line range.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        view_range: Option<[i64; 2]>,
    },
    /// Create (or overwrite) a file, creating parent directories.
    Create {
        /// The file to write.
        path: String,
        /// Its whole new content.
        file_text: String,
    },
    /// Replace the one occurrence of `old_str` with `new_str`.
    StrReplace {
        /// The file to edit.
        path: String,
        /// Text that must occur exactly once in the file.
        old_str: String,
        /// Its replacement (empty deletes it).
        #[serde(default)]
        new_str: String,
    },
    /// Insert `new_str` after line `insert_line` (0 = at the top).
    Insert {
        /// The file to edit.
        path: String,
        /// Line after which to insert, 0-based count of lines kept above.
        insert_line: usize,
        /// The text to insert.
        new_str: String,
    },
    /// Restore the file's content from before its last edit by this tool.
    UndoEdit {
        /// The file whose last edit to revert.
        path: String,
    },
}

/// Result of the `file` tool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileResult {
    /// What the agent sees: the listing, the numbered lines, or a confirmation with a
    /// snippet around the edit.
    pub output: String,
}

/// Arguments of the `export` tool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportArgs {
    /// Commit (or tree) to diff against; defaults to the baseline: the state recorded by
    /// the last `baseline` call, else the `HEAD` the server saw when it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The largest export in bytes (diff text, or file contents in all); a larger one is
    /// an error rather than a silently truncated export. Defaults to
    /// [`DEFAULT_MAX_EXPORT_BYTES`], and never exceeds [`MAX_EXPORT_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<usize>,
}

/// The default cap of an export.
pub const DEFAULT_MAX_EXPORT_BYTES: usize = 4 << 20;
/// The largest export any call may ask for: it must fit in one frame once encoded as
/// JSON (text escapes and base64 grow it).
pub const MAX_EXPORT_BYTES: usize = 8 << 20;

/// Result of the `baseline` tool: the workspace state later exports are relative to.
///
/// Called once the task's setup commands have run, so what setup generated (a virtual
/// environment, build output, an `.egg-info`) is not counted as the agent's change, and
/// a fresh EVAL sandbox that ran the same setup accepts the export.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BaselineResult {
    /// For a git workspace, the tree object of the working tree (untracked, not ignored
    /// files included); absent for a plain directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// How many files a plain directory's snapshot holds; absent for git.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<usize>,
}

/// Arguments of the `apply` tool: EVAL's way of putting the agent's changes into a fresh
/// sandbox, inside it, as its own user, and then putting the task's protected files back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApplyArgs {
    /// What RUN's `export` returned.
    pub changes: ExportResult,
    /// Workspace paths (globs: `*` within a path segment, `**` across segments, `?`)
    /// whose content the changes may not alter: after applying, every changed path that
    /// matches, or that replaced a directory holding a matching file, is restored from
    /// the baseline (or removed, when the baseline did not have it).
    #[serde(default)]
    pub protect: Vec<String>,
    /// Files written after applying, with exactly this content (the check's own files,
    /// hidden tests say): relative path → UTF-8 text. Whatever the changes put at such a
    /// path, or in the way of it (a symlink for a directory), is replaced.
    #[serde(default)]
    pub files: std::collections::BTreeMap<String, String>,
}

/// Result of the `apply` tool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ApplyResult {
    /// Paths the changes touched (relative to the workspace), sorted.
    pub changed: Vec<String>,
    /// Of those, the protected ones that were put back as they were.
    pub restored: Vec<String>,
    /// Compiled Python bytecode files and `__pycache__` directories removed from the
    /// workspace afterwards (bytecode is never trusted in EVAL).
    #[serde(default)]
    pub removed_bytecode: usize,
}

/// The workspace's changes since the sandbox started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExportResult {
    /// The workspace is a git repository: a binary-safe `git diff` against `base`,
    /// including new untracked files (those not ignored).
    GitDiff {
        /// The commit the diff is against.
        base: String,
        /// `git diff --binary` output; apply with `git apply`.
        diff: String,
    },
    /// Not a repository: every file added, modified or deleted since start.
    Files {
        /// The changed files, sorted by path.
        files: Vec<ChangedFile>,
    },
}

/// One changed file in a [`ExportResult::Files`] export.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChangedFile {
    /// Path relative to the workspace.
    pub path: String,
    /// `added`, `modified` or `deleted`.
    pub status: String,
    /// Content as UTF-8 text, when it is text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Content in standard base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// Result of `ping`: whether the tools are up.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PingResult {
    /// Protocol version.
    pub v: u32,
    /// The server's process id (inside the sandbox's PID namespace).
    pub pid: u32,
    /// The workspace directory, as the sandbox sees it.
    pub workdir: String,
    /// Whether the persistent shell answered its start-up handshake.
    pub bash_ready: bool,
    /// `ipython`, `cpython`, or absent when no interpreter has started yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_engine: Option<String>,
    /// Milliseconds since the server started.
    pub uptime_ms: u64,
    /// When the server reached each step of its own start, for the launcher's start
    /// profile (see [`crate::profile`]); absent from older servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<ServerStartup>,
}

/// The sandbox server's start, as marks on `CLOCK_MONOTONIC` in nanoseconds (the host's
/// clock too: bwrap does not give sandboxes a time namespace); 0 for a step not taken.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServerStartup {
    /// The server's `main` began (the exec and the dynamic loader before it).
    pub main_ns: u64,
    /// The persistent shell answered its handshake.
    pub shell_ns: u64,
    /// The workspace's baseline was recorded.
    pub baseline_ns: u64,
    /// The server took its first connection off the listening socket.
    pub serving_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_args_use_the_editor_tool_names() {
        let a: FileArgs = serde_json::from_value(serde_json::json!({
            "command": "str_replace", "path": "a.py", "old_str": "x", "new_str": "y"
        }))
        .unwrap();
        assert_eq!(
            a,
            FileArgs::StrReplace {
                path: "a.py".into(),
                old_str: "x".into(),
                new_str: "y".into()
            }
        );
        let err = serde_json::from_value::<FileArgs>(serde_json::json!({
            "command": "view", "path": "a", "bogus": 1
        }))
        .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn responses_round_trip() {
        let r = Response::err(7, ErrorCode::ToolFailed, "no match");
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"v":1,"id":7,"ok":false,"error":{"code":"tool_failed","message":"no match"}}"#
        );
        assert_eq!(serde_json::from_str::<Response>(&text).unwrap(), r);
    }
}
