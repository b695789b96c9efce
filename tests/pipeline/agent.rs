//! The `agent` kind end to end: episodes in bubblewrap sandboxes against stand-in
//! inference servers (`rollout::scripted`, which play a script and are not models) over
//! both wire formats, checked token by token against what the servers sent; the drift
//! verdict; backends that die, stall or are cancelled under a running episode; and a
//! batch of 200 jobs over two backends.

use crate::eventually::{eventually, holds};
use std::sync::Arc;
use std::time::Duration;

use rollout::agent::model::ModelFiles;
use rollout::agent::template::python_json;
use rollout::domain::backend::{BackendSpec, WireKind};
use rollout::domain::sampling::SamplingStatus;
use rollout::domain::{Job, JobResult, Stage, Status, Task};
use rollout::scripted::script::Script;
use rollout::scripted::{Control, FaultMode, ScriptedConfig, ScriptedServer, demo};
use serde_json::{Value, json};

use crate::helpers::{TestEnv, ids, json_answer, processes_running, wait_gone};

/// A Hermes tool call exactly as the chat template's `tojson` writes it back, so a
/// re-rendered conversation agrees with what the model emitted.
/// A JSON count or index of the trajectory (a token position, a length) as a `usize`.
fn count(v: &serde_json::Value) -> usize {
    usize::try_from(v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))).unwrap()
}

fn call(name: &str, args: Value) -> String {
    let body = python_json(&json!({"name": name, "arguments": args}), None);
    format!("<tool_call>\n{body}\n</tool_call>")
}

/// The stand-in's script for these tests.
fn script() -> Script {
    let fix = |new: &str, answer: &str| {
        json!({"turns": [
            format!("Let me look at the code first.\n{}", call("bash", json!({"command": "cat calc/add.py"}))),
            call("file", json!({"command": "str_replace", "path": "calc/add.py", "old_str": "a - b", "new_str": new})),
            call("python", json!({"code": "import sys; sys.path.insert(0, 'calc')\nimport add\nadd.add(2, 3)"})),
            call("finish", json!({"answer": answer})),
        ]})
    };
    let p = json!({
        "rules": [
            // Agent programs (tests/pipeline/program.rs): an agent on the `openai` SDK
            // that fixes the file, answers, then starts a new conversation for a
            // summary; mini-swe-agent fixing a unittest-style repository.
            {"match": "Repair add() with the SDK agent", "variants": [{"turns": [
                format!("I will read it.\n{}", call("bash", json!({"command": "cat calc/add.py"}))),
                call("bash", json!({"command": "sed -i 's/a - b/a + b/' calc/add.py && echo fixed"})),
                "The function adds now.".to_string(),
            ]}]},
            // Replays (tests/pipeline/replay.rs): a file the setup fills at random.
            {"match": "Read the stamp", "variants": [{"turns": [
                call("bash", json!({"command": "cat stamp.txt"})),
                call("finish", json!({"answer": "read"})),
            ]}]},
            {"match": "Summarize the fix in one line", "variants": [{"turns": [
                "add() returned a - b; it returns a + b.".to_string(),
            ]}]},
            {"match": "double() in calc.py returns one too many", "variants": [{"turns": [
                format!("THOUGHT: read the module first.\n\n{}", call("bash", json!({"command": "cat calc.py"}))),
                format!("THOUGHT: drop the + 1.\n\n{}", call("bash", json!({"command": "sed -i 's/x + x + 1/x + x/' calc.py && python3 -c 'import calc; print(calc.double(3))'"}))),
                call("bash", json!({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})),
            ]}]},
            {"match": "Fix add() in calc/add.py", "variants": [fix("a + b", "5"), fix("a * b", "6")]},
            {"match": "Take your time", "variants": [{"turns": [
                call("bash", json!({"command": "sleep 2 && echo slept"})),
                call("python", json!({"code": "1 + 1"})),
                call("finish", json!({"answer": "2"})),
            ]}]},
            {"match": "Think first", "variants": [{"turns": [
                format!("<think>\nThe file list comes first.\n</think>\n{}", call("bash", json!({"command": "ls calc"}))),
                call("finish", json!({"answer": "done"})),
            ]}]},
            // Qwen3's own form: reasoning, a blank line, then the calls; two calls in
            // the first turn give two tool results, which the template merges.
            {"match": "Reason like Qwen3", "variants": [{"turns": [
                format!("<think>\nThe file comes first.\n</think>\n\n{}\n{}", call("bash", json!({"command": "cat calc/add.py"})), call("bash", json!({"command": "ls calc"}))),
                format!("<think>\nIt subtracts; it must add.\n</think>\n\n{}", call("file", json!({"command": "str_replace", "path": "calc/add.py", "old_str": "a - b", "new_str": "a + b"}))),
                format!("<think>\nFixed.\n</think>\n\n{}", call("finish", json!({"answer": "5"}))),
            ]}]},
            // Ends its first turn on another of the model's stop tokens, as Llama 3.1
            // ends a tool-call turn on <|eom_id|> rather than <|eot_id|>.
            {"match": "Stop on another token", "variants": [{"turns": [
                format!("{}<|endoftext|>", call("bash", json!({"command": "ls calc"}))),
                call("finish", json!({"answer": "done"})),
            ]}]},
            {"match": "Trip the template", "variants": [{"turns": [
                call("bash", json!({"command": "echo FORBIDDEN"})),
                call("finish", json!({"answer": "never"})),
            ]}]},
            {"match": "Write an essay", "variants": [{"turns": [
                "The quick brown fox jumps over the lazy dog. ".repeat(8),
            ]}]},
            {"match": "Write a long essay", "variants": [{"turns": [
                "The quick brown fox jumps over the lazy dog. ".repeat(80),
            ]}]},
            {"match": "Sit in the sandbox", "variants": [{"turns": [
                call("bash", json!({"command": "sleep 117 && echo woke"})),
                call("finish", json!({})),
            ]}]},
            // Math, graded from the final answer: the text after the reasoning (a box
            // inside the reasoning is not an answer), or the finish tool's answer.
            {"match": "Add a half and a quarter", "variants": [{"turns": [
                "<think>\nMaybe \\boxed{1}? No: 2/4 + 1/4.\n</think>\n\nSo the sum is $\\boxed{\\frac34}$.",
            ]}]},
            {"match": "Add a third and a sixth", "variants": [{"turns": [
                call("python", json!({"code": "1/3 + 1/6"})),
                call("finish", json!({"answer": "0.5"})),
            ]}]},
            {"match": "Add a fifth and a fifth", "variants": [{"turns": [
                "<think>\nIt is \\boxed{\\frac25}.\n</think>\n\nThe answer is 1/5.",
            ]}]},
            {"match": "Quick fix", "variants": [
                {"weight": 1, "turns": [
                    call("file", json!({"command": "str_replace", "path": "calc/add.py", "old_str": "a - b", "new_str": "a + b"})),
                    call("finish", json!({})),
                ]},
                {"weight": 1, "turns": [call("bash", json!({"command": "ls"})), call("finish", json!({}))]},
            ]},
        ]
    });
    Script::from_json(&p.to_string()).unwrap()
}

