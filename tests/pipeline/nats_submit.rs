//! Submitting over NATS: a request on `<prefix>.submit` gets the same answer as
//! `POST /v1/jobs`, is idempotent by `client_id`, and names the bad field; a request on
//! `<prefix>.batches.submit` does the same for `POST /v1/batches`, and the batch's
//! accepted groups arrive on `<prefix>.groups.<batch>`, live and replayable.

use std::time::Duration;

use futures::StreamExt;
use rollout::api::batches::BatchView;
use rollout::domain::Status;
use rollout::domain::sampling::{AcceptedGroup, SamplingStatus};
use rollout::gateway::nats::{SubmitErrorReply, decode_reply};
use serde_json::json;

use crate::eventually::eventually;
use crate::helpers::TestEnv;

/// Sends a submit request and returns the reply's headers and decoded body.
async fn request(
    env: &TestEnv,
    body: &serde_json::Value,
) -> (
    Option<async_nats::HeaderMap>,
    Result<rollout::api::jobs::SubmitResponse, SubmitErrorReply>,
) {
    let subject = env.deps.queue.subjects().submit();
    let reply = raw_request(env, &subject, serde_json::to_vec(body).unwrap()).await;
    (reply.headers, decode_reply(&reply.payload))
}

/// Sends a request on `subject`. Until the gateway (started beside the test) has
/// subscribed, NATS answers "no responders" at once; like any requester, this tries
/// again.
async fn raw_request(env: &TestEnv, subject: &str, body: Vec<u8>) -> async_nats::Message {
    let client = env.deps.queue.client();
    let (subject, body) = (&subject.to_string(), &body);
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

/// Sends a request on `<prefix>.batches.submit`.
async fn batch_request(
    env: &TestEnv,
    body: &serde_json::Value,
) -> Result<BatchView, SubmitErrorReply> {
    let subject = env.deps.queue.subjects().batches_submit();
    let reply = raw_request(env, &subject, serde_json::to_vec(body).unwrap()).await;
    decode_reply(&reply.payload)
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
    let ids = |r: &rollout::api::jobs::SubmitResponse| {
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
    let subject = env.deps.queue.subjects().submit();
    let reply = raw_request(&env, &subject, b"{not json".to_vec()).await;
    let e = decode_reply::<rollout::api::jobs::SubmitResponse>(&reply.payload).unwrap_err();
    assert_eq!(e.status, 400);
    let page = env.client.results(None, 0, 0).await.unwrap();
    assert!(page.results.is_empty());
    let status = env.client.status(None).await.unwrap();
    assert!(
        status.counts.iter().all(|c| c.count == 0),
        "a refused request wrote jobs: {:?}",
        status.counts
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_batch_over_nats_is_idempotent_and_its_groups_arrive_on_their_subject() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(4);
    let queue = &env.deps.queue;
    let subject = queue.subjects().groups("over-nats");
    // A trainer listening live, from before the batch exists.
    let mut live = queue.client().subscribe(subject.clone()).await.unwrap();
    queue.client().flush().await.unwrap();

    // Refused input names its field and creates nothing.
    let bad = json!({"batch_id": "refused", "group_size": 1, "target_groups": 1,
        "prompts": [{"kind": "synthetic", "spec": {}}]});
    let e = batch_request(&env, &bad).await.expect_err("refused");
    assert_eq!(
        (e.status, e.field.as_deref()),
        (400, Some("group_size")),
        "{e:?}"
    );
    let (status, _) = crate::helpers::json_answer(
        reqwest::Client::new().get(format!("{}/v1/batches/refused", env.base)),
        "read the refused batch",
    )
    .await;
    assert_eq!(status, 404, "a refused request created its batch");

    let k = 3;
    let body = json!({
        "batch_id": "over-nats",
        "prompts": crate::sampling::prompts(40, &[0.5], &json!({"run_ms": 20})),
        "group_size": 4,
        "target_groups": k,
        "max_groups_in_flight": 4,
    });
    let first = batch_request(&env, &body).await.expect("created");
    assert!(!first.duplicate);
    assert_eq!(first.batch.id, "over-nats");
    // The same request again (a retry after a lost reply) creates nothing.
    let again = batch_request(&env, &body).await.expect("answered again");
    assert!(again.duplicate);
    assert_eq!(again.batch.params, first.batch.params);
    // The same id with other parameters is a conflict, not a second batch.
    let mut other = body.clone();
    other["target_groups"] = json!(k + 1);
    let e = batch_request(&env, &other).await.expect_err("conflict");
    assert_eq!(e.status, 409, "{e:?}");

    let (view, _) =
        crate::sampling::wait_settled(&env, "over-nats", Duration::from_secs(120)).await;
    assert_eq!(
        view.batch.status,
        SamplingStatus::Complete,
        "{:?}",
        view.batch
    );
    let expected: Vec<(i64, String)> = view
        .groups
        .iter()
        .map(|g| (g.rank, g.group_id.clone()))
        .collect();
    assert_eq!(expected.len(), k);
    let key = |g: &AcceptedGroup| (g.rank, g.group_id.clone());

    // Live: each accepted group once, in rank order, with its G results.
    let mut heard = Vec::new();
    for _ in 0..k {
        let msg = tokio::time::timeout(Duration::from_secs(60), live.next())
            .await
            .expect("a group message")
            .unwrap();
        let group: AcceptedGroup = serde_json::from_slice(&msg.payload).unwrap();
        assert_eq!(group.results.len(), 4);
        heard.push(key(&group));
    }
    assert_eq!(heard, expected);

    // Replayed from the stream by a trainer that connects late: the same groups, and
    // nothing more (a group published twice is dropped by its message id).
    let stream = queue
        .jetstream()
        .get_stream(queue.subjects().stream("GROUPS"))
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: subject,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut replayed = Vec::new();
    let mut batch = consumer
        .fetch()
        .max_messages(k + 5)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    while let Some(msg) = batch.next().await {
        let msg = msg.unwrap();
        let group: AcceptedGroup = serde_json::from_slice(&msg.payload).unwrap();
        replayed.push(key(&group));
    }
    assert_eq!(replayed, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_version_announced_over_nats_is_the_one_http_reports() {
    let env = TestEnv::start(|_| {}).await;
    let subject = env.deps.queue.subjects().policy_announce();
    let announce = |v: serde_json::Value| {
        let (env, subject) = (&env, subject.clone());
        async move {
            let reply = raw_request(env, &subject, serde_json::to_vec(&v).unwrap()).await;
            decode_reply::<rollout::api::policy::PolicyView>(&reply.payload)
        }
    };
    let current = || async {
        let view = env.client.policy().await.unwrap();
        view.current.map(|p| p.version)
    };
    let view = announce(json!({"version": 4})).await.unwrap();
    assert_eq!(view.current.map(|p| p.version), Some(4));
    assert_eq!(view.changed, Some(true));
    assert_eq!(current().await, Some(4));
    // As over HTTP: an older version is refused with the status and the field.
    let refused = announce(json!({"version": 3})).await.unwrap_err();
    assert_eq!(
        (refused.status, refused.field.as_deref()),
        (409, Some("version"))
    );
    let bad = announce(json!({"version": 5, "mode": "sideways"}))
        .await
        .unwrap_err();
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(current().await, Some(4), "nothing changed");
    // A weight update over NATS (no backend registered: nothing to stop), resumed over
    // NATS as `POST /v1/policy/{N}/resume` would.
    let paused = announce(json!({"version": 5, "mode": "abort", "lease_s": 60}))
        .await
        .unwrap();
    assert_eq!(paused.pause.map(|p| p.version), Some(5));
    assert_eq!(current().await, Some(4), "current once resumed");
    let resume = env.deps.queue.subjects().policy_resume();
    let resumed = |v: serde_json::Value| {
        let (env, resume) = (&env, resume.clone());
        async move {
            let reply = raw_request(env, &resume, serde_json::to_vec(&v).unwrap()).await;
            decode_reply::<rollout::api::policy::PolicyView>(&reply.payload)
        }
    };
    let view = resumed(json!({"version": 5})).await.unwrap();
    assert_eq!(
        (view.current.map(|p| p.version), view.changed),
        (Some(5), Some(true))
    );
    assert_eq!(current().await, Some(5));
    let refused = resumed(json!({"version": 6})).await.unwrap_err();
    assert_eq!(
        (refused.status, refused.field.as_deref()),
        (409, Some("version"))
    );
}
