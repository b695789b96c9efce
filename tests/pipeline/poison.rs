//! Poison inputs and colliding writers, on SQLite and Postgres alike: NUL characters in
//! tasks, outputs and URLs, a row the database refuses to end, and submits that overlap.

use crate::eventually::{eventually, holds};
use std::time::Duration;

use rollout::domain::{Status, Task};

use crate::helpers::{TestEnv, json_answer, sql, synthetic, unpublished_synthetic};
use rollout::domain::EpochMs;

async fn get(env: &TestEnv, path: &str) -> (u16, serde_json::Value) {
    json_answer(
        reqwest::Client::new().get(format!("{}{path}", env.base)),
        path,
    )
    .await
}

/// A task with NUL anywhere (spec, metadata, a key) is refused with the field named, on
/// every database, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_in_a_task_is_refused_with_the_field_named() {
    let env = TestEnv::start(|_| {}).await;
    let cases = [
        (
            serde_json::json!({"kind": "synthetic", "spec": {"message": "a\u{0}b"}}),
            "tasks[0].spec.message",
        ),
        (
            serde_json::json!({"kind": "synthetic", "spec": {}, "metadata": {"tags": ["x", "\u{0}"]}}),
            "tasks[0].metadata.tags[1]",
        ),
        (
            serde_json::json!({"kind": "synthetic", "spec": {}, "metadata": {"k\u{0}": 1}}),
            "tasks[0].metadata.k\\u0000",
        ),
    ];
    for (task, field) in cases {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/jobs", env.base))
            .json(&serde_json::json!({"tasks": [task], "batch_id": "nul"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{field}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["field"], field, "{body}");
        assert!(body["error"].as_str().unwrap().contains("NUL"), "{body}");
    }
    let s = env.client.status(None).await.unwrap();
    assert_eq!(s.counts.iter().map(|c| c.count).sum::<i64>(), 0);
    // The same for a backend's fields.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/backends", env.base))
        .json(
            &serde_json::json!({"id": "b", "url": "http://x", "kind": "vllm",
                                  "model": "m\u{0}", "tokenizer": "/t"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["field"], "model", "{body}");
}

/// NUL bytes an agent prints end up in the stored output as U+FFFD, and the job ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_in_outputs_is_stored_as_the_replacement_character() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let task = Task::new(
        "shell",
        serde_json::json!({
            "steps": [{"tool": "bash", "args": {"command": "printf 'a\\000b'"}}],
            "check": {"command": "printf 'c\\000d'; exit 3"},
        }),
    );
    env.submit(&[task], "nulout").await;
    let r = env.wait_results("nulout", 1, Duration::from_secs(60)).await;
    let view = env.client.job(&r[0].job_id).await.unwrap();
    let result = view.result.unwrap();
    assert_eq!(result.status, Status::Done, "{result:?}");
    assert_eq!(result.reward, Some(0.0));
    let text = result.output.to_string();
    assert!(text.contains("a\u{FFFD}b"), "{text}");
    assert!(text.contains("c\u{FFFD}d"), "{text}");
    assert!(!text.contains("\\u0000"), "{text}");
}

/// NUL in a path or query, or a path that is not UTF-8, is a 400 naming the parameter,
/// never a 503 "retry", on every database; nothing streams for such a batch. (A query
/// that is not UTF-8 is decoded with U+FFFD in place, as `application/x-www-form-
/// urlencoded` decoders do, and finds nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_url_parameters_are_a_400_naming_them() {
    let env = TestEnv::start(|_| {}).await;
    let cases = [
        ("/v1/jobs/a%00b", "id"),
        ("/v1/jobs/%FF%FE", "id"),
        ("/v1/jobs?batch=a%00", "batch"),
        ("/v1/jobs?cursor=%00", "cursor"),
        ("/v1/status?batch=x%00y", "batch"),
        ("/v1/backends/a%00b", "id"),
        ("/v1/results?batch=%00", "batch"),
        ("/v1/results/stream?batch=%00", "batch"),
    ];
    for (path, field) in cases {
        let (status, body) = get(&env, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["field"], field, "{path}: {body}");
    }
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/jobs/a%00b/cancel", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

/// Submits whose `client_id`s overlap, each in its own order, all succeed (no deadlock
/// answered as a 503), and each `client_id` makes exactly one job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_submits_do_not_deadlock() {
    let env = TestEnv::start(|_| {}).await;
    let ids: Vec<String> = (0..300).map(|i| format!("c{i:03}")).collect();
    let requests = (0..20).map(|r| {
        let mut order = ids.clone();
        // A different order per request: rotated, and every other one reversed.
        order.rotate_left(r * 7 % ids.len());
        if r % 2 == 1 {
            order.reverse();
        }
        let tasks: Vec<Task> = order
            .iter()
            .map(|c| {
                let mut t = synthetic(serde_json::json!({}));
                t.client_id = Some(c.clone());
                t.group_id = Some(format!("g{}", &c[1..2]));
                t
            })
            .collect();
        let client = env.client.clone();
        // A batch each: submits into one batch take turns on its row anyway.
        tokio::spawn(async move { client.submit(&tasks, Some(&format!("overlap{r}"))).await })
    });
    let mut by_client = std::collections::HashMap::new();
    for r in futures::future::join_all(requests).await {
        let resp = r.unwrap().expect("every submit succeeds");
        for j in resp.jobs {
            let id = by_client
                .entry(j.client_id.clone().unwrap())
                .or_insert(j.id.clone());
            assert_eq!(*id, j.id, "one job per client_id");
        }
    }
    assert_eq!(by_client.len(), 300);
    let mut submitted = 0;
    for r in 0..20 {
        let s = env
            .client
            .status(Some(&format!("overlap{r}")))
            .await
            .unwrap();
        submitted += s.batch.expect("the batch exists").submitted;
    }
    assert_eq!(
        submitted, 300,
        "each new job counted once, in its own batch"
    );
}

