//! Tool-call parsers against vLLM's own: each argument body below is read by rollout's
//! parser (inside a whole call, as a model writes it) and by vLLM 0.32's argument
//! converter for that family (`tests/fixtures/parsers/vllm_arguments.py`, run with the
//! python of the real-vLLM environment the test command makes, `ROLLOUT_VLLM_PYTHON`),
//! and the arguments must be the same. The bodies are the shapes models write and the
//! edges where a hand-written parser drifts: newlines kept or trimmed, a parameter the
//! model did not close, spaces around names, markup inside values, empty values.
//!
//! Whole turns are compared the same way (Kimi-K2's sections, Mistral's `[TOOL_CALLS]`
//! in both its shapes, DeepSeek's sections in V3's and V3.1's shapes, Llama 3's JSON
//! calls and the pythonic lists) (`tests/fixtures/parsers/vllm_tool_calls.py`): the calls' names, arguments
//! and (Kimi-K2's) ids, and the content, must be the same, and a turn one side takes
//! no call from the other must not either.
//!
//! gpt-oss's harmony turns are read by vLLM's own harmony parser, fed the token IDs
//! openai-harmony's encoding makes of them (`tests/fixtures/parsers/vllm_harmony.py`,
//! its vocabulary from `ROLLOUT_O200K_DIR`, which the test command makes with
//! scripts/o200k-env.sh): the reasoning, the content and the calls must be the same.

use std::path::{Path, PathBuf};

use rollout::agent::parse::{
    parse_deepseek_r1, parse_glm45, parse_gpt_oss, parse_kimi_k2, parse_llama3_json, parse_mistral,
    parse_pythonic, parse_qwen3_coder,
};
use rollout_test_support::prerequisite;
use serde_json::{Value, json};

/// The answers of `script` (in tests/fixtures/parsers/, run with the real-vLLM
/// environment's `python`) to `cases`.
fn vllm_script(python: &Path, script: &str, cases: &[Value]) -> Vec<Value> {
    rollout_test_support::reference::run_json(
        python,
        &Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/parsers/"
        ))
        .join(script),
        cases,
        "vLLM's parsers, in the real-vLLM environment",
    )
}

/// vLLM's arguments for each `(family, body)`, or its error.
fn vllm(python: &Path, cases: &[(&str, String)]) -> Vec<Result<Value, String>> {
    let input: Vec<Value> = cases
        .iter()
        .map(|(family, body)| json!({"family": family, "body": body}))
        .collect();
    vllm_script(python, "vllm_arguments.py", &input)
        .into_iter()
        .map(|r| match r.get("arguments") {
            Some(a) => Ok(a.clone()),
            None => Err(r["error"].as_str().unwrap_or_default().to_string()),
        })
        .collect()
}

/// rollout's arguments for `body`, read in a whole call of `family`.
fn ours(family: &str, body: &str) -> Result<Value, String> {
    let (text, turn) = match family {
        "qwen3_coder" => {
            let text = format!("<tool_call>\n<function=f>\n{body}</function>\n</tool_call>");
            let turn = parse_qwen3_coder(&text, false);
            (text, turn)
        }
        _ => {
            let text = format!("<tool_call>f{body}</tool_call>");
            let turn = parse_glm45(&text, false);
            (text, turn)
        }
    };
    match turn.calls.first() {
        Some(Ok(c)) => Ok(c.arguments.clone()),
        Some(Err(e)) => Err(e.message.clone()),
        None => Err(format!("no call in {text:?}")),
    }
}

/// The python of the real-vLLM environment, or `None` when it is not set (the test then
/// says so, and fails under CI).
fn vllm_python() -> Option<PathBuf> {
    let python = std::env::var_os("ROLLOUT_VLLM_PYTHON").map(PathBuf::from);
    if python.is_none() {
        prerequisite::missing(
            "parsers",
            "ROLLOUT_VLLM_PYTHON is not set: run `export ROLLOUT_VLLM_PYTHON=$(scripts/real-vllm-env.sh)` first (the test command does)",
        );
    }
    python
}

