//! Every tool behaviour, on every backend that runs here.

use crate::helpers::{TestSandbox, start};
use crate::on_backends;
use rollout_sandbox::RuntimeKind;
use rollout_sandbox::protocol::{ErrorCode, Escalation, ExportArgs, ExportResult, FileArgs};
use std::time::Duration;

const SHORT: Option<Duration> = Some(Duration::from_millis(400));

on_backends!(
    bash_keeps_state_between_calls,
    bash_timeout_interrupts_the_foreground_job,
    bash_timeout_kills_what_ignores_sigint,
    bash_timeout_replaces_a_wedged_shell,
    bash_exit_starts_a_new_shell,
    bash_output_is_capped_head_and_tail,
    bash_binary_output_keeps_the_protocol_intact,
    bash_programs_waiting_for_input_do_not_hang,
    python_keeps_state_and_returns_values,
    python_exceptions_come_back_as_tracebacks,
    python_timeout_interrupts_the_cell,
    python_uninterruptible_cell_restarts_the_interpreter,
    python_crash_restarts_the_interpreter,
    file_edits_and_undo_through_the_socket,
    requests_run_concurrently,
    export_git_diff_against_the_start,
    export_changed_files_of_a_plain_workspace,
    bash_exit_with_a_background_job_holding_the_terminal,
    bash_prompt_changes_do_not_leak_into_output,
    bash_background_jobs_keep_running_between_calls,
    model_endpoint_relays_requests_to_the_host,
);

async fn bash(t: &TestSandbox, cmd: &str) -> rollout_sandbox::protocol::BashResult {
    t.sb.client.bash(cmd, None).await.expect("bash call")
}

async fn bash_keeps_state_between_calls(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let r = bash(
        &t,
        "mkdir -p sub && cd sub && export GREETING=hello && f() { echo \"f:$1\"; }",
    )
    .await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let r = bash(&t, "pwd; echo $GREETING; f x; sleep 30 & echo started").await;
    assert!(
        r.output.contains("/workspace/sub\n") || r.output.contains("/workspace/sub\n"),
        "{r:?}"
    );
    assert!(r.output.contains("hello\nf:x\n"), "{r:?}");
    let r = bash(&t, "jobs | wc -l; false").await;
    assert_eq!(
        r.output.trim(),
        "1",
        "the background job is still there: {r:?}"
    );
    assert_eq!(r.exit_code, Some(1));
    let r = bash(
        &t,
        "cat <<'EOF'\nline 'one'\n  \"two\"\nEOF\nexit_code_is() { return $1; }; exit_code_is 7",
    )
    .await;
    assert_eq!(r.output, "line 'one'\n  \"two\"\n");
    assert_eq!(r.exit_code, Some(7));
    t.stop().await;
}

async fn bash_timeout_interrupts_the_foreground_job(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    bash(&t, "KEEP=kept").await;
    let r =
        t.sb.client
            .bash("echo before; sleep 100000", SHORT)
            .await
            .unwrap();
    assert!(r.timed_out);
    assert_eq!(r.escalation, Some(Escalation::Interrupted), "{r:?}");
    assert_eq!(r.exit_code, Some(130));
    assert!(r.output.contains("before"), "{r:?}");
    assert!(
        r.note.as_deref().unwrap_or("").contains("interrupted"),
        "{r:?}"
    );
    assert!(!r.shell_restarted);
    let r = bash(&t, "echo $KEEP").await;
    assert_eq!(r.output, "kept\n", "the shell survived: {r:?}");
    t.stop().await;
}

async fn bash_timeout_kills_what_ignores_sigint(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    bash(&t, "KEEP=kept").await;
    let r =
        t.sb.client
            .bash("bash -c 'trap \"\" INT; sleep 100000'", SHORT)
            .await
            .unwrap();
    assert!(r.timed_out);
    assert_eq!(r.escalation, Some(Escalation::Killed), "{r:?}");
    assert!(!r.shell_restarted);
    assert_eq!(bash(&t, "echo $KEEP").await.output, "kept\n");
    t.stop().await;
}

