//! The dashboard views (`migrations/views.sql`) answer on the database the tests run against
//! (SQLite, or Postgres when `ROLLOUT_TEST_DATABASE_URL` is set), with the same column
//! types on both (every whole number a 64-bit integer, so one Grafana query or one
//! decoder reads either), and agree with the API about a batch that really ran.

use std::collections::BTreeMap;
use std::time::Duration;

use rollout::domain::EpochMs;
use rollout::domain::backend::{BackendSpec, WireKind};
use rollout::domain::placement::{AffinityPolicy, AssignRequest};
use rollout::domain::{Status, Task};
use rollout::store::SandboxRecord;
use serde_json::{Value, json};

use crate::helpers::TestEnv;

/// The views, with the columns each must have (more may be added, never these removed).
const VIEWS: &[(&str, &[&str])] = &[
    (
        "batch_progress",
        &[
            "batch_id",
            "created_at",
            "submitted",
            "finished",
            "in_flight",
            "done",
            "failed",
            "cancelled",
            "timed_out",
            "rewarded",
            "reward_mean",
            "last_result_at",
        ],
    ),
    (
        "stage_queue",
        &["stage", "position", "queued", "running", "oldest_queued_at"],
    ),
    (
        "stage_timings",
        &[
            "job_id",
            "batch_id",
            "kind",
            "stage",
            "node",
            "queued_at",
            "started_at",
            "finished_at",
            "wait_ms",
            "work_ms",
            "job_finished_at",
        ],
    ),
    (
        "throughput_per_minute",
        &["minute", "status", "jobs", "reward_mean"],
    ),
    (
        "failures_by_reason",
        &[
            "status",
            "kind",
            "reason",
            "jobs",
            "last_at",
            "example_job_id",
        ],
    ),
    (
        "failed_results",
        &["job_id", "batch_id", "kind", "status", "reason", "ended_at"],
    ),
    (
        "backend_load",
        &[
            "backend_id",
            "kind",
            "model",
            "url",
            "weight",
            "healthy",
            "checked_at",
            "last_error",
            "source",
            "in_flight",
        ],
    ),
    (
        "sandbox_counts",
        &[
            "node",
            "backend",
            "sandboxes",
            "oldest_created_at",
            "earliest_lease_until",
        ],
    ),
    (
        "sampling_progress",
        &[
            "batch_id",
            "status",
            "reason",
            "group_size",
            "target_groups",
            "informative",
            "surplus",
            "uniform",
            "incomplete",
            "cancelled_groups",
            "groups_launched",
            "groups_decided",
            "samples_completed",
            "jobs_saved",
            "sandbox_ms_used",
            "sandbox_ms_saved",
            "created_at",
            "ended_at",
        ],
    ),
];

/// A connection to the test's database, whichever kind it is.
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn connect(url: &str) -> Db {
        if url.starts_with("postgres") {
            Db::Postgres(sqlx::PgPool::connect(url).await.unwrap())
        } else {
            Db::Sqlite(sqlx::SqlitePool::connect(url).await.unwrap())
        }
    }

    /// The rows of `sql`, each as a JSON object.
    async fn rows(&self, sql: &str) -> Vec<BTreeMap<String, Value>> {
        let q = sqlx::AssertSqlSafe(sql.to_string());
        match self {
            Db::Sqlite(p) => sqlx::query(q)
                .fetch_all(p)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(row_json)
                .collect(),
            Db::Postgres(p) => sqlx::query(q)
                .fetch_all(p)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .iter()
                .map(row_json)
                .collect(),
        }
    }
}

/// One row as JSON: each column decoded as a 64-bit integer, a double or text (or
/// NULL). A column of any other type (a Postgres `integer` or `numeric`, say) panics:
/// the views promise those three.
fn row_json<R>(row: &R) -> BTreeMap<String, Value>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    use sqlx::Column;
    row.columns()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let v = if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
                json!(v)
            } else if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
                json!(v)
            } else if let Ok(v) = row.try_get::<Option<String>, _>(i) {
                json!(v)
            } else {
                panic!(
                    "column {} is not a 64-bit integer, a double or text",
                    c.name()
                )
            };
            (c.name().to_string(), v)
        })
        .collect()
}

