//! The `agent_program` kind end to end with real third-party agent frameworks from PyPI
//! (`scripts/agent-frameworks-env.sh` installs them): an agent on the `openai` SDK and
//! mini-swe-agent (on LiteLLM), each run as it is inside a bubblewrap sandbox against
//! its episode's endpoint, driven by the stand-in server through multi-turn fixes that
//! EVAL grades (a check command; the SWE grader on a unittest-style repository).
//! Checked: the reward; every call's tokens against what the server sent; the merge
//! verdicts (continuations joined into one sample, a fresh conversation starting
//! another); the call limit; and that the program is contained like any tool (no
//! network to the host, nothing it leaves running outlives it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rollout::domain::backend::WireKind;
use rollout::domain::{Status, Task};
use serde_json::{Value, json};

use crate::agent::{Stand, assert_token_exact, run_output};
use crate::helpers::processes_running;

/// Where the agent frameworks are installed (for the sandboxes' interpreter), or
/// `None` with the prerequisite reported.
pub(crate) fn agent_site(test: &str) -> Option<PathBuf> {
    match std::env::var_os("ROLLOUT_AGENT_SITE") {
        Some(p) if Path::new(&p).join("openai").is_dir() => Some(PathBuf::from(p)),
        _ => {
            crate::prerequisite::missing(
                test,
                "ROLLOUT_AGENT_SITE does not name a directory holding the agent frameworks; \
                 run `export ROLLOUT_AGENT_SITE=$(scripts/agent-frameworks-env.sh)` (the test \
                 command does)",
            );
            None
        }
    }
}

/// An agent on the `openai` SDK, as a user would write one: a bash tool, a loop until
/// the model answers without a call, then a new conversation asking for a summary. It
/// also tries to reach the host (the gateway's port) and leaves a process behind.
pub(crate) const SDK_AGENT: &str = r#"
import json, os, socket, subprocess, sys
from openai import OpenAI

host, port = os.environ["GATEWAY"].rsplit(":", 1)
try:
    socket.create_connection((host, int(port)), timeout=3).close()
    print("REACHED THE HOST")
except OSError as e:
    print("isolated:", type(e).__name__)
subprocess.Popen(["sleep", "4242"], start_new_session=True)