async fn bash_timeout_replaces_a_wedged_shell(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    bash(&t, "KEEP=kept").await;
    // A builtin loop in the shell itself, with SIGINT ignored by the shell: only a new
    // shell helps.
    let r =
        t.sb.client
            .bash("trap '' INT; while :; do :; done", SHORT)
            .await
            .unwrap();
    assert!(r.timed_out);
    assert_eq!(r.escalation, Some(Escalation::Restarted), "{r:?}");
    assert!(r.shell_restarted);
    assert_eq!(r.exit_code, None);
    assert!(
        r.note.as_deref().unwrap_or("").contains("replaced"),
        "{r:?}"
    );
    let r = bash(&t, "echo \"[$KEEP]\"; pwd").await;
    assert!(r.output.starts_with("[]\n"), "state was reset: {r:?}");
    assert!(r.output.trim_end().ends_with("workspace"), "{r:?}");
    t.stop().await;
}

async fn bash_exit_starts_a_new_shell(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let r = bash(&t, "echo bye; exit 3").await;
    assert!(r.shell_restarted, "{r:?}");
    assert_eq!(r.exit_code, Some(3));
    assert!(r.output.contains("bye"));
    assert!(
        r.note
            .as_deref()
            .unwrap_or("")
            .contains("exited with status 3"),
        "{r:?}"
    );
    assert_eq!(bash(&t, "echo again").await.output, "again\n");
    t.stop().await;
}

async fn bash_output_is_capped_head_and_tail(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let args = serde_json::json!({
        "command": "echo START; head -c 2000000 /dev/zero | tr '\\0' x; echo; echo END",
        "max_output_bytes": 1000,
    });
    let resp = t.sb.client.call("bash", args, None).await.unwrap();
    let r: rollout_sandbox::protocol::BashResult =
        serde_json::from_value(resp.result.unwrap()).unwrap();
    assert_eq!(r.exit_code, Some(0));
    let total = 6 + 2_000_000 + 1 + 4;
    assert_eq!(r.omitted_bytes, total - 1000);
    assert!(r.output.starts_with("START\nxxx"), "{}", &r.output[..40]);
    assert!(r.output.ends_with("xxx\nEND\n"));
    assert!(r.output.contains(&format!(
        "[... {} bytes of output omitted ...]",
        total - 1000
    )));
    assert!(r.output.len() < 1100);
    t.stop().await;
}

async fn bash_binary_output_keeps_the_protocol_intact(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let r = bash(
        &t,
        "printf 'a\\xff\\xfe\\x00b\\x1ec\\n'; head -c 3000 /dev/urandom; echo; echo tail",
    )
    .await;
    assert_eq!(r.exit_code, Some(0));
    assert!(
        r.output.starts_with("a\u{fffd}\u{fffd}\u{0}b\u{1e}c\n"),
        "{:?}",
        &r.output[..12]
    );
    assert!(r.output.ends_with("tail\n"));
    assert_eq!(bash(&t, "echo fine").await.output, "fine\n");
    t.stop().await;
}

async fn bash_programs_waiting_for_input_do_not_hang(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    for cmd in [
        "read -r line; echo got $line",
        "cat",
        "python3 -c 'input()'",
    ] {
        let r = t.sb.client.bash(cmd, SHORT).await.unwrap();
        assert!(r.timed_out, "{cmd}: {r:?}");
        assert!(
            matches!(
                r.escalation,
                Some(Escalation::Interrupted | Escalation::Killed)
            ),
            "{cmd}: {r:?}"
        );
        assert!(!r.output.contains("got"), "{cmd}: {r:?}");
    }
    assert_eq!(bash(&t, "echo responsive").await.output, "responsive\n");
    t.stop().await;
}

async fn python_keeps_state_and_returns_values(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let r =
        t.sb.client
            .python("import os\nx = 20\nprint('hi')\nx + 1", None)
            .await
            .unwrap();
    assert_eq!(r.output, "hi\n");
    assert_eq!(r.value.as_deref(), Some("21"));
    assert!(["ipython", "cpython"].contains(&r.engine.as_str()));
    let r = t.sb.client.python("x * 2", None).await.unwrap();
    assert_eq!(r.value.as_deref(), Some("40"));
    let r = t.sb.client.python("y = x", None).await.unwrap();
    assert_eq!(r.value, None);
    let r = t
        .sb
        .client
        .python("import sys, subprocess\nsys.stderr.write('err\\n')\nsubprocess.run(['echo', 'child'])\nos.getcwd()", None)
        .await
        .unwrap();
    assert!(
        r.output.contains("err\n") && r.output.contains("child\n"),
        "{r:?}"
    );
    assert!(r.value.unwrap().ends_with("workspace'"));
    t.stop().await;
}

