//! The HTTP API's contract: idempotent submit, bad input, listing, health, metrics and
//! the OpenAPI document.

use rollout::domain::Status;

use crate::helpers::{TestEnv, json_answer, synthetic};

async fn post_raw(env: &TestEnv, body: impl Into<reqwest::Body>) -> (u16, serde_json::Value) {
    let req = reqwest::Client::new()
        .post(format!("{}/v1/jobs", env.base))
        .header("content-type", "application/json")
        .body(body);
    json_answer(req, "POST /v1/jobs").await
}

async fn total_jobs(env: &TestEnv) -> i64 {
    let s = env.client.status(None).await.unwrap();
    s.counts.iter().map(|c| c.count).sum()
}

/// Submit bodies the gateway must refuse: each with the status it answers and the
/// field its error names (`None` where the body is not JSON at all).
fn bad_bodies() -> Vec<(String, u16, Option<&'static str>)> {
    let ok = r#"{"kind":"synthetic","spec":{}}"#;
    vec![
        ("{not json".into(), 400, None),
        (r#"{"tasks":[]}"#.into(), 400, Some("tasks")),
        (
            r#"{"tasks":[{"kind":"synthetic"}],"extra":1}"#.into(),
            400,
            None,
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","color":"red"}}]}}"#),
            400,
            Some("tasks[1]"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":5}}]}}"#),
            400,
            Some("tasks[1].kind"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"nope"}}]}}"#),
            400,
            Some("tasks[1].kind"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","spec":{{"run_ms":-5}}}}]}}"#),
            400,
            Some("tasks[1].spec.run_ms"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","spec":{{"run_ms":"slow"}}}}]}}"#),
            400,
            Some("tasks[1].spec.run_ms"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","spec":{{"hang_in":"later"}}}}]}}"#),
            400,
            Some("tasks[1].spec.hang_in"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","spec":{{"speed":1}}}}]}}"#),
            400,
            Some("tasks[1].spec"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","client_id":""}}]}}"#),
            400,
            Some("tasks[1].client_id"),
        ),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","group_id":"a\u0000b"}}]}}"#),
            400,
            Some("tasks[1].group_id"),
        ),
        // Sampling values the inference servers would refuse on every request.
        (
            format!(
                r#"{{"tasks":[{ok},{{"kind":"agent","spec":{{"messages":[{{"role":"user","content":"x"}}],"check":{{"command":"true"}},"sampling":{{"seed":18446744073709551615}}}}}}]}}"#
            ),
            400,
            Some("tasks[1].spec.sampling.seed"),
        ),
        (
            format!(
                r#"{{"tasks":[{ok},{{"kind":"agent","spec":{{"messages":[{{"role":"user","content":"x"}}],"check":{{"command":"true"}},"sampling":{{"top_k":-5}}}}}}]}}"#
            ),
            400,
            Some("tasks[1].spec.sampling.top_k"),
        ),
        // A template variable the service sets itself (transformers refuses it too).
        (
            format!(
                r#"{{"tasks":[{ok},{{"kind":"agent","spec":{{"messages":[{{"role":"user","content":"x"}}],"check":{{"command":"true"}},"template_args":{{"enable_thinking":false,"tools":[]}}}}}}]}}"#
            ),
            400,
            Some("tasks[1].spec.template_args.tools"),
        ),
        (
            format!(r#"{{"tasks":[{ok}],"batch_id":"has.dot"}}"#),
            400,
            Some("batch_id"),
        ),
        (
            format!(r#"{{"tasks":[{ok}],"batch_id":7}}"#),
            400,
            Some("batch_id"),
        ),
        (format!(r#"{{"tasks":[{ok}]}} trailing"#), 400, None),
        (
            format!(r#"{{"tasks":[{ok},{{"kind":"synthetic","metadata":[1]}}]}}"#),
            400,
            Some("tasks[1].metadata"),
        ),
    ]
}

/// Every kind of bad input gets a 4xx with a JSON body naming the field, and writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_4xx_naming_the_field_and_writes_nothing() {
    let env = TestEnv::start(|s| s.gateway.max_body_bytes = 64 * 1024).await;
    for (body, status, field) in bad_bodies() {
        let (got, json) = post_raw(&env, body.clone()).await;
        assert_eq!(got, status, "{body} -> {json}");
        assert!(
            json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{json}"
        );
        if let Some(f) = field {
            let named = json["field"].as_str().unwrap_or_default();
            assert!(
                named.starts_with(f),
                "{body}: expected field {f}, got {json}"
            );
        }
    }
    // Oversized body.
    let big = format!(
        r#"{{"tasks":[{{"kind":"synthetic","metadata":{{"pad":"{}"}}}}]}}"#,
        "x".repeat(100 * 1024)
    );
    let (got, json) = post_raw(&env, big).await;
    assert_eq!(got, 413, "{json}");
    assert!(json["error"].as_str().unwrap().contains("larger than"));
    // Wrong content type is a 4xx too, with JSON.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/jobs", env.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_client_error());
    assert_eq!(total_jobs(&env).await, 0, "a rejected request wrote jobs");

    // Bad query parameters name the parameter.
    for (url, field) in [
        ("/v1/jobs?status=sleeping", "status"),
        ("/v1/jobs?limit=lots", "limit"),
        ("/v1/jobs?colour=red", "colour"),
        ("/v1/results?after=-1", "after"),
        ("/v1/results?wait_ms=99999999", "wait_ms"),
    ] {
        let resp = reqwest::get(format!("{}{url}", env.base)).await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{url}");
        let json: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(json["field"], field, "{url}: {json}");
    }
    let resp = reqwest::Client::new()
        .delete(format!("{}/v1/jobs", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 405);
    let json: serde_json::Value = resp.json().await.unwrap();
    assert!(json["error"].as_str().is_some());
    let resp = reqwest::get(format!("{}/v1/jobs/nope", env.base))
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let json: serde_json::Value = resp.json().await.unwrap();
    assert!(json["error"].as_str().unwrap().contains("nope"));
}

/// A retried submit with the same `client_id`s returns the same jobs and runs each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_with_client_ids_is_idempotent() {
    let env = TestEnv::start(|_| {}).await;
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let mut t = synthetic(serde_json::json!({"seed": i}));
            t.client_id = Some(format!("step1-p{i}"));
            t
        })
        .collect();
    let first = env.client.submit(&tasks, Some("idem")).await.unwrap();
    assert!(first.jobs.iter().all(|j| !j.duplicate));
    let second = env.client.submit(&tasks, Some("idem")).await.unwrap();
    assert!(second.jobs.iter().all(|j| j.duplicate));
    let ids = |r: &rollout::api::jobs::SubmitResponse| {
        r.jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>()
    };
    assert_eq!(ids(&first), ids(&second));
    // A mixed resubmit creates only the new one, once even where the request repeats
    // it (the repeat is answered as a duplicate of it).
    let mut more = tasks.clone();
    let mut extra = synthetic(serde_json::json!({}));
    extra.client_id = Some("step1-p5".into());
    more.push(extra.clone());
    more.push(extra);
    let third = env.client.submit(&more, Some("idem")).await.unwrap();
    assert_eq!(third.jobs.iter().filter(|j| !j.duplicate).count(), 1);
    assert!(!third.jobs[5].duplicate && third.jobs[6].duplicate);
    assert_eq!(third.jobs[5].id, third.jobs[6].id);
    assert_eq!(total_jobs(&env).await, 6);
    let batch = env
        .client
        .status(Some("idem"))
        .await
        .unwrap()
        .batch
        .unwrap();
    assert_eq!(batch.submitted, 6);

    env.workers_in_process(1);
    let results = env
        .wait_results("idem", 6, std::time::Duration::from_secs(30))
        .await;
    assert_eq!(results.len(), 6);
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("RESULTS").await, 6);
    // After it ran, a resubmit still returns the finished job.
    let fourth = env.client.submit(&tasks[..1], Some("idem")).await.unwrap();
    assert!(fourth.jobs[0].duplicate);
    assert_eq!(fourth.jobs[0].status, Status::Done);
}

/// Listing pages through jobs by cursor, filtered by batch and status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_pages_by_cursor() {
    let env = TestEnv::start(|_| {}).await;
    let tasks: Vec<_> = (0..7).map(|_| synthetic(serde_json::json!({}))).collect();
    let ids = env.submit(&tasks, "list").await;
    env.submit(&tasks[..2], "other").await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{}/v1/jobs?batch=list&status=queued&limit=3", env.base);
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: rollout::api::jobs::JobPage =
            reqwest::get(url).await.unwrap().json().await.unwrap();
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen, ids);
}

/// Job listings keep to the byte budget result pages have (`gateway.max_page_bytes`):
/// `limit=1000` over jobs with large outputs gives pages that stop at the job that
/// reaches the budget, each with at least one job (one larger than the budget on a page
/// of its own), and the cursor walks them all, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_listings_keep_to_the_page_byte_budget() {
    const MB: usize = 1 << 20;
    let budget = 10 * MB;
    let env = TestEnv::start(|s| {
        s.reconciler.enabled = false;
        s.gateway.max_page_bytes = budget as u64;
    })
    .await;
    let tasks: Vec<_> = (0..6).map(|_| synthetic(serde_json::json!({}))).collect();
    let ids = env.submit(&tasks, "big").await;
    // Outputs of 4 MB each, and one of 12 MB (over the budget by itself): a JSON
    // string of that many zeros, written as a finished RUN would leave it.
    let postgres = env.deps.settings.database.url.starts_with("postgres");
    for (i, id) in ids.iter().enumerate() {
        let bytes = if i == 3 { 12 * MB } else { 4 * MB };
        let zeros = if postgres {
            format!("repeat('0', {bytes})")
        } else {
            format!("hex(zeroblob({}))", bytes / 2)
        };
        crate::helpers::sql(
            &env,
            &format!("UPDATE jobs SET run_output = '\"' || {zeros} || '\"' WHERE id = '{id}'"),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = format!("{}/v1/jobs?batch=big&limit=1000", env.base);
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let body = reqwest::get(url).await.unwrap().bytes().await.unwrap();
        let page: rollout::api::jobs::JobPage = serde_json::from_slice(&body).unwrap();
        pages += 1;
        assert!(!page.jobs.is_empty(), "page {pages} is empty");
        // Stopped at the job that reached the budget: what came before it is under.
        let before_last: usize = page.jobs[..page.jobs.len() - 1]
            .iter()
            .map(|j| {
                j.run_output
                    .as_ref()
                    .map_or(0, |o| o.as_str().unwrap().len())
            })
            .sum();
        assert!(
            before_last < budget,
            "page {pages}: {} jobs, {} bytes",
            page.jobs.len(),
            body.len()
        );
        seen.extend(page.jobs.iter().map(|j| j.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
        assert!(pages < 20, "the cursor does not advance");
    }
    assert_eq!(seen, ids);
    // 4+4+4, 12 (alone: over the budget by itself), 4+4 MB.
    assert_eq!(pages, 3);
}

/// Health reports both dependencies; metrics are Prometheus text with the promised
/// series; the OpenAPI document describes every route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_openapi() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    env.submit(&[synthetic(serde_json::json!({"run_ms": 5}))], "obs")
        .await;
    env.wait_results("obs", 1, std::time::Duration::from_secs(30))
        .await;

    let resp = reqwest::get(format!("{}/healthz", env.base)).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let h: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["nats"]["ok"], true);
    assert_eq!(h["database"]["ok"], true);
    // What the host's sandboxes are held to, and what they are not, with the reason.
    let sb = &h["sandbox"];
    assert_eq!(sb["local_backend"]["enforced"], true, "{sb:#}");
    assert_eq!(
        sb["workspace_disk"]["enforced"],
        rollout::sandbox::quota::WorkspaceQuota::probe().enforced(),
        "{sb:#}"
    );
    for limit in ["network", "memory", "processes", "workspace_disk"] {
        assert!(
            sb[limit]["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{limit}: {sb:#}"
        );
    }

    let text = reqwest::get(format!("{}/metrics", env.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "rollout_stage_duration_seconds_bucket{stage=\"run\"",
        "rollout_queue_wait_seconds_bucket{stage=\"eval\"",
        "rollout_jobs{status=\"done\"}",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }

    let api: serde_json::Value = reqwest::get(format!("{}/openapi.json", env.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let paths = api["paths"].as_object().unwrap();
    for p in [
        "/v1/jobs",
        "/v1/jobs/{id}",
        "/v1/jobs/{id}/cancel",
        "/v1/results",
        "/v1/results/stream",
        "/v1/status",
        "/healthz",
        "/metrics",
    ] {
        assert!(paths.contains_key(p), "OpenAPI lacks {p}");
    }
    assert!(api["components"]["schemas"]["SubmitRequest"].is_object());
}
