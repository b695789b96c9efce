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
    let error = &run["calls"][2]["reply"]["error"];
    assert_eq!(error["code"], 400, "{}", run["calls"][2]);
    assert_eq!(error["type"], "BadRequestError", "{}", run["calls"][2]);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("model calls are spent"),
        "{}",
        run["calls"][2]
    );
    // A refused call is recorded short: its body's length and first bytes.
    assert!(
        run["calls"][2]["request"]["bytes"].as_u64().unwrap() > 0,
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
            (
                with("replay_across_batches", json!(true)),
                "replay_across_batches",
            ),
            (
                with("limits", json!({"max_refused_calls": 0})),
                "limits.max_refused_calls",
            ),
            (
                with("sampling", json!({"max_tokens": 0})),
                "sampling.max_tokens",
            ),
        ],
    )
    .await;
}

/// An agent program (the standard library only) that sends its endpoint a corpus of
/// malformed requests, prints `CASE <name> <expected status> <status> <shape>` for
/// each (`vllm`: vLLM's error shape; `json`: another JSON error; `none`), then fixes the
/// file and makes one good call. `shape` is judged by the program, as a client would.
const MALFORMED_AGENT: &str = r#"
import http.client, json, os, urllib.parse

base = urllib.parse.urlparse(os.environ["OPENAI_BASE_URL"])
key = os.environ["OPENAI_API_KEY"]
model = os.environ["ROLLOUT_MODEL"]
user = [{"role": "user", "content": "Fix add()."}]
call = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]

def chat(**fields):
    body = {"model": model, "messages": user}
    body.update(fields)
    return json.dumps(body).encode()

def completion(**fields):
    body = {"model": model, "prompt": [1, 2, 3]}
    body.update(fields)
    return json.dumps(body).encode()