async fn python_exceptions_come_back_as_tracebacks(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let r =
        t.sb.client
            .python("def f():\n    return 1/0\nf()", None)
            .await
            .unwrap();
    let err = r.error.expect("an error");
    assert!(err.contains("ZeroDivisionError"), "{err}");
    assert!(
        err.contains("1/0"),
        "the traceback shows the cell's line: {err}"
    );
    let r =
        t.sb.client
            .python("def broken(:\n  pass", None)
            .await
            .unwrap();
    assert!(r.error.unwrap().contains("SyntaxError"));
    let r = t.sb.client.python("input('name? ')", None).await.unwrap();
    assert!(r.error.unwrap().contains("EOFError"), "input() fails fast");
    let r =
        t.sb.client
            .python("raise SystemExit(2)", None)
            .await
            .unwrap();
    assert!(r.error.is_some() && !r.restarted, "{r:?}");
    assert_eq!(
        t.sb.client
            .python("1 + 1", None)
            .await
            .unwrap()
            .value
            .as_deref(),
        Some("2")
    );
    t.stop().await;
}

async fn python_timeout_interrupts_the_cell(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    t.sb.client.python("keep = 'kept'", None).await.unwrap();
    let r =
        t.sb.client
            .python("import time\ntime.sleep(100000)", SHORT)
            .await
            .unwrap();
    assert!(r.timed_out);
    assert_eq!(r.escalation, Some(Escalation::Interrupted), "{r:?}");
    assert!(r.error.unwrap_or_default().contains("KeyboardInterrupt"));
    assert!(!r.restarted);
    let r = t.sb.client.python("keep", None).await.unwrap();
    assert_eq!(r.value.as_deref(), Some("'kept'"));
    t.stop().await;
}

async fn python_uninterruptible_cell_restarts_the_interpreter(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    t.sb.client.python("keep = 1", None).await.unwrap();
    let r = t
        .sb
        .client
        .python(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(100000)",
            SHORT,
        )
        .await
        .unwrap();
    assert!(r.timed_out && r.restarted, "{r:?}");
    assert_eq!(r.escalation, Some(Escalation::Restarted));
    assert!(r.note.unwrap().contains("restarted"));
    let r =
        t.sb.client
            .python("'keep' in globals()", None)
            .await
            .unwrap();
    assert_eq!(r.value.as_deref(), Some("False"));
    t.stop().await;
}

async fn python_crash_restarts_the_interpreter(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    t.sb.client.python("keep = 1", None).await.unwrap();
    let r =
        t.sb.client
            .python("import os\nprint('bye', flush=True)\nos._exit(3)", None)
            .await
            .unwrap();
    assert!(r.restarted, "{r:?}");
    assert!(r.output.contains("bye"));
    assert!(
        r.note.as_deref().unwrap().contains("exited with status 3"),
        "{r:?}"
    );
    let r =
        t.sb.client
            .python("'keep' in globals()", None)
            .await
            .unwrap();
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(!r.restarted);
    t.stop().await;
}