client = OpenAI()
model = os.environ["ROLLOUT_MODEL"]
tools = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
messages = [
    {"role": "system", "content": "You are a careful engineer."},
    {"role": "user", "content": "Repair add() with the SDK agent: calc/add.py subtracts."},
]
for step in range(6):
    r = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                       temperature=0, stream=(step == 1))
    if step == 1:
        # A streamed answer: one chunk with the whole message.
        chunks = list(r)
        delta = chunks[0].choices[0].delta
        message = {"role": "assistant", "content": delta.content,
                   "tool_calls": [{"id": c.id, "type": "function",
                                   "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                  for c in delta.tool_calls or []]}
        calls = delta.tool_calls or []
    else:
        m = r.choices[0].message
        message = m.model_dump(exclude_none=True)
        calls = m.tool_calls or []
    messages.append(message)
    if not calls:
        break
    for c in calls:
        command = json.loads(c.function.arguments)["command"]
        out = subprocess.run(command, shell=True, capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": c.id, "content": out.stdout + out.stderr})
print("answer:", messages[-1]["content"])
summary = client.chat.completions.create(model=model, messages=[
    {"role": "user", "content": "Summarize the fix in one line."}])
print("summary:", summary.choices[0].message.content)
"#;

/// mini-swe-agent as its own `hello_world` example runs it: `DefaultAgent` with
/// `LitellmModel` and `LocalEnvironment`, configured by the `default.yaml` it ships.
const MINI_DRIVER: &str = r#"
import os, sys
from pathlib import Path
import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

config = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())
model = LitellmModel(model_name="openai/" + os.environ["ROLLOUT_MODEL"], **config["model"])
agent = DefaultAgent(model, LocalEnvironment(**config["environment"]), **config["agent"])
result = agent.run(sys.argv[1])
print("exit status:", result.get("exit_status"))
"#;

pub(crate) fn program_task(command: &str, env: Value, sandbox: Value, extra: Value) -> Task {
    let mut spec = json!({
        "command": command,
        "env": env,
        "model": "demo",
        "sandbox": sandbox,
        "limits": {"timeout_ms": 120_000},
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    Task::new("agent_program", spec)
}

fn merges(run: &Value) -> Vec<String> {
    run["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["merge"].as_str().unwrap_or("refused").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_sdk_agent_is_trained_token_exact_and_scored() {
    let Some(site) = agent_site("an_openai_sdk_agent_is_trained_token_exact_and_scored") else {
        return;
    };
    let bind = site.clone();
    let stand = Stand::start(
        &[WireKind::Vllm],
        move |s| s.sandbox.ro_binds.push(bind),
        |_, _| {},
    )
    .await;
    stand.env.workers_in_process(1);
    let gateway = stand.env.base.trim_start_matches("http://").to_string();
    let env = json!({"PYTHONPATH": site.display().to_string(), "GATEWAY": gateway});
    let sandbox = json!({"files": {
        "calc/add.py": "def add(a, b):\n    return a - b\n",
        "sdk_agent.py": SDK_AGENT,
    }});
    let check = json!({"check": {"command": "cd calc && python3 -c 'import add; assert add.add(2, 3) == 5'"}});
    let mut whole = program_task(
        "python3 sdk_agent.py",
        env.clone(),
        sandbox.clone(),
        check.clone(),
    );
    whole.client_id = Some("whole".into());
    // Two calls allowed: the third (the answer after the fix) is refused.
    let mut limited = check.clone();
    limited["limits"] = json!({"max_turns": 2, "timeout_ms": 120_000});
    let mut short = program_task("python3 sdk_agent.py", env, sandbox, limited);
    short.client_id = Some("short".into());
    stand.env.submit(&[whole, short], "sdk").await;
    let results = stand
        .env
        .wait_results("sdk", 2, Duration::from_secs(240))
        .await;
    let by = |id: &str| {
        results
            .iter()
            .find(|r| r.client_id.as_deref() == Some(id))
            .unwrap()
    };

    assert_whole_episode(&stand, by("whole"));
    assert_cut_by_the_call_limit(by("short"));
}

/// The SDK agent's whole episode: scored, contained, its calls joined into samples.
fn assert_whole_episode(stand: &Stand, r: &rollout::domain::JobResult) {
    assert_eq!(r.status, Status::Done, "{r:?}");
    assert_eq!(r.reward, Some(1.0), "{r:?}");
    let run = run_output(r);
    let program = &run["program"];
    assert_eq!(program["exit_code"], 0, "{program}");
    let out = program["output"].as_str().unwrap();
    assert!(
        out.contains("isolated:"),
        "the program reached the host: {out}"
    );
    assert!(out.contains("answer: The function adds now."), "{out}");
    assert!(
        out.contains("summary: add() returned a - b; it returns a + b."),
        "{out}"
    );
    assert_eq!(run["finish_reason"], "exited", "{run}");
    // Three calls in one conversation, joined into one sample; the summary is a
    // conversation of its own.
    assert_eq!(
        merges(run),
        ["first", "extends", "extends", "new"],
        "{}",
        run["calls"]
    );
    let samples = run["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0]["turns"].as_array().unwrap().len(), 3);
    assert_eq!(samples[1]["turns"].as_array().unwrap().len(), 1);
    for s in samples {
        assert_token_exact(stand, s);
    }
    let calls = run["calls"].as_array().unwrap();
    assert!(
        calls[3]["reason"]
            .as_str()
            .unwrap()
            .contains("differs from call 2"),
        "{}",
        calls[3]
    );
    // Each continuation's prompt is the sample so far, exactly: its observation tokens
    // are the tool result as the template renders it.
    assert!(calls[1]["observation_tokens"].as_u64().unwrap() > 0);
    // The trajectory is the sample of the last call.
    assert_eq!(run["prompt_ids"], samples[1]["prompt_ids"]);
    assert_eq!(run["response_ids"], samples[1]["response_ids"]);
    // The SDK's requests as it sent them, the answers as it got them.
    assert_eq!(calls[0]["request"]["temperature"], 0);
    assert_eq!(
        calls[0]["reply"]["tool_calls"][0]["function"]["name"],
        "bash"
    );
    // What the program left running ended with it.
    assert_eq!(
        processes_running("sleep 4242"),
        0,
        "the program's leftover outlived it"
    );
}

/// The SDK agent cut by `max_turns`: its third call refused, the episode ended for it.
fn assert_cut_by_the_call_limit(r: &rollout::domain::JobResult) {
    assert_eq!(r.status, Status::Done, "{r:?}");
    let run = run_output(r);
    assert_eq!(run["finish_reason"], "max_turns", "{run}");
    assert_eq!(
        merges(run),
        ["first", "extends", "refused"],
        "{}",
        run["calls"]
    );
    assert_ne!(
        run["program"]["exit_code"], 0,
        "the SDK raised on the refusal"
    );
    assert!(
        run["calls"][2]["reply"]["error"]["code"] == "rollout_call_limit",
        "{}",
        run["calls"][2]
    );
    // The fix was made before the limit: it is scored.
    assert_eq!(r.reward, Some(1.0), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mini_swe_agent_fixes_a_repository_graded_by_the_swe_grader() {
    let Some(site) = agent_site("mini_swe_agent_fixes_a_repository_graded_by_the_swe_grader")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("calc");
    let base = crate::swe::calc_repo(&repo);
    let bind = site.clone();
    // SGLang's wire here (the SDK agent's test speaks vLLM's): the endpoint is the same
    // over both.
    let stand = Stand::start(
        &[WireKind::Sglang],
        move |s| s.sandbox.ro_binds.push(bind),
        |_, _| {},
    )
    .await;
    stand.env.workers_in_process(1);
    let grader = crate::swe::calc_grader(&repo, &base);
    let env = json!({
        "PYTHONPATH": site.display().to_string(),
        // LiteLLM fetches its model cost map at import unless told not to; the sandbox
        // has no network.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MSWEA_COST_TRACKING": "ignore_errors",
        // The driver, kept out of the workspace (its diff is what is graded).
        "MINI_DRIVER": MINI_DRIVER,
    });
    let command = "python3 -c \"$MINI_DRIVER\" 'double() in calc.py returns one too many; make double(3) == 6.'";
    let task = program_task(command, env, json!({}), json!({"grader": grader}));
    stand.env.submit(&[task], "mini").await;
    let results = stand
        .env
        .wait_results("mini", 1, Duration::from_secs(240))
        .await;
    let r = &results[0];
    let run = run_output(r);
    assert_eq!(r.status, Status::Done, "{r:?}");
    assert_eq!(run["program"]["exit_code"], 0, "{}", run["program"]);
    assert!(
        run["program"]["output"]
            .as_str()
            .unwrap()
            .contains("exit status: Submitted"),
        "{}",
        run["program"]["output"]
    );
    assert_eq!(r.reward, Some(1.0), "{r:?}");
    assert_eq!(
        merges(run),
        ["first", "extends", "extends"],
        "{}",
        run["calls"]
    );
    let samples = run["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 1);
    assert_token_exact(&stand, &samples[0]);
    // The fix, and only the fix, is in the diff EVAL graded.
    let diff = run["export"]["diff"].as_str().unwrap_or_default();
    assert!(
        diff.contains("-    return x + x + 1\n+    return x + x\n"),
        "{}",
        run["export"]
    );
    assert_eq!(diff.matches("diff --git").count(), 1, "{diff}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_agent_program_tasks_are_refused_naming_the_field() {
    let env = crate::helpers::TestEnv::start(|_| {}).await;
    let good = json!({"command": "python3 agent.py", "check": {"command": "true"}});
    let with = |k: &str, v: Value| {
        let mut s = good.clone();
        s[k] = v;
        s
    };
    crate::helpers::assert_specs_refused(
        &env,
        "agent_program",
        &[
            (with("command", json!(" ")), "command"),
            (
                with("limits", json!({"tool_timeout_ms": 5})),
                "limits.tool_timeout_ms",
            ),
            (with("limits", json!({"max_turns": 0})), "limits.max_turns"),
            (with("env", json!({"A=B": "1"})), "env.A=B"),
            (with("parser", json!("nope")), "parser"),
            (with("max_output_bytes", json!(0)), "max_output_bytes"),
            (with("replay_of", json!(" ")), "replay_of"),
        ],
    )
    .await;
}
