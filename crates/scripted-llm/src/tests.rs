//! The stand-in answers as vLLM 0.32 answered the same requests (`docs/real-vllm.md`,
//! sections 5 and 8, and `tests/pipeline/real_vllm.rs` against the real server): each expected
//! body below is the real server's, with only the numbers of this smaller context.

use super::*;
use serde_json::{Value, json};
use std::time::Duration;

/// A stand-in with a 64-token context whose every turn is long (so `max_tokens` cuts it).
async fn server() -> ScriptedServer {
    server_playing(&"word ".repeat(100)).await
}

/// A stand-in serving `tiny` with a 64-token context, whose every turn is `turn`.
async fn server_playing(turn: &str) -> ScriptedServer {
    server_with(turn, |_| {}).await
}

/// [`server_playing`] `turn`, its configuration changed by `tweak`.
async fn server_with(turn: &str, tweak: impl FnOnce(&mut ScriptedConfig)) -> ScriptedServer {
    let model = demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap();
    let script = Script::from_json(&json!({"fallback": [{"turns": [turn]}]}).to_string()).unwrap();
    let mut cfg = ScriptedConfig::new(Arc::new(model), script);
    cfg.model_name = "tiny".into();
    cfg.max_model_len = 64;
    tweak(&mut cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    ScriptedServer::spawn(listener, cfg).unwrap()
}

/// Posts `body` to `path` in a task of its own; the answer's status.
fn post_later(s: &ScriptedServer, path: &str, body: Value) -> tokio::task::JoinHandle<u16> {
    let url = format!("{}{path}", s.url());
    tokio::spawn(async move {
        reqwest::Client::new()
            .post(url)
            .json(&body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    })
}

async fn post(s: &ScriptedServer, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", s.url()))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn completion(prompt: &[u32], extra: &Value) -> Value {
    let mut b = json!({"model": "tiny", "prompt": prompt, "logprobs": 1, "return_token_ids": true});
    if let (Value::Object(b), Value::Object(e)) = (&mut b, extra) {
        b.extend(e.clone());
    }
    b
}

/// vLLM's error body: nested, with the parameter at fault.
fn error(message: &str, kind: &str, param: Value, code: u16) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

#[tokio::test]
async fn refusals_and_limits_are_vllms() {
    let s = server().await;
    let ids = |n: u32| (0..n).map(|i| 3 + i % 50).collect::<Vec<u32>>();
    let cases = [
        (
            completion(&ids(64), &json!({"max_tokens": 8})),
            error(
                "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                "BadRequestError",
                json!("max_tokens"),
                400,
            ),
        ),
        (
            completion(&ids(66), &json!({"max_tokens": 8})),
            error(
                "This model's maximum context length is 64 tokens. However, your prompt contains 66 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=66)",
                "BadRequestError",
                json!("input_tokens"),
                400,
            ),
        ),
        (
            completion(&ids(3), &json!({"max_tokens": 2000})),
            error(
                "max_tokens=2000 cannot be greater than max_model_len=64. Please request fewer output tokens. (parameter=max_tokens, value=2000)",
                "BadRequestError",
                json!("max_tokens"),
                400,
            ),
        ),
        (
            completion(&ids(3), &json!({"max_tokens": 0})),
            error(
                "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                "BadRequestError",
                json!("max_tokens"),
                400,
            ),
        ),
        (
            completion(&ids(3), &json!({"model": "policy"})),
            error(
                "The model `policy` does not exist. Valid aliases: tiny.",
                "NotFoundError",
                json!("model"),
                404,
            ),
        ),
        (
            completion(&[1, 2, 5000], &json!({})),
            error(
                "Token id 5000 is out of vocabulary",
                "BadRequestError",
                Value::Null,
                400,
            ),
        ),
        (
            completion(&[], &json!({})),
            error(
                "You must pass at least one prompt",
                "BadRequestError",
                Value::Null,
                400,
            ),
        ),
        (
            completion(&ids(3), &json!({"top_k": -2})),
            error(
                "top_k must be 0 (disable), or at least 1, got -2.",
                "BadRequestError",
                Value::Null,
                400,
            ),
        ),
    ];
    for (body, want) in cases {
        let (status, got) = post(&s, "/v1/completions", &body).await;
        assert_eq!(u64::from(status), want["error"]["code"], "{body}");
        assert_eq!(got, want, "{body}");
    }
    s.stop().await;
}

#[tokio::test]
async fn out_of_range_ids_and_seeds_are_refused_and_max_tokens_cut_to_fit() {
    let s = server().await;
    let ids = |n: u32| (0..n).map(|i| 3 + i % 50).collect::<Vec<u32>>();
    let vocab = s.shared.cfg.model.tokenizer.vocab_size();
    let (status, got) = post(
        &s,
        "/v1/completions",
        &completion(&ids(3), &json!({"stop_token_ids": [99999]})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        got["error"]["message"],
        format!(
            "token_id(s) [99999] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab} (parameter=stop_token_ids, value=[99999])"
        )
    );
    let (status, got) = post(
        &s,
        "/v1/completions",
        &completion(&ids(3), &json!({"seed": 9_223_372_036_854_775_808_u64})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(got["error"]["param"], "body.seed");
    assert_eq!(got["error"]["type"], "Bad Request");
    // What fits is answered, cut to the room left: 16 tokens when max_tokens is absent,
    // and never past the context.
    for (prompt, extra, want) in [
        (3, json!({}), 16),
        (60, json!({"max_tokens": 30}), 4),
        (10, json!({"max_tokens": 5}), 5),
    ] {
        let (status, got) = post(&s, "/v1/completions", &completion(&ids(prompt), &extra)).await;
        assert_eq!(status, 200, "{got}");
        let choice = &got["choices"][0];
        assert_eq!(
            choice["token_ids"].as_array().unwrap().len(),
            want,
            "{extra}"
        );
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(choice["stop_reason"], Value::Null);
    }
    s.stop().await;
}

#[tokio::test]
async fn a_stop_token_is_named_by_its_id() {
    let s = server().await;
    let free = post(
        &s,
        "/v1/completions",
        &completion(&[5, 6, 7], &json!({"max_tokens": 6})),
    )
    .await
    .1;
    let free: Vec<u64> = free["choices"][0]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let third = free[2];
    let cut = free.iter().position(|&t| t == third).unwrap() + 1;
    let (_, got) = post(
        &s,
        "/v1/completions",
        &completion(
            &[5, 6, 7],
            &json!({"max_tokens": 6, "stop_token_ids": [third]}),
        ),
    )
    .await;
    let choice = &got["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], third, "{choice}");
    assert_eq!(choice["token_ids"].as_array().unwrap().len(), cut);
    s.stop().await;
}

/// vLLM's dev-mode pause in `keep` mode: a request sent while paused waits, an abort
/// answers it 200 with `finish_reason: "abort"` and no tokens, and a resume lets the
/// next one through.
#[tokio::test]
async fn a_paused_server_holds_requests_and_aborts_answer_them() {
    let s = server().await;
    let (st, got) = post(&s, "/pause?mode=keep", &json!({})).await;
    assert_eq!((st, got), (200, json!({"status": "paused"})));
    let (st, got) = post(&s, "/pause?mode=bogus", &json!({})).await;
    assert_eq!(st, 400);
    assert_eq!(got["error"]["param"], "query.mode");
    let paused: Value = reqwest::get(format!("{}/is_paused", s.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(paused, json!({"is_paused": true}));
    let url = s.url();
    let held = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&completion(&[5, 6, 7], &json!({"max_tokens": 6})))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!held.is_finished(), "a paused server holds the request");
    let (st, got) = post(&s, "/abort_requests", &json!({})).await;
    assert_eq!((st, got), (200, json!({"status": "aborted", "aborted": 1})));
    let (st, got) = held.await.unwrap();
    assert_eq!(st, 200);
    assert_eq!(got["choices"][0]["finish_reason"], "abort");
    assert_eq!(got["choices"][0]["token_ids"], json!([]));
    let (st, got) = post(&s, "/resume", &json!({})).await;
    assert_eq!((st, got), (200, json!({"status": "resumed"})));
    let (st, got) = post(
        &s,
        "/v1/completions",
        &completion(&[5, 6, 7], &json!({"max_tokens": 6})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(got["choices"][0]["finish_reason"], "length");
    s.stop().await;
}

/// vLLM 0.33 refuses a request that arrives during an `abort` or `wait` pause (503, its
/// words), and holds one during `keep`; 0.32 (`pause_holds_new`) holds it in every mode.
/// SGLang's pause holds new requests whatever its mode, and its `/v1/loads` counts them;
/// its control endpoints want a JSON body, as 0.5.23's do.
#[tokio::test]
async fn new_requests_during_a_pause_are_refused_or_held_as_each_server_does() {
    let s = server().await;
    let ask = completion(&[5, 6, 7], &json!({"max_tokens": 6}));
    for mode in ["abort", "wait"] {
        post(&s, &format!("/pause?mode={mode}"), &json!({})).await;
        let (st, got) = post(&s, "/v1/completions", &ask).await;
        assert_eq!(
            (st, got),
            (
                503,
                error(
                    "Generation is paused. Please retry after it resumes.",
                    "ServiceUnavailableError",
                    Value::Null,
                    503
                )
            ),
            "{mode}"
        );
        // SGLang's words for the same pause: held, counted as waiting.
        let held = post_later(
            &s,
            "/generate",
            json!({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let load: Value = reqwest::get(format!("{}/v1/loads?include=core", s.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(load["loads"][0]["num_waiting_reqs"], 1, "{load}");
        assert!(!held.is_finished(), "{mode}: SGLang holds it");
        let bare = reqwest::Client::new()
            .post(format!("{}/continue_generation", s.url()))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(bare, 422, "no body");
        post(&s, "/resume", &json!({})).await;
        assert_eq!(held.await.unwrap(), 200);
    }
    s.stop().await;
    // vLLM 0.32 holds it.
    let old = server_with("word word", |c| c.pause_holds_new = true).await;
    post(&old, "/pause?mode=abort", &json!({})).await;
    let held = post_later(&old, "/v1/completions", ask);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!held.is_finished(), "0.32 holds it");
    post(&old, "/resume", &json!({})).await;
    assert_eq!(held.await.unwrap(), 200);
    old.stop().await;
}

/// The weights' label, as both servers keep it: `default` until
/// `/update_weight_version` changes it; vLLM reports it with `return_weight_versions`
/// as spans over the output, SGLang in every answer's `meta_info`.
#[tokio::test]
async fn the_weight_version_is_reported_as_each_server_reports_it() {
    let s = server().await;
    let info = |path: &'static str| {
        let url = s.url();
        async move {
            reqwest::get(format!("{url}{path}"))
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        info("/weight_info").await,
        json!({"weight_version": "default"})
    );
    let (st, got) = post(&s, "/update_weight_version", &json!({"new_version": "7"})).await;
    assert_eq!(
        (st, got["success"].clone(), got["new_version"].clone()),
        (200, json!(true), json!("7"))
    );
    assert_eq!(
        info("/get_weight_version").await,
        json!({"weight_version": "7"})
    );
    let (_, got) = post(
        &s,
        "/v1/completions",
        &completion(
            &[5, 6, 7],
            &json!({"max_tokens": 6, "return_weight_versions": true}),
        ),
    )
    .await;
    assert_eq!(
        got["choices"][0]["weight_versions"],
        json!([{"version": "7", "start": 0, "end": 6}])
    );
    let (_, got) = post(
        &s,
        "/generate",
        &json!({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}}),
    )
    .await;
    assert_eq!(got["meta_info"]["weight_version"], "7");
    s.stop().await;
}

/// A request frozen by a `keep` pause, relabelled and resumed, reports each token's
/// label when it was sampled, as vLLM 0.33 tracks it: the tokens before the pause under
/// the old label, the rest under the new one.
#[tokio::test]
async fn a_request_that_straddles_a_relabel_reports_both_labels() {
    let s = server_with("one two three four five six seven eight nine ten", |c| {
        c.token_us = 300_000;
    })
    .await;
    post(&s, "/update_weight_version", &json!({"new_version": "7"})).await;
    let ask = completion(
        &[5, 6, 7],
        &json!({"max_tokens": 10, "return_weight_versions": true}),
    );
    let url = s.url();
    let answer = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&ask)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    });
    // Once it generates (3 s for its 10 tokens), a little of it, then the pause.
    loop {
        let load: Value = reqwest::get(format!("{}/v1/loads", s.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if load["loads"][0]["num_running_reqs"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    post(&s, "/pause?mode=keep", &json!({})).await;
    post(&s, "/update_weight_version", &json!({"new_version": "8"})).await;
    post(&s, "/resume", &json!({})).await;
    let got = answer.await.unwrap();
    let choice = &got["choices"][0];
    let n = choice["token_ids"].as_array().unwrap().len();
    let runs = choice["weight_versions"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{choice}");
    let cut = runs[0]["end"].as_u64().unwrap();
    assert!(cut > 0 && cut < n as u64, "{choice}");
    assert_eq!(runs[0], json!({"version": "7", "start": 0, "end": cut}));
    assert_eq!(runs[1], json!({"version": "8", "start": cut, "end": n}));
    s.stop().await;
}

/// A stop string ends the output at the token that completes it, kept whole, as vLLM
/// keeps it (the text is not re-encoded cut at the string, which gives other tokens
/// when the string ends inside one).
#[tokio::test]
async fn a_stop_string_keeps_the_whole_token_that_completes_it() {
    let script = "The quick brown fox jumps over the lazy dog.";
    let s = server_playing(script).await;
    let vocab = &s.shared.cfg.model.tokenizer;
    let full = vocab.encode(script).unwrap();
    let (_, got) = post(
        &s,
        "/v1/completions",
        &completion(&[5, 6, 7], &json!({"max_tokens": 30, "stop": ["e qui"]})),
    )
    .await;
    let choice = &got["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{choice}");
    assert_eq!(choice["stop_reason"], "e qui");
    let ids: Vec<u32> = choice["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect();
    assert_eq!(
        ids,
        full[..ids.len()],
        "the script's own tokens, cut after the stop"
    );
    assert!(vocab.decode(&ids).unwrap().contains("e qui"));
    assert!(
        !vocab
            .decode(&ids[..ids.len() - 1])
            .unwrap()
            .contains("e qui")
    );
    // What this checks: the string ends inside a token, so re-encoding the text cut at
    // it gives other tokens.
    assert_ne!(
        vocab.encode("The qui").unwrap(),
        ids,
        "the stop must end inside a token"
    );
    s.stop().await;
}

/// `cache_salt` as vLLM takes it: refused in vLLM's words when empty, long or holding a
/// forbidden character; a namespace of the prefix cache otherwise, so a prompt cached
/// under one salt is not found under another.
#[tokio::test]
async fn a_cache_salt_is_checked_as_vllm_checks_it_and_namespaces_the_cache() {
    let s = server_playing("ok").await;
    let long = "x".repeat(129);
    for (salt, message) in [
        (
            "",
            "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
        ),
        (
            "a@b",
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. (parameter=cache_salt)",
        ),
        (
            "a/b",
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. (parameter=cache_salt)",
        ),
        (
            long.as_str(),
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. (parameter=cache_salt)",
        ),
    ] {
        let (status, body) = post(
            &s,
            "/v1/completions",
            &completion(&[5, 6, 7], &json!({"cache_salt": salt})),
        )
        .await;
        assert_eq!(
            (status, body),
            (
                400,
                error(message, "BadRequestError", json!("cache_salt"), 400)
            ),
            "{salt:?}"
        );
    }
    // Long enough for whole blocks; cached after the first request, under its salt only.
    let prompt: Vec<u32> = (0..40).map(|i| 3 + i % 50).collect();
    let cached = |salt: &'static str| {
        let (s, prompt) = (&s, prompt.clone());
        async move {
            let body = completion(&prompt, &json!({"cache_salt": salt, "max_tokens": 2}));
            let (status, body) = post(s, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{body}");
            s.stats().cached_tokens
        }
    };
    let before = cached("policy-v1").await;
    let v1_again = cached("policy-v1").await - before;
    assert!(v1_again > 0, "the same salt hits the cache");
    let v2 = cached("policy-v2").await - before - v1_again;
    assert_eq!(v2, 0, "another salt finds nothing");
}