async fn file_edits_and_undo_through_the_socket(kind: RuntimeKind) {
    let t = start(
        kind,
        &[(
            "pkg/mod.py",
            "def f():\n    return 1\n\ndef g():\n    return 1\n",
        )],
    )
    .await;
    let c = &t.sb.client;
    let twice = c
        .file(&FileArgs::StrReplace {
            path: "pkg/mod.py".into(),
            old_str: "return 1".into(),
            new_str: "return 2".into(),
        })
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(twice.code, ErrorCode::ToolFailed);
    assert!(
        twice.message.contains("appears 2 times") && twice.message.contains("lines 2, 5"),
        "{twice:?}"
    );
    c.file(&FileArgs::StrReplace {
        path: "pkg/mod.py".into(),
        old_str: "def g():\n    return 1".into(),
        new_str: "def g():\n    return 2".into(),
    })
    .await
    .unwrap()
    .unwrap();
    c.file(&FileArgs::Insert {
        path: "pkg/mod.py".into(),
        insert_line: 0,
        new_str: "import os".into(),
    })
    .await
    .unwrap()
    .unwrap();
    let host = t.workspace().join("pkg/mod.py");
    assert_eq!(
        std::fs::read_to_string(&host).unwrap(),
        "import os\ndef f():\n    return 1\n\ndef g():\n    return 2\n"
    );
    c.file(&FileArgs::UndoEdit {
        path: "pkg/mod.py".into(),
    })
    .await
    .unwrap()
    .unwrap();
    let view = c
        .file(&FileArgs::View {
            path: "pkg/mod.py".into(),
            view_range: Some([4, 5]),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(
        view.output
            .contains("     4\tdef g():\n     5\t    return 2\n"),
        "{view:?}"
    );
    let bad = c
        .call("file", serde_json::json!({"command": "view"}), None)
        .await
        .unwrap();
    assert_eq!(bad.error.unwrap().code, ErrorCode::BadRequest);
    t.stop().await;
}

async fn requests_run_concurrently(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    let c = &t.sb.client;
    // The bash call cannot finish until the other calls have run: it waits for a file
    // that only the last of them creates.
    let waiting = c.bash(
        "while [ ! -e go ]; do sleep 0.01; done; echo released",
        Some(Duration::from_secs(60)),
    );
    let others = async {
        let p = c.ping().await.unwrap();
        assert!(p.bash_ready);
        let py = c.python("6 * 7", None).await.unwrap();
        assert_eq!(py.value.as_deref(), Some("42"));
        c.file(&FileArgs::Create {
            path: "go".into(),
            file_text: String::new(),
        })
        .await
        .unwrap()
        .unwrap();
    };
    let (r, ()) = tokio::join!(waiting, others);
    let r = r.unwrap();
    assert_eq!(r.output, "released\n");
    assert!(!r.timed_out);
    t.stop().await;
}

async fn export_git_diff_against_the_start(kind: RuntimeKind) {
    // The repository is made on the host before the sandbox starts, as INIT does.
    let (root, req) = crate::helpers::request(kind, &[("a.txt", "one\n"), ("b.bin", "x")]);
    let ws = req.workspace();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(&ws)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "start"]);
    let t = crate::helpers::start_with(root, req).await;
    bash(
        &t,
        "echo two >> a.txt && echo new > c.txt && printf '\\x00\\x01' > b.bin && git add a.txt",
    )
    .await;
    let ExportResult::GitDiff { diff, .. } =
        t.sb.client
            .export(&ExportArgs::default())
            .await
            .unwrap()
            .unwrap()
    else {
        panic!("a repository exports a diff")
    };
    assert!(diff.contains("+two"), "{diff}");
    assert!(diff.contains("c.txt") && diff.contains("+new"), "{diff}");
    assert!(
        diff.contains("GIT binary patch") || diff.contains("Binary files"),
        "{diff}"
    );
    // The agent's own index is untouched: only a.txt is staged.
    let staged = bash(&t, "git diff --cached --name-only").await;
    assert_eq!(staged.output, "a.txt\n");
    t.stop().await;
}

async fn export_changed_files_of_a_plain_workspace(kind: RuntimeKind) {
    let t = start(
        kind,
        &[("keep.txt", "same"), ("edit.txt", "old"), ("gone.txt", "x")],
    )
    .await;
    bash(
        &t,
        "echo new > edit.txt; rm gone.txt; mkdir d; printf '\\xff' > d/bin",
    )
    .await;
    let ExportResult::Files { files } =
        t.sb.client
            .export(&ExportArgs::default())
            .await
            .unwrap()
            .unwrap()
    else {
        panic!("a plain workspace exports files")
    };
    let summary: Vec<(String, String)> = files
        .iter()
        .map(|f| (f.path.clone(), f.status.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            ("d/bin", "added"),
            ("edit.txt", "modified"),
            ("gone.txt", "deleted")
        ]
        .map(|(p, s)| (p.to_string(), s.to_string()))
    );
    assert_eq!(files[1].text.as_deref(), Some("new\n"));
    assert_eq!(files[0].base64.as_deref(), Some("/w=="));
    t.stop().await;
}

async fn bash_exit_with_a_background_job_holding_the_terminal(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    bash(&t, "sleep 300 &").await;
    // The background job keeps the terminal open, so only the shell's own exit tells.
    let r =
        t.sb.client
            .bash("exit 4", Some(Duration::from_secs(60)))
            .await
            .unwrap();
    assert!(!r.timed_out, "{r:?}");
    assert!(r.shell_restarted);
    assert_eq!(r.exit_code, Some(4));
    assert!(
        t.sb.client.ping().await.unwrap().bash_ready,
        "the server survived"
    );
    assert_eq!(bash(&t, "echo on").await.output, "on\n");
    t.stop().await;
}