fn script_turns(p: &Script) -> Vec<String> {
    p.rules
        .iter()
        .flat_map(|r| &r.variants)
        .flat_map(|v| v.turns.clone())
        .collect()
}

/// A test deployment plus stand-in servers registered as backends.
pub(crate) struct Stand {
    pub(crate) env: TestEnv,
    pub(crate) servers: Vec<Option<ScriptedServer>>,
    kinds: Vec<WireKind>,
    model: Arc<ModelFiles>,
}

impl Stand {
    /// Starts the deployment (with `tweak`), writes the model directories, starts one
    /// stand-in server per entry of `kinds` (adjusted by `server`) and registers each as
    /// a backend of model `demo` (and `think` for the drifting template, `qwen3` for a
    /// Qwen3-style template, `picky` for one that refuses some tool output).
    pub(crate) async fn start(
        kinds: &[WireKind],
        tweak: impl FnOnce(&mut rollout::config::Settings),
        server: impl Fn(usize, &mut ScriptedConfig),
    ) -> Stand {
        let env = TestEnv::start(|s| {
            s.pool.retries = 1;
            s.pool.backoff_ms = 50;
            s.pool.health_interval_ms = 60_000;
            tweak(s);
        })
        .await;
        let p = script();
        let turns = script_turns(&p);
        let extra: Vec<&str> = turns.iter().map(String::as_str).collect();
        let dir = env.dir.path().join("model");
        demo::write_model_dir(&dir, demo::CHATML_TEMPLATE, &extra).unwrap();
        let think_dir = env.dir.path().join("model-think");
        let think = include_str!("../fixtures/templates/chatml_think.jinja");
        demo::write_model_dir(&think_dir, think, &extra).unwrap();
        let qwen3_dir = env.dir.path().join("model-qwen3");
        let qwen3 = include_str!("../fixtures/templates/qwen3_like.jinja");
        demo::write_model_dir(&qwen3_dir, qwen3, &extra).unwrap();
        // Fails on an observation that says FORBIDDEN, which no probe does: the glue is
        // built, and breaks mid-episode.
        let picky_dir = env.dir.path().join("model-picky");
        let picky = qwen3.replace(
            "{%- elif m.role == 'tool' %}",
            "{%- elif m.role == 'tool' %}{% if 'FORBIDDEN' in text %}{{ raise_exception('this template refuses FORBIDDEN') }}{% endif %}",
        );
        assert_ne!(picky, qwen3);
        demo::write_model_dir(&picky_dir, &picky, &extra).unwrap();
        // Stops on <|endoftext|> as well as its end-of-turn token (generation_config.json).
        let eom_dir = env.dir.path().join("model-eom");
        demo::write_model_dir(&eom_dir, demo::CHATML_TEMPLATE, &extra).unwrap();
        let vocab = ModelFiles::load(&eom_dir).unwrap();
        let stops = [
            vocab.eos_id,
            vocab.tokenizer.token_id("<|endoftext|>").unwrap(),
        ];
        std::fs::write(
            eom_dir.join("generation_config.json"),
            json!({"eos_token_id": stops}).to_string(),
        )
        .unwrap();
        let model = Arc::new(ModelFiles::load(&dir).unwrap());
        let mut servers = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            let mut cfg = ScriptedConfig::new(model.clone(), p.clone());
            cfg.seed = i as u64;
            // One server behind both pool models, as vLLM serves several names.
            cfg.model_name = "demo".into();
            cfg.aliases = vec!["think".into(), "qwen3".into(), "picky".into(), "eom".into()];
            server(i, &mut cfg);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let s = ScriptedServer::spawn(listener, cfg).unwrap();
            for (model_name, tok) in [
                ("demo", &dir),
                ("think", &think_dir),
                ("qwen3", &qwen3_dir),
                ("picky", &picky_dir),
                ("eom", &eom_dir),
            ] {
                let spec = BackendSpec {
                    id: format!("{model_name}-{i}"),
                    url: s.url(),
                    kind: *kind,
                    model: model_name.into(),
                    tokenizer: tok.display().to_string(),
                    weight: 1.0,
                    ..Default::default()
                };
                env.client.add_backend(&spec).await.unwrap();
            }
            servers.push(Some(s));
        }
        Stand {
            env,
            servers,
            kinds: kinds.to_vec(),
            model,
        }
    }

    /// The index of the server behind backend `demo-<i>` or `think-<i>`.
    fn index(backend: &str) -> usize {
        backend.rsplit('-').next().unwrap().parse().unwrap()
    }

    /// Submits one task into `batch` and waits for its result.
    pub(crate) async fn run_one(&self, task: Task, batch: &str) -> JobResult {
        self.env.submit(&[task], batch).await;
        let mut results = self
            .env
            .wait_results(batch, 1, Duration::from_secs(120))
            .await;
        results.remove(0)
    }

    fn server(&self, backend: &str) -> &ScriptedServer {
        self.servers[Self::index(backend)]
            .as_ref()
            .expect("server running")
    }
}