/// A job the database refuses to end (here its row's task is not JSON) is failed with
/// the reason instead of being retried for ever, and it does not stop the reconciler
/// from repairing another job orphaned at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_cannot_be_ended_does_not_stop_the_reconciler() {
    let env = TestEnv::start(|s| s.reconciler.stale_after_ms = 1_000).await;
    // Both written, never published: the poison is then only the reconciler's to find.
    let (poison, orphan) = (unpublished_synthetic(None), unpublished_synthetic(None));
    for (batch, job) in [("poison", &poison), ("orphan", &orphan)] {
        env.deps
            .store
            .submit(batch, std::slice::from_ref(job), EpochMs::now())
            .await
            .unwrap();
    }
    // The poison: stuck running with a lapsed lease, started too often, and a row the
    // database cannot take apart; the oldest, so every sweep meets it first.
    let poison = poison.id;
    sql(
        &env,
        &format!(
            "UPDATE jobs SET task = 'not json', status = 'running', lease_until = 0, \
             attempts = 1000, updated_at = 0 WHERE id = '{poison}'"
        ),
    )
    .await;
    env.workers_in_process(1);
    let r = env.wait_results("orphan", 1, Duration::from_secs(60)).await;
    assert_eq!(r[0].status, Status::Done);
    // The poison ended too: failed, with why, its output dropped. (Read from its result:
    // the job view would have to take the poisoned task apart.)
    let ended = eventually(
        "the poisoned job ended",
        Duration::from_secs(20),
        || async {
            let results = env
                .deps
                .store
                .results_after(Some("poison"), 0, 10, i64::MAX)
                .await
                .unwrap();
            results.into_iter().next().ok_or("no result yet")
        },
    )
    .await;
    assert_eq!(ended.status, Status::Failed);
    let error = ended.error.expect("a failure says why");
    assert!(
        error.contains("stuck") && error.contains("could not be recorded"),
        "{error}"
    );
}

