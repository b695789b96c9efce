//! Submitting over NATS: a request on `<prefix>.submit` gets the same answer as
//! `POST /v1/jobs`, is idempotent by `client_id`, and names the bad field.

use std::time::Duration;

use rollout::domain::Status;
use rollout::gateway::nats::decode_reply;
use serde_json::json;

use crate::eventually::eventually;
use crate::helpers::TestEnv;

/// Sends a submit request and returns the reply's headers and decoded body. Until the
/// gateway (started beside the test) has subscribed, NATS answers "no responders" at
/// once; like any requester, this tries again.
async fn request(
    env: &TestEnv,
    body: &serde_json::Value,
) -> (
    Option<async_nats::HeaderMap>,
    Result<rollout::gateway::jobs::SubmitResponse, rollout::gateway::nats::SubmitErrorReply>,
) {
    let reply = raw_request(env, serde_json::to_vec(body).unwrap()).await;
    (reply.headers, decode_reply(&reply.payload))
}

async fn raw_request(env: &TestEnv, body: Vec<u8>) -> async_nats::Message {
    let subject = env.deps.queue.subjects().submit();
    let client = env.deps.queue.client();
    let (subject, body) = (&subject, &body);
    eventually(
        "a gateway answered the submit request",
        Duration::from_secs(30),
        || async move {
            match client.request(subject.clone(), body.clone().into()).await {
                Ok(reply) => Ok(reply),
                Err(e) if e.kind() == async_nats::client::RequestErrorKind::NoResponders => Err(e),
                Err(e) => panic!("the submit request failed: {e}"),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_submit_is_answered_once_idempotently_and_runs() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let tasks: Vec<_> = (0..3)
        .map(
            |i| json!({"kind": "synthetic", "client_id": format!("nats-{i}"), "spec": {"seed": i}}),
        )
        .collect();
    let body = json!({"tasks": tasks, "batch_id": "over-nats"});
    let (_, first) = request(&env, &body).await;
    let first = first.expect("submitted");
    assert_eq!(first.batch_id, "over-nats");
    assert_eq!(first.jobs.len(), 3);
    assert!(first.jobs.iter().all(|j| !j.duplicate));
    // The same request again (a trainer retrying after a lost reply) creates nothing.
    let (_, again) = request(&env, &body).await;
    let again = again.expect("answered again");
    let ids = |r: &rollout::gateway::jobs::SubmitResponse| {
        r.jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>()
    };
    assert_eq!(ids(&again), ids(&first));
    assert!(again.jobs.iter().all(|j| j.duplicate));
    let results = env
        .wait_results("over-nats", 3, Duration::from_secs(60))
        .await;
    assert!(
        results.iter().all(|r| r.status == Status::Done),
        "{results:?}"
    );
    let status = env.client.status(Some("over-nats")).await.unwrap();
    assert_eq!(status.batch.unwrap().finished, 3, "each task ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_nats_submit_names_the_field_and_writes_nothing() {
    let env = TestEnv::start(|_| {}).await;
    let body = json!({"tasks": [{"kind": "synthetic", "spec": {"run_ms": -5}}]});
    let (headers, reply) = request(&env, &body).await;
    let e = reply.expect_err("refused");
    assert_eq!(e.status, 400, "{e:?}");
    assert_eq!(e.field.as_deref(), Some("tasks[0].spec.run_ms"), "{e:?}");
    let headers = headers.expect("an error reply carries the service-error headers");
    assert_eq!(
        headers.get("Nats-Service-Error-Code").map(|v| v.as_str()),
        Some("400")
    );
    // Not JSON at all.
    let reply = raw_request(&env, b"{not json".to_vec()).await;
    assert_eq!(decode_reply(&reply.payload).unwrap_err().status, 400);
    let page = env.client.results(None, 0, 0).await.unwrap();
    assert!(page.results.is_empty());
    let status = env.client.status(None).await.unwrap();
    assert!(
        status.counts.iter().all(|c| c.count == 0),
        "a refused request wrote jobs: {:?}",
        status.counts
    );
}