async fn bash_prompt_changes_do_not_leak_into_output(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    bash(&t, "PS1='(venv) $ '; PROMPT_COMMAND='echo prompt'").await;
    assert_eq!(bash(&t, "echo clean").await.output, "clean\n");
    t.stop().await;
}

async fn bash_background_jobs_keep_running_between_calls(kind: RuntimeKind) {
    let t = start(kind, &[]).await;
    // Far more output than a terminal buffers, printed while no bash call is running.
    bash(&t, "(seq 1 300000; touch finished) &").await;
    let r = t
        .sb
        .client
        .python(
            "import os, time\nfor _ in range(600):\n    if os.path.exists('finished'):\n        break\n    time.sleep(0.1)\nos.path.exists('finished')",
            Some(Duration::from_secs(120)),
        )
        .await
        .unwrap();
    assert_eq!(
        r.value.as_deref(),
        Some("True"),
        "the background job blocked: {r:?}"
    );
    // What it printed opens the next call's output: the newest part, with the rest counted.
    let r = bash(&t, "echo after").await;
    assert!(
        r.output.ends_with("after\n"),
        "{}",
        &r.output[r.output.len().saturating_sub(200)..]
    );
    assert!(
        r.output.contains("300000\n"),
        "the end of the background output is kept"
    );
    assert!(r.omitted_bytes > 0);
    t.stop().await;
}

/// An agent in the sandbox calls the endpoint over HTTP; the host takes each request
/// with `endpoint_next` and answers it with `endpoint_reply`; a request without the
/// episode's key is answered 401 by the sandbox and never reaches the host.
async fn model_endpoint_relays_requests_to_the_host(kind: RuntimeKind) {
    use rollout_sandbox::protocol::{EndpointReplyArgs, ExecArgs};
    let agent = r#"
import json, os, sys, urllib.request, urllib.error
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
def post(path, body, key):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
print("wrong-key", post("/chat/completions", {"n": 1}, "x" * len(key))[0])
for i in range(2):
    status, body = post("/chat/completions", {"turn": i}, key)
    print("call", i, status, json.loads(body)["echo"])
"#;
    let t = start(kind, &[("agent.py", agent)]).await;
    let key = "k0123456789abcdef0123456789abcdef";
    let port = t.sb.client.endpoint_open(key).await.expect("open");
    assert_eq!(
        t.sb.client.endpoint_open(key).await.expect("open again"),
        port
    );
    assert!(
        t.sb.client
            .endpoint_open("another-key-of-enough-length")
            .await
            .is_err()
    );
    let env = [
        (
            "OPENAI_BASE_URL".to_string(),
            format!("http://127.0.0.1:{port}/v1"),
        ),
        ("OPENAI_API_KEY".to_string(), key.to_string()),
    ];
    let args = ExecArgs {
        command: "python3 agent.py".into(),
        env: env.into_iter().collect(),
        ..Default::default()
    };
    let client = &t.sb.client;
    let host = async {
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let Some(call) = client
                .endpoint_next(Duration::from_secs(20))
                .await
                .expect("next")
            else {
                continue;
            };
            assert_eq!(
                (call.method.as_str(), call.path.as_str()),
                ("POST", "/v1/chat/completions")
            );
            let body: serde_json::Value = serde_json::from_str(&call.body).unwrap();
            let reply = EndpointReplyArgs {
                id: call.id,
                status: 200,
                content_type: None,
                body: serde_json::json!({"echo": body["turn"]}).to_string(),
            };
            assert!(client.endpoint_reply(&reply).await.expect("reply"));
            assert!(
                !client.endpoint_reply(&reply).await.expect("reply twice"),
                "a request is answered once"
            );
            seen.push(body);
        }
        seen
    };
    let (ran, seen) = tokio::join!(client.exec(&args, Some(Duration::from_secs(60))), host);
    let ran = ran.expect("exec");
    assert_eq!(ran.exit_code, Some(0), "{}", ran.output);
    assert!(ran.output.contains("wrong-key 401"), "{}", ran.output);
    assert!(
        ran.output.contains("call 0 200 0") && ran.output.contains("call 1 200 1"),
        "{}",
        ran.output
    );
    assert_eq!(
        seen.len(),
        2,
        "the request with the wrong key never reached the host"
    );
    let idle = client
        .endpoint_next(Duration::from_millis(200))
        .await
        .expect("next");
    assert!(idle.is_none(), "nothing else was asked");
    t.stop().await;
}