/// A submit into a live batch never holds up results (Postgres; SQLite has one writer,
/// which takes each submit as one short write). Made deterministic by holding the
/// submit's last row: another transaction has inserted that `client_id` and not
/// committed, so the submit waits there, at its end. Meanwhile a job of the same batch
/// and one of another batch end; neither may wait for the submit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_submit_in_progress_does_not_hold_up_results() {
    use sqlx::Connection;
    let env = TestEnv::start(|_| {}).await;
    let url = env.deps.settings.database.url.clone();
    if !url.starts_with("postgres") {
        // The test command leaves `postgres_` tests out of its SQLite pass.
        crate::prerequisite::missing(
            "poison::postgres_a_submit_in_progress_does_not_hold_up_results",
            "Postgres only (SQLite's single writer takes a submit as one write); ROLLOUT_TEST_DATABASE_URL names no server",
        );
        return;
    }
    let store = env.deps.store.clone();
    let job = |batch: &str| {
        unpublished_synthetic(Some(format!("{batch}-{}", uuid::Uuid::now_v7().simple())))
    };
    let (a1, b1) = (job("a"), job("b"));
    store
        .submit("live", std::slice::from_ref(&a1), EpochMs(1))
        .await
        .unwrap();
    store
        .submit("other", std::slice::from_ref(&b1), EpochMs(1))
        .await
        .unwrap();
    // The blocker: an uncommitted insert of the client id the submit takes last.
    let last = "zzzz-last".to_string();
    let mut blocker = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(
        "INSERT INTO jobs (id, batch_id, client_id, kind, task, status, stage, epoch, attempts, \
         created_at, updated_at) VALUES ($1, 'live', $2, 'synthetic', '{}', 'queued', 'init', 0, 0, 1, 1)",
    )
    .bind(uuid::Uuid::now_v7().to_string())
    .bind(&last)
    .execute(&mut blocker)
    .await
    .unwrap();
    let mut big: Vec<_> = (0..500).map(|_| job("live")).collect();
    let mut held = job("live");
    held.client_id = Some(last);
    big.push(held);
    let submit = {
        let store = store.clone();
        tokio::spawn(async move { store.submit("live", &big, EpochMs(2)).await })
    };
    // Wait until the submit is waiting on the blocker.
    let watcher = &tokio::sync::Mutex::new(sqlx::PgConnection::connect(&url).await.unwrap());
    eventually(
        "the submit reached its held row",
        Duration::from_secs(10),
        || async move {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
            )
            .fetch_one(&mut *watcher.lock().await)
            .await
            .unwrap();
            holds(n > 0, "no session waits on a lock")
        },
    )
    .await;
    let outcome = rollout::domain::Outcome::done(1.0, serde_json::Value::Null);
    for (what, id) in [("its own batch", &a1.id), ("another batch", &b1.id)] {
        let ended = tokio::time::timeout(
            Duration::from_secs(30),
            store.finish(&rollout::store::FinishIf::Live, id, &outcome, EpochMs(3)),
        )
        .await
        .unwrap_or_else(|_| panic!("a result of {what} waited for the submit"))
        .unwrap();
        assert!(ended.is_some(), "{what}");
    }
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let submitted = submit.await.unwrap().unwrap();
    assert_eq!(submitted.len(), 501);
    let live = env
        .client
        .status(Some("live"))
        .await
        .unwrap()
        .batch
        .unwrap();
    assert_eq!((live.submitted, live.finished), (502, 1), "{live:?}");
}

/// Cancelling a job whose cancelled end the database refuses (its row's task is not
/// JSON) records it `failed`, and the answer says `failed`, what was recorded, not
/// `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_the_database_refuses_answers_what_was_recorded() {
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let job = unpublished_synthetic(None);
    env.deps
        .store
        .submit("refused", std::slice::from_ref(&job), EpochMs::now())
        .await
        .unwrap();
    sql(
        &env,
        &format!("UPDATE jobs SET task = 'not json' WHERE id = '{}'", job.id),
    )
    .await;
    let (status, body) = json_answer(
        reqwest::Client::new().post(format!("{}/v1/jobs/{}/cancel", env.base, job.id)),
        "cancel",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let recorded = env
        .deps
        .store
        .results_after(Some("refused"), 0, 10, i64::MAX)
        .await
        .unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].status, Status::Failed);
    assert_eq!(body["status"], "failed", "{body}");
}
