//! Agent-program benchmarks (not tests): run with `cargo bench --bench program`.
//!
//! Needs the agent frameworks for the sandboxes' interpreter:
//! `export ROLLOUT_AGENT_SITE=$(scripts/agent-frameworks-env.sh)`.
//!
//! 1. **call overhead**: a client in a bubblewrap sandbox (Python's `urllib`, so no
//!    SDK's own time is counted) makes sequential chat calls of one growing
//!    conversation to its episode's endpoint. Each call goes through the relay, the
//!    sandbox socket, the chat template, the backend and back. The baseline is the same
//!    client on the host sending the very prompts those calls sent, as token IDs,
//!    straight to the same stand-in server's `/v1/completions`, in the same run.
//! 2. **episode throughput**: the same scripted fix (read a file, edit it, answer) as
//!    episodes of an agent on the `openai` SDK (`agent_program`) and as episodes of the
//!    built-in loop (`agent`), through the whole service with the same workers.
//!
//! The stand-in server plays a script (it is not a model) and answers at once: the
//! figures are the service's and the agent's own costs. `BENCH_QUICK=1` runs a few calls
//! and episodes.

use std::time::{Duration, Instant};

use rollout::domain::backend::{BackendSpec, WireKind};
use rollout::domain::{Status, Task};
use rollout::scripted::script::Script;
use rollout::scripted::{ScriptedConfig, ScriptedServer, demo};
use serde_json::json;

mod common;
#[path = "common/service.rs"]
mod service;

fn call(command: &str) -> String {
    format!(
        "<tool_call>\n{}\n</tool_call>",
        rollout::agent::template::python_json(
            &json!({"name": "bash", "arguments": {"command": command}}),
            None
        )
    )
}

fn script() -> Script {
    let p = json!({"rules": [
        {"match": "Keep talking", "variants": [{"turns": ["Noted; go on."]}]},
        {"match": "Repair add()", "variants": [{"turns": [
            call("cat calc/add.py"),
            call("sed -i 's/a - b/a + b/' calc/add.py"),
            "The function adds now.",
        ]}]},
    ]});
    Script::from_json(&p.to_string()).unwrap()
}

