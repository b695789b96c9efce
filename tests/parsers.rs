//! Tool-call parsers against vLLM's own: each argument body below is read by rollout's
//! parser (inside a whole call, as a model writes it) and by vLLM 0.32's argument
//! converter for that family (`tests/fixtures/parsers/vllm_arguments.py`, run with the
//! python of the real-vLLM environment the test command makes, `ROLLOUT_VLLM_PYTHON`),
//! and the arguments must be the same. The bodies are the shapes models write and the
//! edges where a hand-written parser drifts: newlines kept or trimmed, a parameter the
//! model did not close, spaces around names, markup inside values, empty values.

use std::path::{Path, PathBuf};

use rollout::agent::parse::{parse_glm45, parse_qwen3_coder};
use rollout_test_support::prerequisite;
use serde_json::{Value, json};

/// vLLM's arguments for each `(family, body)`, or its error.
fn vllm(python: &Path, cases: &[(&str, String)]) -> Vec<Result<Value, String>> {
    let input: Vec<Value> = cases
        .iter()
        .map(|(family, body)| json!({"family": family, "body": body}))
        .collect();
    rollout_test_support::reference::run_json(
        python,
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/parsers/vllm_arguments.py"
        )),
        &input,
        "vLLM's parsers, in the real-vLLM environment",
    )
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

#[test]
fn argument_bodies_read_as_vllm_reads_them() {
    let Some(python) = std::env::var_os("ROLLOUT_VLLM_PYTHON").map(PathBuf::from) else {
        prerequisite::missing(
            "parsers",
            "ROLLOUT_VLLM_PYTHON is not set: run `export ROLLOUT_VLLM_PYTHON=$(scripts/real-vllm-env.sh)` first (the test command does)",
        );
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