def send(method, path, body, auth=True):
    c = http.client.HTTPConnection(base.hostname, base.port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Bearer " + key
    c.request(method, base.path + path, body=body, headers=headers)
    r = c.getresponse()
    status, text = r.status, r.read()
    c.close()
    try:
        err = json.loads(text)["error"]
        ok = isinstance(err["message"], str) and err["message"]
        if ok and err.get("type") == "BadRequestError" and err.get("code") == status and "param" in err:
            return status, "vllm"
        if ok and err.get("code") == status and "type" in err and "param" in err:
            return status, "vllm"
        return status, "json" if ok else "none"
    except Exception:
        return status, "none"

C, P = "/chat/completions", "/completions"
huge = "x" * (7 << 20)
cases = [
    # Each of these once ended the job: a panic ("a turn has a part"), a backend refusal.
    ("max_tokens-0", 400, C, chat(max_tokens=0)),
    ("max_completion_tokens-0", 400, C, chat(max_completion_tokens=0)),
    ("completion-max_tokens-0", 400, P, completion(max_tokens=0)),
    ("token-out-of-vocabulary", 400, P, completion(prompt=[1, 10 ** 6])),
    ("stop-empty", 400, C, chat(stop=[""])),
    # Bodies that are no request.
    ("empty-body", 400, C, b""),
    ("not-json", 400, C, b"{not json"),
    ("trailing-bytes", 400, C, chat() + b" x"),
    ("json-array", 400, C, b"[1, 2]"),
    ("deep-nesting", 400, C, b"[" * 100000 + b"]" * 100000),
    ("invalid-utf8", 400, C, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    # Wrong types, every field.
    ("messages-number", 400, C, chat(messages=3)),
    ("messages-empty", 400, C, chat(messages=[])),
    ("message-string", 400, C, chat(messages=["hi"])),
    ("role-missing", 400, C, chat(messages=[{"content": "hi"}])),
    ("role-number", 400, C, chat(messages=[{"role": 3, "content": "hi"}])),
    ("content-number", 400, C, chat(messages=[{"role": "user", "content": 3}])),
    ("content-image", 400, C, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])),
    ("ends-with-assistant", 400, C, chat(messages=user + [{"role": "assistant", "content": "x"}])),
    ("tool-calls-string", 400, C, chat(messages=user + [{"role": "assistant", "tool_calls": "bash"}, {"role": "user", "content": "x"}])),
    ("tool-call-not-object", 400, C, chat(messages=user + [{"role": "assistant", "tool_calls": ["bash"]}, {"role": "user", "content": "x"}])),
    ("tool-call-function-string", 400, C, chat(messages=user + [{"role": "assistant", "tool_calls": [{"function": "bash"}]}, {"role": "user", "content": "x"}])),
    ("tool-result-unknown-id", 400, C, chat(messages=user + [call, {"role": "tool", "tool_call_id": "nope", "content": "x"}], tools=tools)),
    ("tool-result-no-call", 400, C, chat(messages=user + [{"role": "tool", "tool_call_id": "c1", "content": "x"}])),
    ("model-number", 400, C, chat(model=7)),
    ("max_tokens-string", 400, C, chat(max_tokens="ten")),
    ("max_tokens-float", 400, C, chat(max_tokens=1.5)),
    ("n-2", 400, C, chat(n=2)),
    ("n-string", 400, C, chat(n="one")),
    ("temperature-negative", 400, C, chat(temperature=-1)),
    ("temperature-string", 400, C, chat(temperature="hot")),
    ("top_p-0", 400, C, chat(top_p=0)),
    ("top_k--5", 400, C, chat(top_k=-5)),
    ("presence_penalty-9", 400, C, chat(presence_penalty=9)),
    ("seed-huge", 400, C, chat(seed=2 ** 64)),
    ("stop-number", 400, C, chat(stop=3)),
    ("stream-string", 400, C, chat(stream="yes")),
    ("stream_options-alone", 400, C, chat(stream_options={"include_usage": True})),
    ("logprobs-number", 400, C, chat(logprobs=3)),
    ("top_logprobs-alone", 400, C, chat(top_logprobs=3)),
    ("tools-object", 400, C, chat(tools={"bash": 1})),
    ("tool-no-name", 400, C, chat(tools=[{"type": "function", "function": {}}])),
    ("tool_choice-no-tools", 400, C, chat(tool_choice="required")),
    ("tool_choice-unknown", 400, C, chat(tools=tools, tool_choice={"type": "function", "function": {"name": "python"}})),
    ("response_format-bad", 400, C, chat(response_format={"type": "yaml"})),
    ("logit_bias-bad", 400, C, chat(logit_bias={"1": "x"})),
    ("user-number", 400, C, chat(user=1)),
    ("prompt-negative", 400, P, completion(prompt=[1, -2])),
    ("prompt-batch", 400, P, completion(prompt=[[1], [2]])),
    ("prompt-object", 400, P, completion(prompt={"a": 1})),
    ("prompt-empty", 400, P, completion(prompt=[])),
    ("echo", 400, P, completion(echo=True)),
    ("best_of-2", 400, P, completion(best_of=2)),
    # Paths and methods not served, and a call without the key: answered, not calls.
    ("wrong-method", 405, C, None),
    ("unknown-path", 404, "/embeddings", b"{}"),
    ("no-key", 401, C, chat()),
    # Huge bodies: refused, and recorded short.
    ("over-the-limit", 413, C, b" " * ((8 << 20) + 1)),
]
cases += [("huge-%d" % i, 400, C, chat(max_tokens=huge)) for i in range(12)]
cases += [("huge-message-%d" % i, 400, C, chat(messages=[{"role": 3, "content": huge}])) for i in range(2)]

for name, expected, path, body in cases:
    method = "GET" if body is None else "POST"
    status, shape = send(method, path, body, auth=(name != "no-key"))
    print("CASE", name, expected, status, shape, flush=True)

with open("calc/add.py", "w") as f:
    f.write("def add(a, b):\n    return a + b\n")
status, _ = send("POST", C, chat(max_tokens=16))
print("GOOD", status, flush=True)
"#;

/// An agent program that fixes the file, then sends the same malformed call forever.
const LOOPING_AGENT: &str = r#"
import json, os, urllib.error, urllib.request

with open("calc/add.py", "w") as f:
    f.write("def add(a, b):\n    return a + b\n")
while True:
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"messages": 3}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        print("refused", e.code, flush=True)
"#;