/// Sends `n` chat calls of one conversation to the endpoint and prints each call's
/// latency (µs) as JSON.
const CHATTER: &str = r#"
import json, os, sys, time, urllib.request
base, key, n = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], int(sys.argv[1])
messages = [{"role": "user", "content": "Keep talking about the weather in short sentences."}]
lat = []
for i in range(n):
    body = json.dumps({"model": "demo", "messages": messages}).encode()
    req = urllib.request.Request(base + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        reply = json.loads(r.read())
    lat.append(int((time.perf_counter() - t) * 1e6))
    messages.append(reply["choices"][0]["message"])
    messages.append({"role": "user", "content": "And then?"})
print("LAT " + json.dumps(lat))
"#;

/// Sends each prompt (token IDs, from stdin) to a server's `/v1/completions` and prints
/// the latencies (µs) as JSON.
const DIRECT: &str = r#"
import json, sys, time, urllib.request
url, max_tokens = sys.argv[1], json.loads(sys.argv[2])
prompts = json.loads(sys.stdin.read())
lat = []
for p, m in zip(prompts, max_tokens):
    body = json.dumps({"model": "demo", "prompt": p, "max_tokens": m, "logprobs": 0,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        r.read()
    lat.append(int((time.perf_counter() - t) * 1e6))
print(json.dumps(lat))
"#;

const SDK_AGENT: &str = r#"
import json, os, subprocess
from openai import OpenAI
client = OpenAI()
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
          "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "user", "content": "Repair add(): calc/add.py subtracts."}]
while True:
    m = client.chat.completions.create(model="demo", messages=messages, tools=tools).choices[0].message
    messages.append(m.model_dump(exclude_none=True))
    if not m.tool_calls:
        break
    for c in m.tool_calls:
        out = subprocess.run(json.loads(c.function.arguments)["command"], shell=True,
                             capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": c.id, "content": out.stdout + out.stderr})
"#;

fn percentile(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[common::rank(v.len(), p)]
}

fn main() {
    common::run_table("program", |quick| async move {
        let Some(site) = std::env::var_os("ROLLOUT_AGENT_SITE") else {
            eprintln!(
                "set ROLLOUT_AGENT_SITE=$(scripts/agent-frameworks-env.sh): the agent frameworks"
            );
            return Vec::new();
        };
        let site = site.to_string_lossy().to_string();
        let dir = tempfile::tempdir().unwrap();
        let model_dir = dir.path().join("model");
        let p = script();
        let extra: Vec<String> = p
            .rules
            .iter()
            .flat_map(|r| &r.variants)
            .flat_map(|v| v.turns.clone())
            .collect();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        demo::write_model_dir(&model_dir, demo::CHATML_TEMPLATE, &extra).unwrap();
        let model =
            std::sync::Arc::new(rollout::agent::model::ModelFiles::load(&model_dir).unwrap());
        let mut cfg = ScriptedConfig::new(model, p);
        cfg.model_name = "demo".into();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = ScriptedServer::spawn(listener, cfg).unwrap();
        let bind = std::path::PathBuf::from(&site);
        let env = service::start(move |s| {
            s.sandbox.ro_binds.push(bind);
            s.stages.run.concurrency = 4;
        })
        .await;
        env.client
            .add_backend(&BackendSpec {
                id: "b0".into(),
                url: server.url(),
                kind: WireKind::Vllm,
                model: "demo".into(),
                tokenizer: model_dir.display().to_string(),
                weight: 1.0,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut rows = Vec::new();
        let calls = if quick { 10 } else { 200 };
        rows.push(overhead(&env, &server, calls).await);
        let episodes = if quick { 4 } else { 32 };
        rows.push(throughput(&env, &site, episodes).await);
        env.shutdown.cancel();
        server.stop().await;
        rows
    });
}

/// Row 1: the endpoint's call latency against direct requests for the same prompts.
async fn overhead(env: &service::Env, server: &ScriptedServer, calls: usize) -> String {
    let task = Task::new(
        "agent_program",
        json!({
            "command": format!("python3 -c \"$CHATTER\" {calls}"),
            "env": {"CHATTER": CHATTER},
            "limits": {"max_turns": calls + 1, "max_tokens": 32768, "timeout_ms": 600_000},
            "check": {"command": "true"},
        }),
    );
    env.client.submit(&[task], Some("overhead")).await.unwrap();
    let r = env
        .client
        .collect_results("overhead", 1)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(r.status, Status::Done, "{r:?}");
    let run = &r.output["run"];
    let out = run["program"]["output"].as_str().unwrap_or_default();
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("LAT "))
        .unwrap_or_else(|| panic!("{out}"));
    let mut endpoint: Vec<u64> = serde_json::from_str(line).unwrap();
    // The prompts those calls sent, and their output lengths, from the recording.
    let recorded = rollout::agent::replay::recorded_calls(run).unwrap();
    let prompts: Vec<&Vec<u32>> = recorded.iter().map(|c| &c.prompt).collect();
    let max_tokens: Vec<usize> = recorded.iter().map(|c| c.output.len()).collect();
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            DIRECT,
            &server.url(),
            &serde_json::to_string(&max_tokens).unwrap(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&prompts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let mut direct: Vec<u64> = serde_json::from_slice(&out.stdout).unwrap();
    // The RUN worker's own time in each call (rendering, tokenizing, bookkeeping: the
    // call's wall time there minus the backend's), from the calls' turn records.
    let mut own: Vec<u64> = run["samples"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["turns"].as_array().unwrap().iter())
        .map(|t| t["overhead_us"].as_u64().unwrap_or_default())
        .collect();
    let own50 = percentile(&mut own, 0.5);
    let (e50, e99) = (
        percentile(&mut endpoint, 0.5),
        percentile(&mut endpoint, 0.99),
    );
    let (d50, d99) = (percentile(&mut direct, 0.5), percentile(&mut direct, 0.99));
    let ms = |us: u64| us as f64 / 1000.0;
    format!(
        "| chat call through the episode's endpoint, {} calls of one conversation (prompt up to {} tokens) | p50 {:.2} ms, p99 {:.2} ms (the RUN worker's own part: p50 {:.2} ms) | the same prompts as token IDs straight to the server: p50 {:.2} ms, p99 {:.2} ms | p50 +{:.2} ms ({:.1}×) | — |",
        endpoint.len(),
        prompts.last().map_or(0, |p| p.len()),
        ms(e50),
        ms(e99),
        ms(own50),
        ms(d50),
        ms(d99),
        ms(e50.saturating_sub(d50)),
        e50 as f64 / d50.max(1) as f64
    )
}

/// Row 2: episodes per second of an SDK agent against the built-in loop, same fix.
async fn throughput(env: &service::Env, site: &str, n: usize) -> String {
    let files = json!({"calc/add.py": "def add(a, b):\n    return a - b\n", "agent.py": SDK_AGENT});
    let check = json!({"command": "cd calc && python3 -c 'import add; assert add.add(2, 3) == 5'"});
    let program: Vec<Task> = (0..n)
        .map(|_| {
            Task::new(
                "agent_program",
                json!({"command": "python3 agent.py", "env": {"PYTHONPATH": site},
                       "sandbox": {"files": files}, "check": check}),
            )
        })
        .collect();
    let builtin: Vec<Task> = (0..n)
        .map(|_| {
            Task::new(
                "agent",
                json!({"messages": [{"role": "user", "content": "Repair add(): calc/add.py subtracts."}],
                       "tools": ["bash"], "sandbox": {"files": files}, "check": check}),
            )
        })
        .collect();
    let mut rates = Vec::new();
    for (batch, tasks) in [("builtin", builtin), ("program", program)] {
        let t = Instant::now();
        env.client.submit(&tasks, Some(batch)).await.unwrap();
        let results = env.client.collect_results(batch, n).await.unwrap();
        let secs = t.elapsed().as_secs_f64();
        let scored = results.iter().filter(|r| r.reward == Some(1.0)).count();
        assert_eq!(
            scored,
            n,
            "every episode fixes the file: {:?}",
            results.first()
        );
        rates.push(n as f64 / secs);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    format!(
        "| episodes of an `openai`-SDK agent (`agent_program`), {n} × (3 calls, 2 bash commands), 4 RUN slots | {:.2} episodes/s | the built-in loop, same fix: {:.2} episodes/s | {:.2}× | — |",
        rates[1],
        rates[0],
        rates[1] / rates[0]
    )
}