fn synthetic(spec: Value) -> Task {
    Task::new("synthetic", spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_views_answer_and_agree_with_the_api() {
    // No prober: the registered backend's health is set by the test.
    let env = TestEnv::start(|s| s.reconciler.enabled = false).await;
    let db = Db::connect(&env.deps.settings.database.url).await;
    views_answer_when_empty(&db).await;
    batch_views_agree_with_the_api(&env, &db).await;
    backend_and_sandbox_views(&env, &db).await;
    sampling_view_agrees_with_the_api(&env, &db).await;
    the_dashboard_endpoint_reads_the_views(&env, &db).await;
    grafana_panels_run(&db).await;
}

/// `GET /v1/dashboard` (the status page's one read) answers with the views' rows as
/// they are, and its stage percentiles cover every stage that finished in the window.
async fn the_dashboard_endpoint_reads_the_views(env: &TestEnv, db: &Db) {
    let d = serde_json::to_value(env.client.dashboard().await.unwrap()).unwrap();
    let rows =
        |v: &Value| -> Vec<BTreeMap<String, Value>> { serde_json::from_value(v.clone()).unwrap() };
    for (field, sql) in [
        (
            "batches",
            "SELECT * FROM batch_progress ORDER BY created_at DESC, batch_id",
        ),
        ("backends", "SELECT * FROM backend_load ORDER BY backend_id"),
        (
            "failures",
            "SELECT * FROM failures_by_reason ORDER BY last_at DESC, reason",
        ),
        (
            "sandboxes",
            "SELECT * FROM sandbox_counts ORDER BY node, backend",
        ),
        (
            "sampling",
            "SELECT * FROM sampling_progress ORDER BY created_at DESC, batch_id",
        ),
    ] {
        let view = db.rows(sql).await;
        assert!(!view.is_empty(), "{field}: the test made no rows");
        assert_eq!(rows(&d[field]), view, "{field}");
    }
    let queues = db.rows("SELECT * FROM stage_queue ORDER BY position").await;
    let stages = d["stages"].as_array().unwrap();
    assert_eq!(
        stages
            .iter()
            .map(|s| rows(&json!([s["queue"]]))[0].clone())
            .collect::<Vec<_>>(),
        queues
    );
    let finished = db
        .rows("SELECT stage, COUNT(*) AS n FROM stage_timings GROUP BY stage")
        .await;
    for s in stages {
        let stage = &s["queue"]["stage"];
        let n = finished
            .iter()
            .find(|r| &r["stage"] == stage)
            .map_or(json!(0), |r| r["n"].clone());
        assert_eq!(s["work_ms"]["count"], n, "{stage}");
        assert_eq!(s["wait_ms"]["count"], n, "{stage}");
        if n != 0 {
            let (p50, p99) = (s["work_ms"]["p50"].as_f64(), s["work_ms"]["p99"].as_f64());
            assert!(p50.unwrap() <= p99.unwrap(), "{s}");
        }
    }
    let minutes = db
        .rows("SELECT CAST(SUM(jobs) AS BIGINT) AS n FROM throughput_per_minute")
        .await;
    assert_eq!(d["throughput"]["jobs"], minutes[0]["n"]);
    // Bad input names its parameter.
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/dashboard?window_ms=-1", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["field"], "window_ms", "{body}");
}

/// Every view answers, with its documented columns, on an empty database (and
/// `stage_queue` has its three rows).
async fn views_answer_when_empty(db: &Db) {
    for (view, columns) in VIEWS {
        let sql = format!("SELECT * FROM {view}");
        let rows = db.rows(&sql).await;
        if *view == "stage_queue" {
            assert_eq!(rows.len(), 3, "{rows:?}");
        } else {
            assert!(rows.is_empty(), "{view}: {rows:?}");
        }
        // The column list of an empty answer: ask for each column by name.
        let named = format!("SELECT {} FROM {view}", columns.join(", "));
        db.rows(&named).await;
    }
}

/// A batch of four scored and two failing jobs, seen while queued and once finished.
async fn batch_views_agree_with_the_api(env: &TestEnv, db: &Db) {
    // A batch queued with no workers yet: six jobs waiting in INIT.
    let mut tasks = Vec::new();
    for reward in [1.0, 1.0, 0.0, 1.0] {
        tasks.push(synthetic(json!({"reward": reward})));
    }
    for _ in 0..2 {
        tasks.push(synthetic(
            json!({"fail_in": "run", "message": "the synthetic tool broke"}),
        ));
    }
    env.submit(&tasks, "views").await;
    let queue = db.rows("SELECT * FROM stage_queue ORDER BY position").await;
    let stages: Vec<_> = queue.iter().map(|r| r["stage"].clone()).collect();
    assert_eq!(stages, [json!("init"), json!("run"), json!("eval")]);
    assert_eq!(queue[0]["queued"], 6, "{queue:?}");
    assert_eq!(queue[0]["running"], 0);
    assert!(queue[0]["oldest_queued_at"].as_i64().unwrap() > 0);
    assert_eq!(
        (&queue[1]["queued"], &queue[2]["queued"]),
        (&json!(0), &json!(0))
    );
    assert!(queue[1]["oldest_queued_at"].is_null());

    env.workers_in_process(2);
    let results = env
        .wait_results("views", tasks.len(), Duration::from_secs(60))
        .await;
    assert_eq!(
        results.iter().filter(|r| r.status == Status::Done).count(),
        4
    );
    let status = env.client.status(Some("views")).await.unwrap();
    let batch = status.batch.expect("the batch's counters");

    let progress = db
        .rows("SELECT * FROM batch_progress WHERE batch_id = 'views'")
        .await;
    let p = &progress[0];
    assert_eq!(p["submitted"], batch.submitted);
    assert_eq!(p["finished"], batch.finished);
    assert_eq!((&p["done"], &p["failed"]), (&json!(4), &json!(2)));
    assert_eq!(p["in_flight"], 0);
    assert_eq!(p["rewarded"], 4);
    assert_eq!(p["reward_mean"], 0.75);
    let last = results.iter().map(|r| r.created_at).max().unwrap();
    assert_eq!(p["last_result_at"], last);

    let queue = db.rows("SELECT * FROM stage_queue").await;
    assert!(
        queue.iter().all(|r| r["queued"] == 0 && r["running"] == 0),
        "{queue:?}"
    );

    // Every job's INIT and RUN finished (the failures in RUN), EVAL only for the four.
    let timings = db
        .rows("SELECT stage, COUNT(*) AS n, MIN(wait_ms) AS min_wait, MIN(work_ms) AS min_work FROM stage_timings WHERE batch_id = 'views' GROUP BY stage ORDER BY stage")
        .await;
    let counts: Vec<(Value, Value)> = timings
        .iter()
        .map(|r| (r["stage"].clone(), r["n"].clone()))
        .collect();
    assert_eq!(
        counts,
        [
            (json!("eval"), json!(4)),
            (json!("init"), json!(6)),
            (json!("run"), json!(6))
        ]
    );
    for r in &timings {
        assert!(r["min_wait"].as_i64().unwrap() >= 0, "{r:?}");
        assert!(r["min_work"].as_i64().unwrap() >= 0, "{r:?}");
    }
    // Each stage row carries its job's end: the time of the job's result.
    let ends = db
        .rows("SELECT job_id, MIN(job_finished_at) AS lo, MAX(job_finished_at) AS hi FROM stage_timings WHERE batch_id = 'views' GROUP BY job_id")
        .await;
    assert_eq!(ends.len(), results.len());
    for e in &ends {
        let r = results
            .iter()
            .find(|r| json!(r.job_id) == e["job_id"])
            .unwrap();
        assert_eq!(
            (&e["lo"], &e["hi"]),
            (&json!(r.created_at), &json!(r.created_at))
        );
    }

    result_views_agree(db, &results).await;
}

/// `throughput_per_minute` and `failures_by_reason` after the batch of
/// [`batch_views_agree_with_the_api`].
async fn result_views_agree(db: &Db, results: &[rollout::domain::JobResult]) {
    let minutes = db.rows("SELECT * FROM throughput_per_minute").await;
    let per_status = |s: &str| -> i64 {
        minutes
            .iter()
            .filter(|r| r["status"] == s)
            .map(|r| r["jobs"].as_i64().unwrap())
            .sum()
    };
    assert_eq!((per_status("done"), per_status("failed")), (4, 2));
    assert!(
        minutes
            .iter()
            .all(|r| r["minute"].as_i64().unwrap() % 60_000 == 0)
    );

    let failures = db.rows("SELECT * FROM failures_by_reason").await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    let f = &failures[0];
    assert_eq!(
        (&f["status"], &f["kind"]),
        (&json!("failed"), &json!("synthetic"))
    );
    assert!(
        f["reason"]
            .as_str()
            .unwrap()
            .contains("the synthetic tool broke"),
        "{f:?}"
    );
    assert_eq!(f["jobs"], 2);
    let example = f["example_job_id"].as_str().unwrap();
    assert!(
        results
            .iter()
            .any(|r| r.job_id == example && r.status == Status::Failed)
    );

    // `failed_results` has each of those jobs, under the same reason, at its end.
    let failed = db
        .rows("SELECT * FROM failed_results ORDER BY job_id")
        .await;
    let mut expected: Vec<_> = results
        .iter()
        .filter(|r| r.status == Status::Failed)
        .map(|r| (json!(r.job_id), json!(r.created_at)))
        .collect();
    expected.sort_by_key(|(id, _)| id.as_str().unwrap().to_string());
    let got: Vec<_> = failed
        .iter()
        .map(|r| (r["job_id"].clone(), r["ended_at"].clone()))
        .collect();
    assert_eq!(got, expected);
    assert!(
        failed.iter().all(|r| r["reason"] == f["reason"]
            && r["kind"] == "synthetic"
            && r["batch_id"] == "views"),
        "{failed:?}"
    );
}

/// `backend_load` and `sandbox_counts` against records made through the store.
async fn backend_and_sandbox_views(env: &TestEnv, db: &Db) {
    // A backend, healthy, with two RUN jobs assigned: its load is two, as the API says.
    let store = env.deps.store.clone();
    let spec = BackendSpec {
        id: "gpu0".into(),
        url: "http://127.0.0.1:9/gpu0".into(),
        kind: WireKind::Vllm,
        model: "m".into(),
        tokenizer: "/models/m".into(),
        weight: 1.0,
        api_key: Some(rollout::domain::backend::ApiKey("secret-key".into())),
        ..Default::default()
    };
    env.client.add_backend(&spec).await.unwrap();
    let now = EpochMs::now();
    store
        .set_backend_health("gpu0", true, None, now)
        .await
        .unwrap();
    for job in ["a", "b"] {
        let req = AssignRequest {
            job_id: job.into(),
            group_key: None,
            model: Some("m".into()),
            exclude: Vec::new(),
            policy: AffinityPolicy::default(),
        };
        store.assign_backend(&req, now).await.unwrap().unwrap();
    }
    let load = db.rows("SELECT * FROM backend_load").await;
    assert_eq!(load.len(), 1);
    let api = env.client.backends().await.unwrap();
    assert_eq!(load[0]["in_flight"], api[0].active);
    assert_eq!(load[0]["in_flight"], 2);
    assert_eq!(load[0]["healthy"], 1);
    assert_eq!(load[0]["weight"], 1.0);
    let text = serde_json::to_string(&load).unwrap();
    assert!(!text.contains("secret-key"), "the view shows the API key");

    // Two RUN sandboxes on one node, one on another.
    for (job, node) in [("s1", "n1"), ("s2", "n1"), ("s3", "n2")] {
        store
            .put_sandbox(&SandboxRecord {
                job_id: job.into(),
                node: node.into(),
                runtime: "bwrap".into(),
                dir: format!("/tmp/{job}"),
                socket: format!("/tmp/{job}/s"),
                lease_until: now.after(Duration::from_secs(60)),
                created_at: now,
            })
            .await
            .unwrap();
    }
    let boxes = db
        .rows("SELECT node, sandboxes FROM sandbox_counts ORDER BY node")
        .await;
    assert_eq!(
        boxes
            .iter()
            .map(|r| (r["node"].clone(), r["sandboxes"].clone()))
            .collect::<Vec<_>>(),
        [(json!("n1"), json!(2)), (json!("n2"), json!(1))]
    );
}

/// A dynamic-sampling batch: the view shows the counters the API shows.
async fn sampling_view_agrees_with_the_api(env: &TestEnv, db: &Db) {
    let prompts: Vec<Value> = (0..4)
        .map(|i| json!({"kind": "synthetic", "spec": {"pass_rate": 0.5, "seed": i}}))
        .collect();
    let body = json!({
        "batch_id": "views-dapo",
        "prompts": prompts,
        "group_size": 2,
        "target_groups": 1,
        "max_groups_in_flight": 2,
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/batches", env.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let (view, _) = crate::sampling::wait_settled(env, "views-dapo", Duration::from_secs(60)).await;
    let sampling = db
        .rows("SELECT * FROM sampling_progress WHERE batch_id = 'views-dapo'")
        .await;
    let s = &sampling[0];
    let c = &view.batch.counters;
    assert_eq!(s["group_size"], 2);
    assert_eq!(s["target_groups"], 1);
    assert_eq!(s["groups_launched"], c.groups_launched);
    assert_eq!(s["informative"], c.informative);
    assert_eq!(s["samples_completed"], c.samples_completed);
    assert_eq!(s["status"], json!(view.batch.status));
}

/// The Grafana dashboards (deploy/grafana, generated by their script and up to date)
/// read these views: `rollout.json` through a Postgres data source, `rollout-sqlite.json`
/// through the SQLite plugin. Each SQL panel of the one for this test's database runs
/// on the test's data and shows something. The training panels read the results'
/// summary columns, which synthetic tasks leave empty: the test gives two results an
/// episode's summary first (what an agent's episode writes there is checked in
/// `training.rs`).
async fn grafana_panels_run(db: &Db) {
    let check = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/make-grafana-dashboard.py"
        ))
        .arg("--check")
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    db.rows(
        "UPDATE results SET finish_reason = 'answered', turns = 2, response_tokens = 40, \
         tool_calls = 2, tool_errors = 1, policy_version = 3 \
         WHERE seq IN (SELECT seq FROM results ORDER BY seq LIMIT 2) RETURNING seq",
    )
    .await;
    let (file, panels) = match db {
        Db::Postgres(_) => (
            "rollout.json",
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/deploy/grafana/rollout.json"
            )),
        ),
        Db::Sqlite(_) => (
            "rollout-sqlite.json",
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/deploy/grafana/rollout-sqlite.json"
            )),
        ),
    };
    let dashboard: Value = serde_json::from_str(panels).unwrap();
    let mut ran = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let raw = match db {
                Db::Postgres(_) => target["rawSql"].as_str(),
                Db::Sqlite(_) => target["queryText"].as_str(),
            };
            let Some(raw) = raw else {
                continue;
            };
            let sql = format!("SELECT count(*) AS n FROM ({}) q", grafana_macros(raw));
            let rows = db.rows(&sql).await;
            let n = rows[0]["n"].as_i64().unwrap();
            assert!(
                n > 0,
                "{file}: panel {} shows nothing: {sql}",
                panel["title"]
            );
            ran += 1;
        }
    }
    assert_eq!(ran, 12, "{file}: SQL panels run");
}

/// `sql` with Grafana's time-range macros expanded as Grafana (or the SQLite plugin)
/// would for a range from a day ago to an hour ahead (whole epoch seconds).
fn grafana_macros(sql: &str) -> String {
    let now = EpochMs::now().as_millis() / 1000;
    assert!(
        !sql.contains("$__timeFilter"),
        "a filter no index can use: {sql}"
    );
    sql.replace("$__unixEpochFrom()", &(now - 86_400).to_string())
        .replace("$__unixEpochTo()", &(now + 3_600).to_string())
        // The SQLite plugin's range, in epoch ms.
        .replace("$__from", &((now - 86_400) * 1000).to_string())
        .replace("$__to", &((now + 3_600) * 1000).to_string())
}
