//! The OpenAPI document against the API itself: schemathesis (installed by
//! `scripts/test.sh`) generates requests from the document served by a live gateway and
//! checks every answer: no 5xx, no undocumented status, every response valid against its
//! schema, every request the schema forbids refused, and every request it allows
//! accepted.
//!
//! Three narrow exceptions, all said in the document: a task's `spec` is checked by its
//! kind (a 400 names the field), which no static schema states, so `POST /v1/jobs` is not
//! held to "every allowed request accepted"; `GET /v1/results/stream` is left out, since
//! an event stream never ends (its parameters are the long-poll's, tested there and in
//! `poison.rs`); and the policy's pause and resume may answer 502, as documented, when a
//! backend does not stop or resume (the backends schemathesis registers point nowhere).

use crate::helpers::TestEnv;

/// The schemathesis configuration for this run.
const CONFIG: &str = r#"
[[operations]]
include-path = "/v1/jobs"
include-method = "POST"
checks.positive_data_acceptance.enabled = false

[[operations]]
include-path = "/v1/policy"
include-method = "POST"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502"]

[[operations]]
include-path = "/v1/policy/{version}/resume"
include-method = "POST"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_as_its_document_says() {
    let found = std::process::Command::new("schemathesis")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        crate::prerequisite::missing(
            "openapi::the_api_answers_as_its_document_says",
            "schemathesis is not installed (scripts/test.sh installs it: pip install schemathesis)",
        );
        return;
    }
    // Long-polls answer quickly, so the run is bounded by examples, not waits.
    let env = TestEnv::start(|s| s.gateway.max_wait_ms = 200).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("schemathesis.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let base = env.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("schemathesis")
            .arg("--config-file")
            .arg(&config)
            .args(["run", &format!("{base}/openapi.json")])
            .args(["--max-examples", "20", "--seed", "1"])
            .args(["--exclude-path", "/v1/results/stream", "--no-color"])
            .args(["--request-timeout", "10"])
            .current_dir(dir.path())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It did test the operations (not zero by a bad filter).
    assert!(said.contains("Tested: 23"), "{said}");
}

/// The whole document as a gateway serves it, compared with the reviewed copy in
/// `snapshots/`: every change to the API (a field, a status, a parameter, a description)
/// shows up as a diff to review (`cargo insta review`, or `INSTA_UPDATE=always` to take
/// the new document) instead of slipping through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_reviewed_one() {
    let env = TestEnv::start(|_| {}).await;
    let doc: serde_json::Value = reqwest::get(format!("{}/openapi.json", env.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    insta::assert_snapshot!("openapi", serde_json::to_string_pretty(&doc).unwrap());
}

/// The patterns the document gives a backend's `model`, `tokenizer` and
/// `served_model_name` take exactly the values the API accepts: none with a NUL, none
/// blank (whitespace as the API counts it), judged by Python's `re`, as schemathesis
/// judges them. (`\S` took a lone NUL, which the API refuses.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_name_patterns_match_what_the_api_accepts() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        crate::prerequisite::missing(
            "openapi::backend_name_patterns_match_what_the_api_accepts",
            "python3 is not installed",
        );
        return;
    }
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let doc: serde_json::Value = reqwest::get(format!("{}/openapi.json", env.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let fields = &doc["components"]["schemas"]["BackendSpec"]["properties"];
    let values = [
        "m", "\0", "a\0", "\0a", " ", "\t\n", " a ", "\u{85}", "\u{a0}", "\u{3000}", "\u{feff}",
        "\u{1c}", "\u{200b}",
    ];
    let http = reqwest::Client::new();
    for field in ["model", "tokenizer", "served_model_name"] {
        let pattern = fields[field]["pattern"]
            .as_str()
            .unwrap_or_else(|| panic!("{field} has no pattern"));
        let script = "import json, re, sys\n\
                      p, vs = json.loads(sys.stdin.read())\n\
                      print(json.dumps([re.search(p, v) is not None for v in vs]))";
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        let input = serde_json::json!([pattern, values]).to_string();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let matched: Vec<bool> = serde_json::from_slice(&out.stdout).unwrap();
        for (i, (value, matched)) in values.iter().zip(matched).enumerate() {
            let mut spec = serde_json::json!({
                "id": format!("{field}-{i}"),
                "url": "http://127.0.0.1:9/v1",
                "kind": "vllm",
                "model": "m",
                "tokenizer": "/models/m",
            });
            spec[field] = serde_json::json!(value);
            let status = http
                .post(format!("{}/v1/backends", env.base))
                .json(&spec)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            let accepted = status == 201;
            assert!(
                status == 201 || status == 400,
                "{field} = {value:?}: {status}"
            );
            assert_eq!(
                matched, accepted,
                "{field} = {value:?}: the pattern says {matched}, the API answers {status}"
            );
        }
    }
}