/// An agent task about the `calc/add.py` workspace.
pub(crate) fn task(prompt: &str, model: &str, extra: Value) -> Task {
    let mut spec = json!({
        "messages": [
            {"role": "system", "content": "You are a careful engineer."},
            {"role": "user", "content": prompt},
        ],
        "model": model,
        "sandbox": {"files": {"calc/add.py": "def add(a, b):\n    return a - b\n"}},
        "check": {"command": "cd calc && python3 -c 'import add; assert add.add(2, 3) == 5'"},
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    Task::new("agent", spec)
}

pub(crate) fn run_output(r: &JobResult) -> &Value {
    &r.output["run"]
}

/// Checks one trajectory against the servers: every model turn is, token for token and
/// logprob for logprob, an answer its backend sent for a prompt of that length, in the
/// backend's wire format; everything else in `response_ids` has loss mask 0; and the
/// sequence is the concatenation of the turns and the observations in order.
pub(crate) fn assert_token_exact(stand: &Stand, run: &Value) {
    let response = ids(&run["response_ids"]);
    let mask: Vec<u64> = run["loss_mask"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_u64().unwrap())
        .collect();
    let logprobs: Vec<f64> = run["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    assert_eq!(mask.len(), response.len());
    assert_eq!(logprobs.len(), response.len());
    let mut expect_mask = vec![0u64; response.len()];
    let mut cursor = 0usize;
    for turn in run["turns"].as_array().unwrap() {
        let [a, b] = [
            count(&turn["model_range"][0]),
            count(&turn["model_range"][1]),
        ];
        let [oa, ob] = [
            count(&turn["observation_range"][0]),
            count(&turn["observation_range"][1]),
        ];
        assert_eq!(a, cursor, "turns and observations are contiguous");
        assert_eq!(oa, b);
        cursor = ob;
        expect_mask[a..b].fill(1);
        let backend = turn["backend"].as_str().unwrap();
        let served = stand.server(backend).served();
        let format = stand.kinds[Stand::index(backend)].as_str();
        // A turn continued after aborts was sent in parts, each after the one before
        // (an abort before any token adds none).
        let continued = usize::try_from(turn["continued"].as_u64().unwrap_or(0)).unwrap();
        let mut at = a;
        let mut prompt_len = count(&turn["prompt_tokens"]);
        let mut parts = 0;
        while at < b || parts == 0 {
            let sent = |s: &&rollout::scripted::Served| {
                s.prompt_len == prompt_len
                    && s.format == format
                    && at + s.output_ids.len() <= b
                    && s.output_ids == response[at..at + s.output_ids.len()]
            };
            let hit = served
                .iter()
                .filter(sent)
                .find(|s| at + s.output_ids.len() == b)
                .or_else(|| {
                    served
                        .iter()
                        .filter(sent)
                        .find(|s| !s.output_ids.is_empty())
                });
            let hit = hit.unwrap_or_else(|| {
                panic!(
                    "turn tokens {:?} (part {parts}) were not sent by {backend} in {format}",
                    &response[at..b]
                )
            });
            for (i, lp) in hit.logprobs.iter().enumerate() {
                // The trajectory's f32 logprobs travel as JSON's shortest decimal form.
                #[allow(clippy::cast_possible_truncation)] // an f32 read back as f64: exact
                let want = logprobs[at + i] as f32;
                assert_eq!(*lp, want);
            }
            at += hit.output_ids.len();
            prompt_len += hit.output_ids.len();
            parts += 1;
        }
        assert!(
            parts <= 1 + continued,
            "{parts} parts for {continued} continuations"
        );
        assert!(logprobs[b..ob].iter().all(|&l| l == 0.0));
    }
    assert_eq!(cursor, response.len());
    assert_eq!(mask, expect_mask);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn episodes_are_token_exact_over_both_wire_formats() {
    // Backend 0 speaks vLLM, 1 SGLang, 2 an older vLLM that returns token IDs only as
    // `token_id:<id>` strings.
    let kinds = [WireKind::Vllm, WireKind::Sglang, WireKind::Vllm];
    let stand = Stand::start(&kinds, |_| {}, |i, c| c.legacy_vllm = i == 2).await;
    stand.env.workers_in_process(1);
    let mut tasks = Vec::new();
    for g in 0..3 {
        for s in 0..4 {
            let mut t = task("Fix add() in calc/add.py, then finish.", "demo", json!({}));
            t.group_id = Some(format!("g{g}"));
            t.client_id = Some(format!("g{g}-s{s}"));
            tasks.push(t);
        }
    }
    stand.env.submit(&tasks, "exact").await;
    let results = stand
        .env
        .wait_results("exact", tasks.len(), Duration::from_secs(300))
        .await;
    let mut formats = std::collections::BTreeSet::new();
    let mut rewards = std::collections::BTreeSet::new();
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
        let run = run_output(r);
        assert_eq!(run["finish_reason"], "finished", "{run}");
        assert_eq!(run["turns"].as_array().unwrap().len(), 4);
        assert_token_exact(&stand, run);
        // The chat template re-renders this conversation to the very same tokens.
        assert_eq!(run["drift"]["identical"], true, "{}", run["drift"]);
        // The answer reached EVAL, and the reward is what the edit earned.
        let right = run["answer"] == "5";
        assert_eq!(r.reward, Some(if right { 1.0 } else { 0.0 }), "{r:?}");
        rewards.insert(right);
        formats.insert(Stand::index(run["backend"].as_str().unwrap()));
        // Tool observations came from the sandbox: the file as it was, the sum after
        // the edit.
        let turns = run["turns"].as_array().unwrap();
        assert!(
            turns[0]["tools"][0]["observation"]
                .as_str()
                .unwrap()
                .contains("return a - b")
        );
        assert_eq!(
            turns[2]["tools"][0]["observation"],
            if right { "5" } else { "6" }
        );
        assert!(turns[0]["tools"][0]["latency_us"].as_u64().unwrap() > 0);
        assert!(run["export"]["files"].is_array(), "{}", run["export"]);
    }
    assert_eq!(
        rewards.len(),
        2,
        "seeded variation gives right and wrong samples"
    );
    assert!(
        formats.len() >= 2,
        "jobs ran on several backends: {formats:?}"
    );
    // A group's samples share a backend (its prompt's prefix cache lives there).
    for g in 0..3 {
        let group: std::collections::BTreeSet<&str> = results
            .iter()
            .filter(|r| r.group_id.as_deref() == Some(&format!("g{g}")))
            .map(|r| run_output(r)["backend"].as_str().unwrap())
            .collect();
        assert_eq!(group.len(), 1, "group g{g} ran on {group:?}");
    }
    // Every assignment was released when its job left RUN.
    let backends = stand.env.client.backends().await.unwrap();
    assert!(backends.iter().all(|b| b.active == 0), "{backends:?}");
}

/// DeepSeek-R1 end to end with the template it ships: the stand-in plays R1's turns (its
/// special tokens, its calls sections) from a model directory with R1's tokenizer
/// tokens, the `deepseek_r1` parser runs the calls in the sandbox, the fix is scored, and
/// every model turn is, token for token and logprob for logprob, what the server sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deepseek_r1_episode_runs_end_to_end_with_its_real_template() {
    let env = TestEnv::start(|s| {
        s.pool.retries = 1;
        s.pool.health_interval_ms = 60_000;
    })
    .await;
    let template = include_str!("../fixtures/templates/deepseek_r1.jinja");
    let r1_call = |command: &str| {
        format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            json!({"command": command})
        )
    };
    let turns = vec![
        format!(
            "The code first.\n</think>\n\n{}",
            r1_call("cat calc/add.py")
        ),
        format!(
            "It subtracts; it must add.\n</think>\n\n{}",
            r1_call("sed -i 's/a - b/a + b/' calc/add.py")
        ),
        "Fixed.\n</think>\n\nadd() adds now.".to_string(),
    ];
    let dir = env.dir.path().join("model-r1");
    std::fs::create_dir_all(&dir).unwrap();
    let mut corpus: Vec<&str> = turns.iter().map(String::as_str).collect();
    corpus.push(template);
    let tok =
        rollout::agent::tokenizer::Tokenizer::train_bpe(&corpus, 1200, &demo::DEEPSEEK_R1_TOKENS)
            .unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_json().unwrap()).unwrap();
    let config = json!({
        "bos_token": demo::DEEPSEEK_R1_TOKENS[0],
        "eos_token": demo::DEEPSEEK_R1_TOKENS[1],
        "chat_template": template,
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    // R1 opens no new assistant turn after tool outputs: the turns are counted by the
    // end of their reasoning, which each of them writes.
    let script = json!({"turn_end_marker": "</think>", "fallback": [{"turns": turns}]});
    let script = Script::from_json(&script.to_string()).unwrap();
    let mut cfg = ScriptedConfig::new(Arc::new(ModelFiles::load(&dir).unwrap()), script);
    cfg.model_name = "r1".into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = ScriptedServer::spawn(listener, cfg).unwrap();
    let backend = BackendSpec {
        id: "r1-0".into(),
        url: server.url(),
        kind: WireKind::Vllm,
        model: "r1".into(),
        tokenizer: dir.display().to_string(),
        weight: 1.0,
        ..Default::default()
    };
    env.client.add_backend(&backend).await.unwrap();
    env.workers_in_process(1);
    let spec = json!({"parser": "deepseek_r1", "tools": ["bash"]});
    env.submit(&[task("Fix add() so that it adds.", "r1", spec)], "r1")
        .await;
    let r = env
        .wait_results("r1", 1, Duration::from_secs(120))
        .await
        .remove(0);
    assert_eq!(r.status, Status::Done, "{:?}", r.error);
    assert_eq!(
        r.reward,
        Some(1.0),
        "the fix ran in the sandbox: {}",
        r.output
    );
    let run = run_output(&r);
    let turns = run["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3, "{run}");
    assert!(
        turns[0]["tools"][0]["observation"]
            .as_str()
            .unwrap()
            .contains("return a - b"),
        "{}",
        turns[0]
    );
    assert_eq!(turns[1]["tools"][0]["call"]["name"], "bash");
    assert_eq!(run["finish_reason"], "no_tool_call");
    let response = ids(&run["response_ids"]);
    let served = server.served();
    for turn in turns {
        let [a, b] = [
            count(&turn["model_range"][0]),
            count(&turn["model_range"][1]),
        ];
        assert!(
            served.iter().any(|s| s.output_ids == response[a..b]),
            "turn tokens {:?} are the server's",
            &response[a..b]
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn math_episodes_are_graded_from_their_final_answer() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let math = |prompt: &str, truth: &str| {
        Task::new(
            "agent",
            json!({
                "messages": [{"role": "user", "content": prompt}],
                "model": "qwen3",
                "grader": {"type": "math", "answer": truth},
            }),
        )
    };
    let cases = [
        // Text after the reasoning; the box inside the reasoning is not the answer.
        ("Add a half and a quarter", "\\frac{3}{4}", 1.0, "\\frac34"),
        // The finish tool's answer.
        ("Add a third and a sixth", "\\frac12", 1.0, "0.5"),
        // Right inside the reasoning, wrong after it: wrong.
        ("Add a fifth and a fifth", "\\frac25", 0.0, "1/5"),
    ];
    for (i, (prompt, truth, reward, extracted)) in cases.into_iter().enumerate() {
        let r = stand
            .run_one(math(prompt, truth), &format!("math-{i}"))
            .await;
        assert_eq!(r.status, Status::Done, "{prompt}: {r:?}");
        let eval = &r.output["eval"];
        assert_eq!(r.reward, Some(reward), "{prompt}: {eval:#}");
        assert_eq!(eval["grader"], "math");
        assert_eq!(eval["extracted"], extracted, "{prompt}: {eval:#}");
        // Graded in the EVAL worker's process: no EVAL sandbox applied anything.
        assert!(eval.get("applied").is_none(), "{eval:#}");
        assert_token_exact(&stand, run_output(&r));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drift_verdict_tells_templates_that_rewrite_history() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let tasks = vec![
        task("Think first, then look.", "think", json!({})),
        task("Think first, then look.", "demo", json!({})),
    ];
    let ids = stand.env.submit(&tasks, "drift").await;
    let results = stand
        .env
        .wait_results("drift", 2, Duration::from_secs(120))
        .await;
    let by_id = |id: &str| results.iter().find(|r| r.job_id == id).unwrap();
    // The reasoning-dropping template renders the finished conversation without the
    // first turn's <think> block: a trainer re-tokenizing it would train on other
    // tokens, starting inside the first model turn.
    let think = run_output(by_id(&ids[0]));
    assert_token_exact(&stand, think);
    assert_eq!(think["drift"]["identical"], false, "{think}");
    let first = count(&think["drift"]["first_difference"]);
    let prompt_len = think["prompt_ids"].as_array().unwrap().len();
    let range = &think["turns"][0]["model_range"];
    let turn0 = prompt_len + count(&range[0])..prompt_len + count(&range[1]);
    assert!(turn0.contains(&first), "{first} not in {turn0:?}");
    // The same episode under the plain template re-renders exactly.
    let plain = run_output(by_id(&ids[1]));
    assert_eq!(plain["drift"]["identical"], true, "{plain}");
    assert_eq!(think["response_ids"], plain["response_ids"]);
    // The drift rate per model is a metric.
    let text = reqwest::get(format!("{}/metrics", stand.env.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("rollout_agent_drift_checks_total")
                && l.contains("model=\"think\"")
                && l.contains("drift=\"true\"")),
        "{text}"
    );
}

/// A Qwen3-style template (the last assistant turn rendered with a think block, the
/// same turn without one once messages follow, consecutive tool results merged) runs
/// multi-turn episodes token-exact over both wire formats. Turns in the model's own
/// form re-render to the same tokens; turns in another form, or thinking switched off
/// (the empty think block the generation prompt adds is dropped from earlier turns on
/// a re-render), are reported as drift where it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_style_templates_run_multi_turn_episodes() {
    let stand = Stand::start(&[WireKind::Vllm, WireKind::Sglang], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let off = json!({"template_args": {"enable_thinking": false}});
    let mut tasks = Vec::new();
    for i in 0..4 {
        let mut t = task("Reason like Qwen3 and fix calc/add.py.", "qwen3", json!({}));
        t.client_id = Some(format!("canonical-{i}"));
        tasks.push(t);
    }
    let mut t = task("Reason like Qwen3 and fix calc/add.py.", "qwen3", off);
    t.client_id = Some("thinking-off".into());
    tasks.push(t);
    let mut t = task("Think first, then look.", "qwen3", json!({}));
    t.client_id = Some("other-form".into());
    tasks.push(t);
    stand.env.submit(&tasks, "qwen3").await;
    let results = stand
        .env
        .wait_results("qwen3", tasks.len(), Duration::from_secs(300))
        .await;
    let mut formats = std::collections::BTreeSet::new();
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
        let run = run_output(r);
        assert_eq!(run["finish_reason"], "finished", "{run}");
        assert_token_exact(&stand, run);
        formats.insert(Stand::index(run["backend"].as_str().unwrap()));
        let client = r.client_id.as_deref().unwrap();
        let drift = &run["drift"];
        let prompt_len = run["prompt_ids"].as_array().unwrap().len();
        let turn_start = |t: usize| prompt_len + count(&run["turns"][t]["model_range"][0]);
        if client.starts_with("canonical") {
            assert_eq!(r.reward, Some(1.0), "{r:?}");
            // Two calls, two results, one merged user turn between the model's turns.
            let turns = run["turns"].as_array().unwrap();
            assert_eq!(turns.len(), 3);
            assert_eq!(turns[0]["tools"].as_array().unwrap().len(), 2);
            let obs = [
                count(&turns[0]["observation_range"][0]),
                count(&turns[0]["observation_range"][1]),
            ];
            let text = stand
                .model
                .tokenizer
                .decode(&ids(&run["response_ids"])[obs[0]..obs[1]])
                .unwrap();
            assert_eq!(text.matches("<|im_start|>user").count(), 1, "{text:?}");
            assert_eq!(text.matches("<tool_response>").count(), 2, "{text:?}");
            assert_eq!(drift["identical"], true, "{drift}");
        } else if client == "thinking-off" {
            assert_eq!(drift["identical"], false, "{drift}");
            // The first turn's opening (prompt, mask 0) is where a re-render differs.
            let first = count(&drift["first_difference"]);
            assert!(first <= turn_start(0), "{first} after {}", turn_start(0));
            assert!(first >= prompt_len - 8, "{first} vs prompt {prompt_len}");
        } else {
            // `</think>` followed by one newline where the template writes two.
            assert_eq!(drift["identical"], false, "{drift}");
            let first = count(&drift["first_difference"]);
            assert!(
                (turn_start(0)..turn_start(1)).contains(&first),
                "{first} outside turn 0"
            );
        }
    }
    assert_eq!(formats.len(), 2, "both wire formats served");
}

/// A turn that ends on another of the model's stop tokens (listed in its
/// `generation_config.json`, sent as `stop_token_ids`) is a complete turn: the
/// observation follows it directly, with no end-of-turn token inserted. Each turn and
/// the trajectory say which logprobs they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ending_on_another_stop_token_is_complete() {
    let stand = Stand::start(&[WireKind::Vllm, WireKind::Sglang], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let endoftext = stand.model.tokenizer.token_id("<|endoftext|>").unwrap();
    let tasks: Vec<Task> = (0..4)
        .map(|i| {
            let mut t = task("Stop on another token, then finish.", "eom", json!({}));
            t.client_id = Some(format!("eom-{i}"));
            t
        })
        .collect();
    stand.env.submit(&tasks, "eom").await;
    let results = stand
        .env
        .wait_results("eom", tasks.len(), Duration::from_secs(120))
        .await;
    let mut modes = std::collections::BTreeSet::new();
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
        let run = run_output(r);
        assert_eq!(run["finish_reason"], "finished", "{run}");
        assert_token_exact(&stand, run);
        let response = ids(&run["response_ids"]);
        let turn0 = &run["turns"][0];
        let end = count(&turn0["model_range"][1]);
        assert_eq!(
            response[end - 1],
            endoftext,
            "the turn ends on the stop token"
        );
        assert_eq!(turn0["generation_finish"], "stop");
        let obs_end = count(&turn0["observation_range"][1]);
        let obs = stand
            .model
            .tokenizer
            .decode(&response[end..obs_end])
            .unwrap();
        assert!(obs.starts_with("\n<|im_start|>user"), "{obs:?}");
        let mode = run["logprobs_mode"].as_str().unwrap().to_string();
        let backend = run["backend"].as_str().unwrap();
        let want = match stand.kinds[Stand::index(backend)] {
            WireKind::Vllm => "raw",
            WireKind::Sglang => "processed",
        };
        assert_eq!(mode, want, "{backend}");
        assert_eq!(turn0["logprobs_mode"], want);
        modes.insert(mode);
    }
    assert_eq!(modes.len(), 2, "both kinds served: {modes:?}");
}

/// A template that fails on one observation mid-episode (after its glue was built)
/// fails the job with the partial trajectory, not with nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_failing_mid_episode_keeps_the_partial_trajectory() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let r = stand
        .run_one(task("Trip the template.", "picky", json!({})), "picky")
        .await;
    assert_eq!(r.status, Status::Failed, "{r:?}");
    let error = r.error.as_deref().unwrap();
    assert!(
        error.contains("turn 1") && error.contains("this template refuses FORBIDDEN"),
        "{error}"
    );
    let run = run_output(&r);
    let turns = run["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{run}");
    assert_eq!(turns[0]["tools"][0]["observation"], "FORBIDDEN\n");
    assert_token_exact(&stand, run);
}

/// Waits until `pred` holds of a server's counters (panics after 30 s).
pub(crate) async fn wait_stats(
    server: &ScriptedServer,
    what: &str,
    pred: impl Fn(&rollout::scripted::Stats) -> bool,
) {
    let what = format!("the server {what}");
    let pred = &pred;
    eventually(&what, Duration::from_secs(30), || async move {
        let stats = server.stats();
        if pred(&stats) { Ok(()) } else { Err(stats) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_mid_episode_hands_the_job_to_another() {
    let mut stand = Stand::start(&[WireKind::Vllm, WireKind::Sglang], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let ids = stand
        .env
        .submit(
            &[task("Take your time, then finish.", "demo", json!({}))],
            "kill",
        )
        .await;
    // The first turn (a two-second command) is under way: kill the backend serving it.
    let servers = &stand.servers;
    let victim = eventually(
        "a backend served the first turn",
        Duration::from_secs(30),
        || async move {
            servers
                .iter()
                .position(|s| s.as_ref().unwrap().stats().requests == 1)
                .ok_or("no request yet")
        },
    )
    .await;
    stand.servers[victim].take().unwrap().stop().await;
    let results = stand
        .env
        .wait_results("kill", 1, Duration::from_secs(120))
        .await;
    let r = &results[0];
    assert_eq!(r.status, Status::Done, "{r:?}");
    let run = run_output(r);
    assert_eq!(run["finish_reason"], "finished");
    let switches = run["backend_switches"].as_array().unwrap();
    assert_eq!(switches.len(), 1, "{run}");
    assert_eq!(switches[0]["from"], format!("demo-{victim}"));
    assert_eq!(switches[0]["to"], format!("demo-{}", 1 - victim));
    assert_eq!(switches[0]["turn"], 1);
    // Turns before and after the move, each token-exact; the conversation intact.
    let turns = run["turns"].as_array().unwrap();
    assert_eq!(turns[0]["backend"], format!("demo-{victim}"));
    assert_eq!(turns[1]["backend"], format!("demo-{}", 1 - victim));
    assert_eq!(run["drift"]["identical"], true);
    let view = stand.env.client.job(&ids[0]).await.unwrap();
    assert!(
        view.events.iter().any(|e| e.event == "backend_switch"),
        "{:?}",
        view.events
    );
    // The dead backend is marked down; counts are back to zero.
    let backends = stand.env.client.backends().await.unwrap();
    let dead = backends
        .iter()
        .find(|b| b.spec.id == format!("demo-{victim}"))
        .unwrap();
    assert!(!dead.healthy);
    assert!(backends.iter().all(|b| b.active == 0), "{backends:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_times_out_and_is_retried() {
    let stand = Stand::start(
        &[WireKind::Sglang],
        |s| s.pool.request_timeout_ms = 1_000,
        |_, _| {},
    )
    .await;
    stand.servers[0].as_ref().unwrap().control(Control {
        mode: FaultMode::Stall,
        count: Some(1),
    });
    stand.env.workers_in_process(1);
    let result = stand
        .run_one(task("Quick fix, then finish.", "demo", json!({})), "stall")
        .await;
    assert_eq!(result.status, Status::Done, "{result:?}");
    let run = run_output(&result);
    assert!(run["backend_switches"].as_array().unwrap().is_empty());
    let stats = stand.servers[0].as_ref().unwrap().stats();
    assert_eq!(stats.faulted, 1, "{stats:?}");
    let turns = run["turns"].as_array().unwrap();
    assert_eq!(usize::try_from(stats.requests).unwrap(), turns.len());
    // The stalled attempt's second is in the first turn's backend time.
    assert!(turns[0]["backend_wait_us"].as_u64().unwrap() >= 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_generation_closes_the_request_and_the_sandbox() {
    // 50 ms a token: the essay's turn takes seconds.
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, c| c.token_us = 50_000).await;
    stand.env.workers_in_process(1);
    let ids = stand
        .env
        .submit(&[task("Write an essay.", "demo", json!({}))], "cancel")
        .await;
    let server = stand.servers[0].as_ref().unwrap();
    wait_stats(server, "received the request", |s| s.in_flight == 1).await;
    let root = stand.env.deps.settings.sandbox_root();
    assert!(root.join(&ids[0]).exists(), "the job's sandbox is up");
    stand.env.client.cancel(&ids[0]).await.unwrap();
    let results = stand
        .env
        .wait_results("cancel", 1, Duration::from_secs(60))
        .await;
    assert_eq!(results[0].status, Status::Cancelled);
    // The worker dropped the request: the server saw its client go away before the
    // answer was ready.
    wait_stats(server, "saw the request closed", |s| {
        s.aborted == 1 && s.in_flight == 0
    })
    .await;
    assert_eq!(server.stats().requests, 0);
    // The sandbox went with the stage, and the assignment with the job.
    wait_gone(&root.join(&ids[0]), Duration::from_secs(15)).await;
    let backends = stand.env.client.backends().await.unwrap();
    assert!(backends.iter().all(|b| b.active == 0), "{backends:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_batch_early_cancel_closes_generating_requests_and_removes_sandboxes() {
    // 30 ms a token: the long essay takes many seconds to generate.
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, c| c.token_us = 30_000).await;
    // No EVAL workers yet: no sample can be scored, so the batch cannot end, until the
    // agent prompts are where the test needs them. Timing alone raced on a loaded machine.
    stand.env.stage_workers_in_process(Stage::Init, 1);
    stand.env.stage_workers_in_process(Stage::Run, 1);
    // Two agent prompts that outlast the batch: one still generating, one asleep in a
    // tool call in its sandbox. Then synthetic prompts that pass half the time, so the
    // first informative group (K = 1) comes while those two are busy.
    let mut prompts = vec![
        task("Write a long essay.", "demo", json!({})),
        task("Sit in the sandbox.", "demo", json!({})),
    ];
    prompts
        .extend((0..30).map(|_| Task::new("synthetic", json!({"init_ms": 500, "pass_rate": 0.5}))));
    let request = rollout::api::batches::BatchRequest {
        batch_id: Some("early".into()),
        prompts,
        group_size: 2,
        target_groups: 1,
        max_groups_in_flight: Some(4),
        max_groups: None,
        informative: Default::default(),
        policy_version: None,
        max_staleness: None,
        on_cancel: Default::default(),
        carry_from: None,
    };
    let client = &stand.env.client;
    client.submit_sampling(&request).await.unwrap();
    // Both sleeping tool calls start and both essays generate; then scoring begins.
    eventually(
        "both sleeping tool calls started",
        Duration::from_secs(120),
        || async {
            let n = processes_running("sleep 117");
            holds(n == 2, n)
        },
    )
    .await;
    let server = stand.servers[0].as_ref().unwrap();
    wait_stats(server, "both essays generating", |s| s.in_flight == 2).await;
    stand.env.stage_workers_in_process(Stage::Eval, 1);
    let view = eventually(
        "the batch completed",
        Duration::from_secs(120),
        || async move {
            let view = client.sampling_batch("early").await.unwrap();
            if view.batch.status.is_final() {
                Ok(view)
            } else {
                Err(view.batch.counters)
            }
        },
    )
    .await;
    assert_eq!(
        view.batch.status,
        SamplingStatus::Complete,
        "{:?}",
        view.batch
    );
    let agents: Vec<Job> = client
        .batch_jobs("early")
        .await
        .unwrap()
        .into_iter()
        .filter(|j| j.kind == "agent")
        .collect();
    assert_eq!(agents.len(), 4, "both agent groups launched");
    // Both essays were generating: the server saw their requests closed.
    wait_stats(server, "saw both essays closed", |s| {
        s.aborted == 2 && s.in_flight == 0
    })
    .await;
    let root = stand.env.deps.settings.sandbox_root();
    for job in &agents {
        let result = eventually(
            "the agent job ended",
            Duration::from_secs(30),
            || async move {
                let view = client.job(&job.id).await.unwrap();
                view.result.ok_or(view.job.status)
            },
        )
        .await;
        assert_eq!(result.status, Status::Cancelled, "{result:?}");
        let job = client.job(&job.id).await.unwrap().job;
        assert!(job.timings.eval.started_at.is_none(), "EVAL ran: {job:?}");
        // The sandbox went with the cancel, and every process in it.
        wait_gone(&root.join(&job.id), Duration::from_secs(15)).await;
    }
    eventually(
        "the sleeping tool call was killed",
        Duration::from_secs(15),
        || async { holds(processes_running("sleep 117") == 0, "still running") },
    )
    .await;
    let backends = client.backends().await.unwrap();
    assert!(backends.iter().all(|b| b.active == 0), "{backends:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agent_jobs_on_two_backends() {
    let stand = Stand::start(
        &[WireKind::Vllm, WireKind::Sglang],
        |s| {
            s.stages.init.concurrency = 8;
            s.stages.run.concurrency = 16;
            s.stages.eval.concurrency = 8;
        },
        |_, _| {},
    )
    .await;
    stand.env.workers_in_process(1);
    let tasks: Vec<Task> = (0..200usize)
        .map(|i| {
            let mut t = task("Quick fix, then finish.", "demo", json!({}));
            t.group_id = Some(format!("g{}", i / 8));
            t.client_id = Some(format!("job-{i}"));
            t
        })
        .collect();
    stand.env.submit(&tasks, "many").await;
    let results = stand
        .env
        .wait_results("many", 200, Duration::from_secs(900))
        .await;
    // Every job done, exactly once.
    let mut seen = std::collections::BTreeSet::new();
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
        assert!(seen.insert(r.job_id.clone()), "{} reported twice", r.job_id);
        let run = run_output(r);
        assert_eq!(run["finish_reason"], "finished");
        assert_eq!(run["drift"]["identical"], true);
    }
    assert_eq!(seen.len(), 200);
    let rewarded = results.iter().filter(|r| r.reward == Some(1.0)).count();
    assert!(rewarded > 0 && rewarded < 200, "{rewarded} of 200 rewarded");
    let batch = stand.env.client.status(Some("many")).await.unwrap();
    assert_eq!(batch.batch.unwrap().done, 200);
    // Both backends worked, and every assignment was released.
    let backends = stand.env.client.backends().await.unwrap();
    assert!(backends.iter().all(|b| b.active == 0), "{backends:?}");
    for s in &stand.servers {
        assert!(s.as_ref().unwrap().stats().requests > 0);
    }
    let _ = &stand.model;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_episode_with_no_backend_left_fails_with_its_partial_trajectory() {
    let mut stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    stand
        .env
        .submit(
            &[task("Take your time, then finish.", "demo", json!({}))],
            "lost",
        )
        .await;
    wait_stats(
        stand.servers[0].as_ref().unwrap(),
        "served the first turn",
        |s| s.requests == 1,
    )
    .await;
    stand.servers[0].take().unwrap().stop().await;
    let results = stand
        .env
        .wait_results("lost", 1, Duration::from_secs(120))
        .await;
    let r = &results[0];
    assert_eq!(r.status, Status::Failed, "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap()
            .contains("no other healthy backend"),
        "{r:?}"
    );
    // What the episode did before it lost its backend is in the result.
    let run = run_output(r);
    let turns = run["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "{run}");
    assert!(
        turns[0]["tools"][0]["observation"]
            .as_str()
            .unwrap()
            .contains("slept")
    );
    assert_eq!(
        run["loss_mask"].as_array().unwrap().len(),
        run["response_ids"].as_array().unwrap().len()
    );
    let backends = stand.env.client.backends().await.unwrap();
    assert!(backends.iter().all(|b| b.active == 0), "{backends:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_agent_tasks_are_refused_and_unknown_models_fail_clearly() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    // Refused at submit, naming the field.
    let http = reqwest::Client::new();
    for (extra, field) in [
        (
            json!({"tools": ["bash", "browser"]}),
            "tasks[0].spec.tools[1]",
        ),
        (json!({"parser": "xml"}), "tasks[0].spec.parser"),
        (
            json!({"limits": {"max_turns": 0}}),
            "tasks[0].spec.limits.max_turns",
        ),
        (json!({"messages": []}), "tasks[0].spec.messages"),
        (
            json!({"limits": {"max_refused_calls": 3}}),
            "tasks[0].spec.limits.max_refused_calls",
        ),
        (
            json!({"sampling": {"max_tokens": 0}}),
            "tasks[0].spec.sampling.max_tokens",
        ),
        (
            json!({"sampling": {"temprature": 1.0}}),
            "tasks[0].spec.sampling",
        ),
    ] {
        let t = task("Quick fix, then finish.", "demo", extra.clone());
        let resp = http
            .post(format!("{}/v1/jobs", stand.env.base))
            .json(&json!({"tasks": [t]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{extra}");
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["field"].as_str().unwrap().starts_with(field),
            "{extra}: {body}"
        );
    }
    // A model no backend serves: the job fails and says what to do.
    let result = stand
        .run_one(
            task("Quick fix, then finish.", "gpt-9", json!({})),
            "nomodel",
        )
        .await;
    assert_eq!(result.status, Status::Failed);
    let error = result.error.as_deref().unwrap();
    assert!(
        error.contains("no inference backend is registered for model `gpt-9`")
            && error.contains("rollout backends add"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_probe_marks_backends_down_and_up() {
    let stand = Stand::start(
        &[WireKind::Vllm],
        |s| s.pool.health_interval_ms = 100,
        |_, _| {},
    )
    .await;
    let server = stand.servers[0].as_ref().unwrap();
    let healthy = |want: bool| {
        let client = stand.env.client.clone();
        async move {
            let what = format!("every backend probed with healthy = {want}");
            eventually(&what, Duration::from_secs(6), || async {
                let list = client.backends().await.unwrap();
                if list
                    .iter()
                    .all(|b| b.healthy == want && b.checked_at.is_some())
                {
                    Ok(list)
                } else {
                    Err(list)
                }
            })
            .await
        }
    };
    healthy(true).await;
    server.control(Control {
        mode: FaultMode::Down,
        count: None,
    });
    let down = healthy(false).await;
    assert!(
        down[0].last_error.as_deref().unwrap().contains("503"),
        "{down:?}"
    );
    server.control(Control {
        mode: FaultMode::Ok,
        count: None,
    });
    healthy(true).await;
    let text = reqwest::get(format!("{}/metrics", stand.env.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("rollout_backend_healthy{backend=\"demo-0\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_policy_versions_tag_the_tokens_of_episodes_that_follow() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    let client = &stand.env.client;
    stand.env.workers_in_process(1);
    // Before any announcement: no version, and episodes carry none.
    assert!(client.policy().await.unwrap().current.is_none());
    let first = stand
        .run_one(
            task("Fix add() in calc/add.py, then finish.", "demo", json!({})),
            "pv-0",
        )
        .await;
    assert!(
        run_output(&first).get("policy_versions").is_none(),
        "{}",
        run_output(&first)
    );

    let announced = client.announce_policy(7).await.unwrap();
    assert_eq!(announced.current.unwrap().version, 7);
    assert_eq!(announced.changed, Some(true));
    assert_eq!(
        client.announce_policy(7).await.unwrap().changed,
        Some(false)
    );
    let seen = client.policy().await.unwrap();
    assert_eq!(seen.current.map(|p| p.version), Some(7));
    let recent: Vec<i64> = seen.recent.iter().map(|p| p.version).collect();
    assert_eq!(recent, [7]);
    // Versions only move forward: an older one is refused with the field named.
    let (status, body) = json_answer(
        reqwest::Client::new()
            .post(format!("{}/v1/policy", stand.env.base))
            .json(&json!({"version": 6})),
        "an older version",
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (409, Some("version")),
        "{body}"
    );
    let (status, body) = json_answer(
        reqwest::Client::new()
            .post(format!("{}/v1/policy", stand.env.base))
            .json(&json!({"version": "8"})),
        "a version that is not a number",
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("version")),
        "{body}"
    );

    // The RUN workers hear of it (by broadcast, or their next read of the database):
    // an episode that starts after that has every model token tagged 7.
    let stand_ref = &stand;
    let mut n = 0;
    let run = eventually(
        "an episode tagged with version 7",
        Duration::from_secs(60),
        move || {
            n += 1;
            let batch = format!("pv-{n}");
            async move {
                let task = task("Fix add() in calc/add.py, then finish.", "demo", json!({}));
                let r = stand_ref.run_one(task, &batch).await;
                let run = run_output(&r).clone();
                if run.get("policy_versions").is_some() {
                    Ok(run)
                } else {
                    Err(run)
                }
            }
        },
    )
    .await;
    assert_eq!(
        (
            run["policy_version_oldest"].as_i64(),
            run["policy_version_newest"].as_i64()
        ),
        (Some(7), Some(7))
    );
    let spans: Vec<rollout::domain::policy::VersionSpan> =
        serde_json::from_value(run["policy_versions"].clone()).unwrap();
    assert_eq!(spans.len(), 1, "{run}");
    assert_eq!(spans[0].version, 7);
    let mask = ids(&run["loss_mask"]);
    let (from, to) = (spans[0].from, spans[0].to);
    for (i, m) in mask.iter().enumerate() {
        if *m == 1 {
            assert!(
                (from..to).contains(&i),
                "model token {i} outside the span {from}..{to}"
            );
        }
    }
    for turn in run["turns"].as_array().unwrap() {
        assert_eq!(turn["policy_version"], 7, "{turn}");
    }
    assert_token_exact(&stand, &run);
}