/// Nothing a program sends ends its job: a corpus of malformed requests (every field of
/// the wrong type or range, bodies that are no request, huge ones, conversations that do
/// not hold together, and the requests that once panicked RUN or failed the job) is
/// answered 4xx with a JSON error, each refused call is recorded short, and the episode
/// is graded. A program that keeps sending refused calls is ended at the cap, for that
/// reason, and graded too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_and_the_episode_is_graded() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let check = json!({"command": "cd calc && python3 -c 'import add; assert add.add(2, 3) == 5'"});
    let sandbox = |agent: &str| json!({"files": {"calc/add.py": "def add(a, b):\n    return a - b\n", "agent.py": agent}});
    let mut corpus = program_task(
        "python3 agent.py",
        json!({}),
        sandbox(MALFORMED_AGENT),
        json!({"check": check, "limits": {"max_refused_calls": 200, "timeout_ms": 300_000}}),
    );
    corpus.client_id = Some("corpus".into());
    let mut looping = program_task(
        "python3 agent.py",
        json!({}),
        sandbox(LOOPING_AGENT),
        json!({"check": check, "limits": {"max_refused_calls": 5, "timeout_ms": 300_000}}),
    );
    looping.client_id = Some("looping".into());
    stand.env.submit(&[corpus, looping], "malformed").await;
    let results = stand
        .env
        .wait_results("malformed", 2, Duration::from_secs(400))
        .await;
    let by = |id: &str| {
        results
            .iter()
            .find(|r| r.client_id.as_deref() == Some(id))
            .unwrap()
    };

    let r = by("corpus");
    assert_eq!(r.status, Status::Done, "{r:?}");
    let run = run_output(r);
    let out = run["program"]["output"].as_str().unwrap_or_default();
    assert_eq!(run["program"]["exit_code"], 0, "{}", run["program"]);
    let cases: Vec<Vec<&str>> = out
        .lines()
        .filter_map(|l| l.strip_prefix("CASE "))
        .map(|l| l.split(' ').collect())
        .collect();
    assert_eq!(cases.len(), 71, "{out}");
    let mut reached_host = 0;
    for c in &cases {
        let (name, expected, got, shape) = (c[0], c[1], c[2], c[3]);
        assert_eq!(got, expected, "{name}: {out}");
        // The relay inside the sandbox answers what never reaches the host (no key, a
        // body over its limit or not UTF-8) with its own JSON error; the endpoint
        // answers everything else in vLLM's shape.
        let relay = matches!(name, "no-key" | "over-the-limit" | "invalid-utf8");
        if relay {
            assert_ne!(shape, "none", "{name}: {out}");
        } else {
            assert_eq!(shape, "vllm", "{name}: {out}");
        }
        if !relay && !matches!(name, "wrong-method" | "unknown-path") {
            reached_host += 1;
        }
    }
    assert!(out.contains("GOOD 200"), "{out}");
    assert_eq!(run["finish_reason"], "exited", "{run}");
    // The episode is graded: the fix made after the refusals counts.
    assert_eq!(r.reward, Some(1.0), "{r:?}");
    let calls = run["calls"].as_array().unwrap();
    let refused: Vec<&Value> = calls.iter().filter(|c| c["sample"].is_null()).collect();
    assert_eq!(refused.len(), reached_host, "{}", run["calls"]);
    assert_eq!(calls.len(), reached_host + 1);
    for c in &refused {
        assert!(c["request"]["head"].as_str().unwrap().len() <= 2048, "{c}");
        assert_eq!(c["reply"]["error"]["type"], "BadRequestError", "{c}");
    }
    assert!(
        refused
            .iter()
            .any(|c| c["request"]["bytes"].as_u64().unwrap() > 7 << 20),
        "the huge bodies were refused"
    );
    // Fourteen refused calls of 7 MiB each wrote a result of kilobytes, not of 100 MB.
    let size = serde_json::to_string(&r).unwrap().len();
    assert!(size < 1 << 20, "the result is {size} bytes");

    let r = by("looping");
    assert_eq!(r.status, Status::Done, "{r:?}");
    let run = run_output(r);
    assert_eq!(run["finish_reason"], "refused_calls", "{run}");
    assert_eq!(
        run["calls"].as_array().unwrap().len(),
        5,
        "{}",
        run["calls"]
    );
    assert!(
        run["program"]["stopped"].as_str().is_some(),
        "{}",
        run["program"]
    );
    assert_eq!(r.reward, Some(1.0), "{r:?}");
}