#[test]
fn argument_bodies_read_as_vllm_reads_them() {
    let Some(python) = vllm_python() else {
        return;
    };
    let qwen = [
        "<parameter=command>\nls -la\n</parameter>\n",
        "<parameter=path>\na.py\n</parameter>\n<parameter=content>\ndef f():\n    return '<b>'\n\n</parameter>\n",
        "<parameter=a>\n1\n<parameter=b>\ntwo\n</parameter>\n",
        "<parameter=k>no newlines</parameter>",
        "<parameter=k>\n\nkeep one each side\n\n</parameter>\n",
        "<parameter=empty>\n</parameter>\n",
        "<parameter=k>\nx\n</parameter>\n<parameter=k>\ny\n</parameter>\n",
        "<parameter=json>\n{\"a\": [1, 2]}\n</parameter>\n",
        "<parameter=unclosed>\nstill going\n",
    ];
    let glm = [
        "\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n",
        "<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value> two </arg_value>",
        "\n<arg_key> spaced </arg_key>\n<arg_value>\nmulti\nline\n</arg_value>\n",
        "<arg_key>empty</arg_key><arg_value></arg_value>",
        "<arg_key>html</arg_key><arg_value><b>bold</b></arg_value>",
        "",
    ];
    let cases: Vec<(&str, String)> = qwen
        .iter()
        .map(|b| ("qwen3_coder", b.to_string()))
        .chain(glm.iter().map(|b| ("glm45", b.to_string())))
        .collect();
    let theirs = vllm(&python, &cases);
    let bad = rollout_test_support::reference::disagreements(
        cases
            .iter()
            .zip(theirs)
            .map(|((family, body), want)| (format!("{family} {body:?}"), ours(family, body), want)),
        "vLLM",
    );
    assert!(
        bad.is_empty(),
        "{} of {} bodies read otherwise than vLLM reads them:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

/// vLLM's reading of each `(parser, turn)`: the calls and content, or that it took none.
fn vllm_turns(python: &Path, cases: &[(&str, String)]) -> Vec<Result<Value, String>> {
    let input: Vec<Value> = cases
        .iter()
        .map(|(parser, text)| json!({"parser": parser, "text": text}))
        .collect();
    vllm_script(python, "vllm_tool_calls.py", &input)
        .into_iter()
        .map(|r| match r.get("calls") {
            Some(_) => Ok(r),
            None => Err(r["error"].as_str().unwrap_or_default().to_string()),
        })
        .collect()
}

/// rollout's reading of a turn, in the script's shape: a turn with a call it could not
/// read, or with none, took no call (vLLM then runs none either, or runs something
/// else: a disagreement).
fn our_turn(parser: &str, text: &str) -> Result<Value, String> {
    let turn = match parser {
        "kimi_k2" => parse_kimi_k2(text, false),
        // One parser here reads both of DeepSeek's shapes.
        "deepseek_v3" | "deepseek_v31" => parse_deepseek_r1(text, false),
        "llama3_json" => parse_llama3_json(text, false),
        "pythonic" => parse_pythonic(text, false),
        _ => parse_mistral(text, false),
    };
    if turn.calls.is_empty() {
        return Err("no tool call".into());
    }
    let mut calls = Vec::new();
    for call in &turn.calls {
        let call = call.as_ref().map_err(|e| e.message.clone())?;
        let mut one = json!({"name": call.name, "arguments": call.arguments});
        if parser == "kimi_k2" {
            one["id"] = json!(call.id);
        }
        calls.push(one);
    }
    Ok(json!({"calls": calls, "content": turn.content}))
}

/// The turns compared: each parser's shapes as models write them, edges included, and
/// turns with no call.
fn whole_turn_cases() -> Vec<(&'static str, String)> {
    let kimi = |calls: &[(&str, &str)]| {
        let mut s = "<|tool_calls_section_begin|>".to_string();
        for (id, args) in calls {
            s += &format!(
                "<|tool_call_begin|>{id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
            );
        }
        s + "<|tool_calls_section_end|>"
    };
    let mut cases: Vec<(&'static str, String)> = [
        format!(
            "Let me look.{}",
            kimi(&[("functions.bash:0", r#"{"command": "ls"}"#)])
        ),
        kimi(&[
            ("functions.bash:1", r#"{"command":"pwd"}"#),
            (
                " functions.read_file:2\n",
                r#"{"path": "a.py", "lines": [1, 2]}"#,
            ),
        ]),
        kimi(&[("functions.list_tools:3", "")]),
        kimi(&[(
            "functions.mcp.fs.read:4",
            r#"{"path": "ü/日本.txt", "nested": {"a": null}}"#,
        )]),
        format!(
            "{}\n",
            kimi(&[("functions.bash:5", "  {\"command\": \"id\"}  ")])
        ),
        "No call here: functions.bash:0 {\"command\": \"ls\"}".into(),
    ]
    .into_iter()
    .map(|t| ("kimi_k2", t))
    .collect();
    cases.extend(
        [
            r#"I will.[TOOL_CALLS]bash[ARGS]{"command": "ls"}[TOOL_CALLS]pwd[ARGS]{}"#,
            r#"[TOOL_CALLS]bash{"command": "ls -la"}"#,
            r#"[TOOL_CALLS]write[ARGS]{"path": "ü.txt", "text": "a\nb", "n": [1, 2.5]}"#,
            "Just an answer.",
        ]
        .map(|t| ("mistral", t.to_string())),
    );
    cases.extend(
        [
            r#"[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}}]"#,
            r#"Let me see. [TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls"}, "id": "a1b2c3d4e"}, {"name": "python", "arguments": "{\"code\": \"1\"}"}]"#,
            r#"[TOOL_CALLS]{"name": "pwd", "arguments": {}}"#,
            r#"[TOOL_CALLS] [{"name": "list_tools"}]"#,
            "Just an answer.",
        ]
        .map(|t| ("mistral_pre_v11", t.to_string())),
    );
    cases.extend(more_turn_cases());
    cases
}

/// DeepSeek's, Llama 3's and the pythonic turns of [`whole_turn_cases`].
fn more_turn_cases() -> Vec<(&'static str, String)> {
    let mut cases = Vec::new();
    let r1 = |calls: &[(&str, &str)]| {
        let mut s = "<｜tool▁calls▁begin｜>".to_string();
        for (name, args) in calls {
            s += &format!(
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"
            );
        }
        s + "<｜tool▁calls▁end｜>"
    };
    let v31 = |calls: &[(&str, &str)]| {
        let mut s = "<｜tool▁calls▁begin｜>".to_string();
        for (name, args) in calls {
            s += &format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>");
        }
        s + "<｜tool▁calls▁end｜>"
    };
    cases.extend(
        [
            format!("Let me look.{}", r1(&[("bash", r#"{"command": "ls"}"#)])),
            r1(&[
                ("bash", r#"{"command": "pwd"}"#),
                ("read_file", r#"{"path": "ü/a.py", "lines": [1, 2]}"#),
            ]),
        ]
        .map(|t| ("deepseek_v3", t)),
    );
    cases.extend(
        [
            format!("Ok.{}", v31(&[("bash", r#"{"command": "ls"}"#)])),
            v31(&[
                ("bash", r#"{"command":"pwd"}"#),
                ("finish", r#"{"answer": "done"}"#),
            ]),
        ]
        .map(|t| ("deepseek_v31", t)),
    );
    cases.extend(
        [
            r#"<|python_tag|>{"name": "bash", "parameters": {"command": "ls"}}"#,
            r#"{"name": "bash", "arguments": {"command": "ls -la"}}"#,
            r#"{"name": "bash", "parameters": {"command": "pwd"}}; {"name": "finish", "parameters": {"answer": "a {b}"}}"#,
            "No call here.",
        ]
        .map(|t| ("llama3_json", t.to_string())),
    );
    cases.extend(
        [
            r#"[bash(command="ls")]"#,
            r#"[bash(command="pwd"), finish(answer='it\'s done')]"#,
            r#"[write(path="a.py", lines=[1, 2], opts={"x": True, "y": None})]"#,
            "Just an answer.",
        ]
        .map(|t| ("pythonic", t.to_string())),
    );
    cases
}

#[test]
fn whole_turns_read_as_vllm_reads_them() {
    let Some(python) = vllm_python() else {
        return;
    };
    let cases = whole_turn_cases();
    let theirs = vllm_turns(&python, &cases);
    let bad = rollout_test_support::reference::disagreements(
        cases.iter().zip(theirs).map(|((parser, text), want)| {
            (format!("{parser} {text:?}"), our_turn(parser, text), want)
        }),
        "vLLM",
    );
    assert!(
        bad.is_empty(),
        "{} of {} turns read otherwise than vLLM reads them:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn harmony_turns_read_as_vllm_reads_them() {
    let Some(python) = vllm_python() else {
        return;
    };
    if std::env::var_os("ROLLOUT_O200K_DIR").is_none() {
        prerequisite::missing(
            "parsers",
            "ROLLOUT_O200K_DIR is not set: run `export ROLLOUT_O200K_DIR=$(scripts/o200k-env.sh)` first (the test command does)",
        );
        return;
    }
    let m = |header: &str, body: &str| format!("{header}<|message|>{body}");
    let next = "<|end|><|start|>assistant";
    let cases: Vec<String> = vec![
        // Reasoning, then a call with the recipient after the channel (as harmony's
        // encoder writes it) and the constraint token.
        format!(
            "{}{next}{}",
            m("<|channel|>analysis", "Need to list the files."),
            m(
                "<|channel|>commentary to=functions.bash <|constrain|>json",
                r#"{"command": "ls -la"}"#
            )
        ),
        // A preamble, then the recipient before the channel (as the chat template
        // writes it).
        format!(
            "{}{next} to=functions.read_file{}",
            m("<|channel|>commentary", "Let me read it."),
            m(
                "<|channel|>commentary json",
                r#"{"path": "ü/a.py", "lines": [1, 2]}"#
            )
        ),
        // Reasoning, then the answer.
        format!(
            "{}{next}{}",
            m("<|channel|>analysis", "All\ndone."),
            m("<|channel|>final", "Two files:\n- a.py\n- b.py")
        ),
        // An answer alone, and two calls in one turn.
        m("<|channel|>final", "42"),
        format!(
            "{}{next}{}",
            m(
                "<|channel|>commentary to=functions.bash json",
                r#"{"command":"pwd"}"#
            ),
            m(
                "<|channel|>commentary to=functions.bash json",
                r#"{"command":"id"}"#
            )
        ),
    ];
    let input: Vec<Value> = cases.iter().map(|c| json!(c)).collect();
    let theirs = vllm_script(&python, "vllm_harmony.py", &input);
    let bad = rollout_test_support::reference::disagreements(
        cases.iter().zip(theirs).map(|(text, want)| {
            let turn = parse_gpt_oss(text);
            let ours = turn
                .calls
                .iter()
                .map(|c| {
                    c.as_ref()
                        .map(|c| json!({"name": c.name, "arguments": c.arguments}))
                        .map_err(|e| e.message.clone())
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|calls| json!({"reasoning": turn.reasoning, "content": turn.content, "calls": calls}));
            (format!("{text:?}"), ours, Ok(want))
        }),
        "vLLM",
    );
    assert!(
        bad.is_empty(),
        "{} of {} turns read otherwise than vLLM reads them:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}
