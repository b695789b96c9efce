//! The backend pool's records: `/v1/backends` over HTTP, and assignments in the store —
//! sticky per job, shared by a prompt group, away from unhealthy, excluded or other
//! models' backends, and deleted by the database whenever a job leaves RUN.

use std::time::Duration;

use rollout::domain::EpochMs;
use rollout::domain::backend::{ApiKey, BackendSpec, WireKind};
use rollout::domain::placement::{AffinityPolicy, AssignRequest, Assignment, Reason};
use rollout::domain::{Outcome, Stage, WorkMessage};
use rollout::scripted::{ScriptedConfig, ScriptedServer, demo};
use rollout::store::{Claim, FinishIf, NewJob, Store};

use crate::helpers::TestEnv;

fn spec(id: &str, model: &str) -> BackendSpec {
    BackendSpec {
        id: id.into(),
        url: format!("http://127.0.0.1:9/{id}"),
        kind: WireKind::Vllm,
        model: model.into(),
        tokenizer: "/models/m".into(),
        weight: 1.0,
        ..Default::default()
    }
}

async fn send(req: reqwest::RequestBuilder) -> (u16, serde_json::Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_are_registered_listed_and_removed_over_http() {
    // No health probes (they run beside the reconciler): these URLs answer nothing, and
    // a probe would mark the backend down between its registration and the checks.
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/backends", env.base);
    // Registration probes the backend at once: one that answers nothing is recorded
    // as down with the reason (and stays registered).
    let b = env.client.add_backend(&spec("gpu0", "m")).await.unwrap();
    assert_eq!((b.source.as_str(), b.healthy, b.active), ("api", false, 0));
    assert!(
        b.last_error.as_deref().unwrap().contains("cannot connect"),
        "{b:?}"
    );
    // A vLLM behind a key that serves the model under another name: the answer says
    // what is wrong until the backend is registered with both.
    let model = demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap();
    let mut cfg = ScriptedConfig::new(std::sync::Arc::new(model), Default::default());
    cfg.model_name = "Qwen/Qwen3-8B".into();
    cfg.api_key = Some("k3y".into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = ScriptedServer::spawn(listener, cfg).unwrap();
    let mut live = BackendSpec {
        url: server.url(),
        ..spec("live", "qwen3")
    };
    let b = env.client.add_backend(&live).await.unwrap();
    assert!(
        !b.healthy && b.last_error.as_deref().unwrap().contains("api_key"),
        "{b:?}"
    );
    live.api_key = Some(ApiKey("k3y".into()));
    let b = env.client.add_backend(&live).await.unwrap();
    let why = b.last_error.clone().unwrap();
    assert!(
        !b.healthy && why.contains("--served-model-name qwen3"),
        "{why}"
    );
    live.served_model_name = Some("Qwen/Qwen3-8B".into());
    let b = env.client.add_backend(&live).await.unwrap();
    assert!(b.healthy && b.last_error.is_none(), "{b:?}");
    // The key is never shown.
    assert!(b.api_key_set && b.spec.api_key.is_none(), "{b:?}");
    let (_, listed) = send(http.get(&url)).await;
    assert!(!listed.to_string().contains("k3y"), "{listed}");
    assert_eq!(listed[1]["api_key_set"], true, "{listed}");
    assert_eq!(listed[1]["served_model_name"], "Qwen/Qwen3-8B", "{listed}");
    env.client.remove_backend("live").await.unwrap();
    server.stop().await;
    let (status, one) = send(http.get(format!("{url}/gpu0"))).await;
    assert_eq!(status, 200);
    assert_eq!(one["model"], "m");
    assert_eq!(env.client.backends().await.unwrap().len(), 1);
    // Bad input names the field.
    for (body, field) in [
        (
            serde_json::json!({"id": "x", "url": "ftp://h", "kind": "vllm", "model": "m", "tokenizer": "t"}),
            "url",
        ),
        (
            serde_json::json!({"id": "x", "url": "http://h", "kind": "tgi", "model": "m", "tokenizer": "t"}),
            "kind",
        ),
        (
            serde_json::json!({"id": "a b", "url": "http://h", "kind": "vllm", "model": "m", "tokenizer": "t"}),
            "id",
        ),
        (
            serde_json::json!({"id": "x", "url": "http://h", "kind": "vllm", "model": "m", "tokenizer": "t", "weight": 0}),
            "weight",
        ),
        (
            serde_json::json!({"id": "x", "url": "http://h", "kind": "vllm", "model": "m", "tokenizer": "t", "gpus": 8}),
            "gpus",
        ),
        (
            serde_json::json!({"id": "x", "url": "http://h", "kind": "vllm", "model": "m", "tokenizer": "t", "api_key": "a b"}),
            "api_key",
        ),
        (
            serde_json::json!({"id": "x", "url": "http://h", "kind": "vllm", "model": "m", "tokenizer": "t", "served_model_name": " "}),
            "served_model_name",
        ),
        (
            serde_json::json!({"id": "x", "url": "http://h", "kind": "vllm", "model": "m", "tokenizer": "t", "logprobs_mode": "scaled"}),
            "logprobs_mode",
        ),
    ] {
        let (status, err) = send(http.post(&url).json(&body)).await;
        assert_eq!(status, 400, "{body}: {err}");
        assert!(
            err["field"].as_str().is_some_and(|f| f.contains(field))
                || err["error"].as_str().unwrap().contains(field),
            "{body}: {err}"
        );
    }
    assert_eq!(env.client.backends().await.unwrap().len(), 1);
    env.client.remove_backend("gpu0").await.unwrap();
    let (status, err) = send(http.delete(format!("{url}/gpu0"))).await;
    assert_eq!(status, 404);
    assert!(err["error"].as_str().unwrap().contains("gpu0"));
    let (status, _) = send(http.get(format!("{url}/gpu0"))).await;
    assert_eq!(status, 404);
}

/// Submits `n` jobs of group `group` and moves each into a claimed RUN stage; returns
/// their RUN stage entries and claim tokens.
async fn jobs_in_run(
    store: &dyn Store,
    batch: &str,
    group: &str,
    n: usize,
) -> Vec<(WorkMessage, i64)> {
    let jobs: Vec<NewJob> = (0..n)
        .map(|_| NewJob {
            id: uuid::Uuid::now_v7().to_string(),
            kind: "synthetic".into(),
            client_id: None,
            group_id: Some(group.into()),
            task: serde_json::json!({"kind": "synthetic", "spec": {}}),
        })
        .collect();
    let mut out = Vec::new();
    for s in store.submit(batch, &jobs, EpochMs::now()).await.unwrap() {
        let init = WorkMessage {
            job_id: s.id.clone(),
            stage: Stage::Init,
            epoch: s.epoch,
        };
        let now = EpochMs::now();
        let Claim::Started(job) = store
            .claim(&init, "n", now.after(Duration::from_secs(60)), now)
            .await
            .unwrap()
        else {
            panic!("INIT claim failed");
        };
        let run = store
            .advance(
                &init,
                job.attempts,
                &serde_json::json!({}),
                Some("any"),
                now,
            )
            .await
            .unwrap()
            .unwrap();
        let Claim::Started(job) = store
            .claim(&run, "n", now.after(Duration::from_secs(60)), now)
            .await
            .unwrap()
        else {
            panic!("RUN claim failed");
        };
        out.push((run, job.attempts));
    }
    out
}

/// Assigns a backend to `job` of `group` (panics on a database error or when no
/// backend is left).
async fn assign(
    store: &dyn Store,
    job: &str,
    group: &str,
    model: Option<&str>,
    exclude: &[&str],
    now: EpochMs,
) -> Assignment {
    store
        .assign_backend(&ask(job, group, model, exclude), now)
        .await
        .unwrap()
        .expect("a backend is left")
}

fn ask(job: &str, group: &str, model: Option<&str>, exclude: &[&str]) -> AssignRequest {
    AssignRequest {
        job_id: job.into(),
        group_key: Some(group.into()),
        model: model.map(str::to_string),
        exclude: exclude.iter().map(|s| s.to_string()).collect(),
        policy: AffinityPolicy::default(),
    }
}

async fn active(store: &dyn Store) -> Vec<(String, i64)> {
    store
        .backends()
        .await
        .unwrap()
        .into_iter()
        .map(|b| (b.spec.id, b.active))
        .collect()
}

/// Takes the first two jobs of `g1` and `g2` out of RUN in every way there is
/// (advanced to EVAL, failed, cancelled, sent back to INIT) and checks that each
/// released its backend.
async fn leave_run_every_way(
    store: &dyn Store,
    g1: &[(WorkMessage, i64)],
    g2: &[(WorkMessage, i64)],
) {
    // Leaving RUN in every way releases the assignment: advancing to EVAL, failing,
    // being cancelled, being sent back to INIT.
    let (msg, attempt) = &g1[0];
    store
        .advance(msg, *attempt, &serde_json::json!({}), None, EpochMs::now())
        .await
        .unwrap()
        .unwrap();
    let (msg, attempt) = &g1[1];
    let failed = Outcome::failed("x");
    let cond = FinishIf::Claimed {
        msg: msg.clone(),
        attempt: *attempt,
    };
    store
        .finish(&cond, &msg.job_id, &failed, EpochMs::now())
        .await
        .unwrap()
        .unwrap();
    let (msg, _) = &g2[0];
    let cancelled = Outcome::cancelled("cancelled");
    store
        .finish(&FinishIf::Live, &msg.job_id, &cancelled, EpochMs::now())
        .await
        .unwrap()
        .unwrap();
    let (msg, attempt) = &g2[1];
    store
        .restart(msg, *attempt, 5, true, EpochMs::now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        active(store).await,
        vec![("a".into(), 0), ("b".into(), 0), ("c".into(), 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignments_are_sticky_group_affine_and_released_when_jobs_leave_run() {
    // No health probes (they run beside the reconciler): these URLs answer nothing.
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let store = env.deps.store.as_ref();
    for b in [spec("a", "m"), spec("b", "m"), spec("c", "other")] {
        store
            .upsert_backend(&b, "api", EpochMs::now())
            .await
            .unwrap();
    }
    let g1 = jobs_in_run(store, "pool", "g1", 3).await;
    let g2 = jobs_in_run(store, "pool", "g2", 2).await;
    let id = |i: &(WorkMessage, i64)| i.0.job_id.clone();
    let now = EpochMs::now();

    // The first of g1 goes to the least loaded; its group follows; a second request of
    // a job keeps its backend.
    let first = assign(store, &id(&g1[0]), "pool/g1", Some("m"), &[], now).await;
    assert_eq!(
        (first.backend.id.as_str(), first.reason),
        ("a", Reason::LeastLoaded)
    );
    let second = assign(store, &id(&g1[1]), "pool/g1", Some("m"), &[], now).await;
    assert_eq!(
        (second.backend.id.as_str(), second.reason),
        ("a", Reason::Group)
    );
    let again = assign(store, &id(&g1[0]), "pool/g1", None, &[], now).await;
    assert_eq!(
        (again.backend.id.as_str(), again.reason),
        ("a", Reason::Sticky)
    );
    // Another group goes where the load is lower.
    let other = assign(store, &id(&g2[0]), "pool/g2", Some("m"), &[], now).await;
    assert_eq!(other.backend.id, "b");
    // A model only one backend serves.
    let c = assign(store, &id(&g2[1]), "pool/g2", Some("other"), &[], now).await;
    assert_eq!(c.backend.id, "c");
    // A failed backend is excluded and the move says where from.
    let moved = assign(store, &id(&g1[1]), "pool/g1", None, &["a"], now).await;
    assert_eq!(
        (moved.backend.id.as_str(), moved.previous.as_deref()),
        ("b", Some("a"))
    );
    // An unhealthy backend gets no new jobs; with none left there is no assignment.
    assert_eq!(
        store
            .set_backend_health("b", false, Some("down"), now)
            .await
            .unwrap(),
        Some(true)
    );
    let third = assign(store, &id(&g1[2]), "pool/g1", Some("m"), &[], now).await;
    assert_eq!(third.backend.id, "a");
    let none = store
        .assign_backend(&ask(&id(&g1[2]), "pool/g1", Some("m"), &["a"]), now)
        .await
        .unwrap();
    assert!(none.is_none());
    assert_eq!(
        active(store).await,
        vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 1)]
    );

    leave_run_every_way(store, &g1, &g2).await;
    let now = EpochMs::now();
    // A job requeued within RUN (its worker's lease lapsed) keeps its backend.
    let (msg, _) = &g1[2];
    assign(store, &msg.job_id, "pool/g1", Some("m"), &[], now).await;
    store.release(msg, g1[2].1, false, now).await.unwrap();
    assert_eq!(active(store).await[0], ("a".into(), 1));
    store.release_backend(&msg.job_id).await.unwrap();
    assert_eq!(active(store).await[0], ("a".into(), 0));

    // A group's backend is remembered after its samples end: a late sample goes back
    // to where the group's prompt is cached, though another backend is as idle.
    store
        .set_backend_health("b", true, None, now)
        .await
        .unwrap();
    let g3 = jobs_in_run(store, "pool", "g3", 2).await;
    let early = assign(store, &g3[0].0.job_id, "pool/g3", Some("m"), &[], now).await;
    store.release_backend(&g3[0].0.job_id).await.unwrap();
    let late = assign(store, &g3[1].0.job_id, "pool/g3", Some("m"), &[], now).await;
    assert_eq!(late.backend.id, early.backend.id);
    assert_eq!(late.reason, Reason::Group);
    // Old homes are forgotten.
    assert_eq!(
        store
            .forget_group_homes(EpochMs::now().after(Duration::from_millis(1)))
            .await
            .unwrap(),
        3
    );
}

/// A job that leaves RUN or ends (cancelled) while its worker is picking a backend gets
/// no assignment: one written after the job left RUN would never be released, and its
/// backend would count it as active for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_left_run_gets_no_assignment() {
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let store = env.deps.store.as_ref();
    store
        .upsert_backend(&spec("a", "m"), "api", EpochMs::now())
        .await
        .unwrap();
    let jobs = jobs_in_run(store, "left", "g", 3).await;
    // One cancelled, one advanced to EVAL, one still in RUN.
    let (cancelled, _) = &jobs[0];
    store
        .finish(
            &FinishIf::Live,
            &cancelled.job_id,
            &Outcome::cancelled("cancelled"),
            EpochMs::now(),
        )
        .await
        .unwrap()
        .unwrap();
    let (advanced, attempt) = &jobs[1];
    store
        .advance(
            advanced,
            *attempt,
            &serde_json::json!({}),
            None,
            EpochMs::now(),
        )
        .await
        .unwrap()
        .unwrap();
    let now = EpochMs::now();
    for (msg, _) in &jobs[..2] {
        let got = store
            .assign_backend(&ask(&msg.job_id, "left/g", Some("m"), &[]), now)
            .await
            .unwrap();
        assert!(got.is_none(), "{}: {got:?}", msg.job_id);
    }
    assert_eq!(active(store).await, vec![("a".into(), 0)]);
    let live = assign(store, &jobs[2].0.job_id, "left/g", Some("m"), &[], now).await;
    assert_eq!(live.backend.id, "a");
    assert_eq!(active(store).await, vec![("a".into(), 1)]);
}

/// Assignments leaked before (written for jobs that had already left RUN, which the
/// release trigger never saw) are deleted by the reconciler's next sweep; a running
/// job's assignment stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_releases_leaked_assignments() {
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let store = env.deps.store.as_ref();
    store
        .upsert_backend(&spec("a", "m"), "api", EpochMs::now())
        .await
        .unwrap();
    let jobs = jobs_in_run(store, "leak", "g", 2).await;
    let now = EpochMs::now();
    assign(store, &jobs[1].0.job_id, "leak/g", Some("m"), &[], now).await;
    let (ended, _) = &jobs[0];
    store
        .finish(
            &FinishIf::Live,
            &ended.job_id,
            &Outcome::cancelled("cancelled"),
            now,
        )
        .await
        .unwrap()
        .unwrap();
    // What the old assignment left behind: a row for the cancelled job.
    crate::helpers::sql(
        &env,
        &format!(
            "INSERT INTO backend_assignments (job_id, backend_id, group_key, model, \
             assigned_at) VALUES ('{}', 'a', 'leak/g', 'm', {})",
            ended.job_id, now.0
        ),
    )
    .await;
    assert_eq!(active(store).await, vec![("a".into(), 2)]);
    let settings = rollout::reconciler::SweepSettings::from_settings(&env.deps.settings);
    rollout::reconciler::sweep(store, &env.deps.queue, &settings)
        .await
        .unwrap();
    assert_eq!(active(store).await, vec![("a".into(), 1)]);
}
