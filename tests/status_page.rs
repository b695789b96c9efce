//! The status page in a real browser: headless Chromium (Debian's `chromium`, driven
//! through `chromedriver`; `scripts/test.sh` installs both) against a live `rollout up`
//! with the stand-in inference server and a gateway token.
//!
//! The page asks for the token, then shows what the API says: every batch's counters,
//! the stage queues, the backends and the failures are read off the page and compared
//! with `GET /v1/dashboard`. A click on a batch lists its jobs, a click on a job shows
//! its trajectory turn by turn (model text, tool calls and observations, token counts,
//! reward, drift) as the API holds it. A job whose output is HTML with script in it is
//! shown as text and runs nothing. Screenshots of the overview and of a job are kept
//! under `target/tmp/status-page/` (`CARGO_TARGET_TMPDIR`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use rollout::client::{Client, read_tasks_jsonl};
use rollout::domain::{Status, Task};
use serde_json::{Value, json};

use host::{free_port, shared_tempdir, which};
use leftovers::{Service as Proc, assert_nothing_left};
use rollout_test_support::eventually::eventually;
use rollout_test_support::{host, leftovers};

const TOKEN: &str = "status-page-test-token-0123456789";

/// Waits for a line starting with `prefix` in the file at `path`; returns the rest.
async fn wait_line(path: &Path, prefix: &str) -> String {
    let what = format!("a `{prefix}` line in {}", path.display());
    eventually(&what, Duration::from_secs(30), || async {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|rest| rest.trim().to_string())
            .ok_or("not yet")
    })
    .await
}

/// The stand-in inference server and `rollout up` in `dir`, with a gateway token;
/// stopped with SIGTERM when dropped (`rollout up` first).
struct Service {
    _procs: Vec<Proc>,
    url: String,
    log: PathBuf,
}

impl Service {
    async fn start(dir: &Path) -> Service {
        let bin = |name: &str| -> PathBuf {
            match name {
                "rollout" => env!("CARGO_BIN_EXE_rollout").into(),
                _ => env!("CARGO_BIN_EXE_rollout-scripted-llm").into(),
            }
        };
        let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agent-policy.json");
        let model = dir.join("model");
        let ok = Command::new(bin("scripted"))
            .args(["write-model", model.to_str().unwrap(), "--policy"])
            .arg(&policy)
            .status()
            .unwrap();
        assert!(ok.success(), "rollout-scripted-llm write-model failed");
        let out = dir.join("scripted.out");
        let scripted = Command::new(bin("scripted"))
            .args(["serve", "--listen", "127.0.0.1:0", "--model"])
            .arg(&model)
            .arg("--policy")
            .arg(&policy)
            .args(["--seed", "0", "--token-us", "100"])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(dir.join("scripted.log")).unwrap())
            .spawn()
            .unwrap();
        let scripted = Proc::new(scripted, "the stand-in inference server");
        let backend = wait_line(&out, "listening on ").await;
        let port = free_port();
        let config = dir.join("rollout.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{state}\"\n[database]\nurl = \"sqlite://{db}\"\n\
                 [gateway]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\n\
                 [nats]\nurl = \"nats://127.0.0.1:{nats}\"\nprefix = \"page\"\n\
                 [[backends]]\nid = \"scripted\"\nurl = \"{backend}\"\nkind = \"vllm\"\n\
                 model = \"scripted\"\ntokenizer = \"{model}\"\n",
                state = dir.join("state").display(),
                db = dir.join("rollout.db").display(),
                nats = free_port(),
                model = model.display(),
            ),
        )
        .unwrap();
        let log = dir.join("up.log");
        let up = Command::new(bin("rollout"))
            .arg("--config")
            .arg(&config)
            .args(["up", "--workers", "2", "--logs-on-screen"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut up = Proc::new(up, "rollout up");
        let url = format!("http://127.0.0.1:{port}");
        let health = format!("{url}/healthz");
        eventually("rollout up answers", Duration::from_secs(90), || {
            assert!(up.try_wait().is_none(), "rollout up exited: {}", tail(&log));
            let (health, log) = (health.clone(), log.clone());
            async move {
                match reqwest::get(&health).await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    other => Err(format!("{other:?}\n{}", tail(&log))),
                }
            }
        })
        .await;
        Service {
            _procs: vec![up, scripted],
            url,
            log,
        }
    }

    fn client(&self) -> Client {
        Client::new(&self.url).with_token(Some(TOKEN.into()))
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text[text.len().saturating_sub(4000)..].to_string()
}

/// Four agent episodes from the examples, a shell job whose output is hostile HTML, and
/// a shell job that fails at its sandbox's setup.
fn tasks() -> (Vec<Task>, Vec<Task>) {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agent.jsonl"))
            .unwrap();
    let agents: Vec<Task> = read_tasks_jsonl(&text)
        .unwrap()
        .into_iter()
        .take(4)
        .collect();
    let hostile = Task::new(
        "shell",
        json!({
            "steps": [{"tool": "bash", "args": {"command":
                "echo '<img src=x onerror=\"document.title=`pwned`\"><script>document.title=\"pwned\"</script>'"}}],
            "check": {"command": "true"},
        }),
    );
    let broken = Task::new(
        "shell",
        json!({
            "sandbox": {"setup": ["echo the task is broken >&2; exit 3"]},
            "steps": [],
            "check": {"command": "true"},
        }),
    );
    (agents, vec![hostile, broken])
}

/// Waits until every job of `batch` (of `n`) has a result.
async fn wait_batch(client: &Client, batch: &str, n: usize, log: &Path) {
    let what = format!("every job of batch {batch} ended");
    eventually(&what, Duration::from_secs(300), || async {
        let jobs = client.batch_jobs(batch).await.map_err(|e| e.to_string())?;
        if jobs.len() == n && jobs.iter().all(|j| j.status.is_terminal()) {
            Ok(())
        } else {
            Err(format!("{jobs:?}\n{}", tail(log)))
        }
    })
    .await;
}

/// A dynamic-sampling batch of the agent prompts (`page-sampling`), run to its end
/// and every sample of it too.
async fn run_sampling_batch(client: &Client, agents: &[Task], log: &Path) {
    let prompts: Vec<Task> = agents
        .iter()
        .cloned()
        .map(|mut t| {
            t.client_id = None;
            t.group_id = None;
            t
        })
        .collect();
    let req: rollout::api::batches::BatchRequest = serde_json::from_value(json!({
        "batch_id": "page-sampling", "prompts": prompts, "group_size": 2, "target_groups": 1,
    }))
    .unwrap();
    client.submit_sampling(&req).await.unwrap();
    let what = "the sampling batch ended and every sample of it too";
    eventually(what, Duration::from_secs(300), || async {
        let v = client
            .sampling_batch("page-sampling")
            .await
            .map_err(|e| e.to_string())?;
        let jobs = client
            .batch_jobs("page-sampling")
            .await
            .map_err(|e| e.to_string())?;
        let ended = jobs.iter().all(|j| j.status.is_terminal());
        if v.batch.status != rollout::domain::sampling::SamplingStatus::Running && ended {
            Ok(())
        } else {
            Err(format!("{:?}\n{}", v.batch, tail(log)))
        }
    })
    .await;
}

/// chromedriver on a free port, and a headless Chromium session through it.
async fn browser() -> (Proc, Browser) {
    let driver = which("chromedriver").unwrap_or_else(|| {
        panic!(
            "chromedriver is not installed: run scripts/test.sh, or apt-get install chromium chromium-driver"
        )
    });
    let port = free_port();
    let proc = Proc::new(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        "chromedriver",
    );
    let mut caps = serde_json::Map::new();
    let mut chrome = json!({"args": [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-extensions", "--no-first-run",
        "--window-size=1400,1000",
    ]});
    if let Some(bin) = which("chromium") {
        chrome["binary"] = json!(bin);
    }
    caps.insert("goog:chromeOptions".into(), chrome);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let webdriver = format!("http://127.0.0.1:{port}");
    let browser = eventually(
        "headless Chromium started through chromedriver",
        Duration::from_secs(30),
        || async {
            ClientBuilder::new(connector.clone())
                .capabilities(caps.clone())
                .connect(&webdriver)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    (proc, browser)
}

/// The `data-value` of the cell `field` in the row matched by `row`.
async fn value(b: &Browser, row: &str, field: &str) -> String {
    let css = format!("{row} [data-field=\"{field}\"]");
    let cell = b
        .find(Locator::Css(&css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}` on the page: {e}"));
    cell.attr("data-value").await.unwrap().unwrap_or_default()
}

/// Waits until the page has drawn the view of `hash`.
async fn loaded(b: &Browser, hash: &str) {
    let css = format!("body[data-loaded=\"{hash}\"]");
    b.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css(&css))
        .await
        .unwrap_or_else(|e| panic!("the page did not draw `{hash}`: {e}"));
}

async fn screenshot(b: &Browser, name: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&dir).unwrap();
    let png = b.screenshot().await.unwrap();
    let path = dir.join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

/// An element's text exactly as the page holds it (`textContent`: tabs and line breaks
/// kept, unlike the rendered text WebDriver reports).
async fn content(el: &fantoccini::elements::Element) -> String {
    el.prop("textContent").await.unwrap().unwrap_or_default()
}

/// A JSON number as the page writes it (JavaScript's `String(x)`: a whole double
/// without `.0`, otherwise the shortest form that reads back the same, as serde's).
fn num(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap();
            if x.fract() == 0.0 && x.abs() < 1e15 {
                format!("{x:.0}")
            } else {
                v.to_string()
            }
        }
        v => v.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_what_the_api_says_and_a_job_turn_by_turn() {
    let dir = shared_tempdir();
    let svc = Service::start(dir.path()).await;
    let client = svc.client();
    let (agents, shells) = tasks();
    client.submit(&agents, Some("page-agents")).await.unwrap();
    client.submit(&shells, Some("page-shell")).await.unwrap();
    wait_batch(&client, "page-agents", agents.len(), &svc.log).await;
    wait_batch(&client, "page-shell", shells.len(), &svc.log).await;
    run_sampling_batch(&client, &agents, &svc.log).await;

    client.announce_policy(3).await.unwrap();
    let (_driver, b) = browser().await;
    b.goto(&format!("{}/", svc.url)).await.unwrap();
    // Without the token the page reads nothing and asks for it.
    let form = b
        .wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("#token-input"))
        .await
        .unwrap();
    b.wait()
        .at_most(Duration::from_secs(30))
        .for_element(Locator::Css("#token-form:not([hidden])"))
        .await
        .unwrap();
    form.send_keys(TOKEN).await.unwrap();
    b.find(Locator::Css("#token button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    loaded(&b, "/").await;
    overview_matches_the_api(&b, &client).await;
    screenshot(&b, "overview.png").await;

    // Into the agent batch, then into one of its jobs.
    b.find(Locator::Css("tr[data-batch=\"page-agents\"] a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    loaded(&b, "/batches/page-agents").await;
    let jobs = client.batch_jobs("page-agents").await.unwrap();
    assert_eq!(
        b.find_all(Locator::Css("#jobs tbody tr"))
            .await
            .unwrap()
            .len(),
        jobs.len()
    );
    batch_jobs_match(&b, &jobs).await;
    let job = &jobs[0];
    b.find(Locator::Css(&format!("tr[data-job=\"{}\"] a", job.id)))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    loaded(&b, &format!("/jobs/{}", job.id)).await;
    job_matches_the_api(&b, &client, &job.id).await;
    screenshot(&b, "job.png").await;

    let shell_jobs = client.batch_jobs("page-shell").await.unwrap();
    failed_sampling_and_training_views(&b, &client, &svc.url, &shell_jobs).await;

    // The hostile job's output is on the page as text, and none of it ran.
    let hostile = shell_jobs
        .iter()
        .find(|j| j.status == Status::Done)
        .expect("the hostile-output job is done");
    b.goto(&format!("{}/#/jobs/{}", svc.url, hostile.id))
        .await
        .unwrap();
    loaded(&b, &format!("/jobs/{}", hostile.id)).await;
    let shown = content(
        &b.find(Locator::Css("#trajectory .observation"))
            .await
            .unwrap(),
    )
    .await;
    assert!(
        shown.contains("<script>document.title=\"pwned\"</script>"),
        "{shown}"
    );
    assert!(
        b.find_all(Locator::Css("#view img, #view script"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_ne!(b.title().await.unwrap(), "pwned");
    b.close().await.unwrap();
    // Stopped as an operator stops it, the service leaves nothing of its own behind.
    drop(svc);
    assert_nothing_left(
        dir.path(),
        "the status page's rollout up, stopped with SIGTERM",
    )
    .await;
}

/// Each job's reward and finish reason in the batch's job list, as the API lists them.
async fn batch_jobs_match(b: &Browser, jobs: &[rollout::domain::Job]) {
    for j in jobs {
        let row = format!("#jobs tr[data-job=\"{}\"]", j.id);
        assert_eq!(
            value(b, &row, "reward").await,
            num(&json!(j.reward)),
            "{row}"
        );
        assert!(j.reward.is_some(), "{j:?}");
        let shown = b
            .find(Locator::Css(&format!(
                "{row} [data-field=\"finish_reason\"]"
            )))
            .await
            .unwrap();
        assert_eq!(
            content(&shown).await,
            j.finish_reason.clone().unwrap_or_default()
        );
    }
}

/// The failed job's view, the sampling batch's groups and the training tab, each
/// against the API.
async fn failed_sampling_and_training_views(
    b: &Browser,
    client: &Client,
    url: &str,
    shell_jobs: &[rollout::domain::Job],
) {
    // The failed job: where it failed, with the events before the end.
    let broken = shell_jobs
        .iter()
        .find(|j| j.status == Status::Failed)
        .expect("the broken job failed");
    b.goto(&format!("{}/#/jobs/{}", url, broken.id))
        .await
        .unwrap();
    loaded(b, &format!("/jobs/{}", broken.id)).await;
    failed_job_matches_the_api(b, client, &broken.id).await;

    // The sampling batch: its verdict counts and its groups, each sample's reward.
    b.goto(&format!("{}/#/batches/page-sampling", url))
        .await
        .unwrap();
    loaded(b, "/batches/page-sampling").await;
    groups_match_the_api(b, client).await;
    screenshot(b, "sampling.png").await;

    // The training tab: every number and every chart mark against GET /v1/training.
    b.goto(&format!("{}/#/training", url)).await.unwrap();
    loaded(b, "/training").await;
    training_matches_the_api(b, client).await;
    screenshot(b, "training.png").await;
}

/// Every number the overview shows for batches, stages, backends and failures is the
/// API's.
async fn overview_matches_the_api(b: &Browser, client: &Client) {
    let d = serde_json::to_value(client.dashboard().await.unwrap()).unwrap();
    let batches = d["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 3, "{d:#}");
    for batch in batches {
        let row = format!(
            "#batches tr[data-batch=\"{}\"]",
            batch["batch_id"].as_str().unwrap()
        );
        for field in [
            "submitted",
            "finished",
            "in_flight",
            "done",
            "failed",
            "cancelled",
            "timed_out",
            "stale",
        ] {
            assert_eq!(
                value(b, &row, field).await,
                num(&batch[field]),
                "{row} {field}"
            );
        }
    }
    // The policy version the trainer announced.
    let policy = b.find(Locator::Css("#card-policy")).await.unwrap();
    assert_eq!(
        policy.attr("data-value").await.unwrap().unwrap_or_default(),
        num(&d["policy"]["current"]["version"])
    );
    assert!(
        content(&policy).await.contains("v3"),
        "{}",
        content(&policy).await
    );
    for stage in d["stages"].as_array().unwrap() {
        let row = format!(
            "#stages tr[data-stage=\"{}\"]",
            stage["queue"]["stage"].as_str().unwrap()
        );
        assert_eq!(
            value(b, &row, "queued").await,
            num(&stage["queue"]["queued"]),
            "{row}"
        );
        assert_eq!(
            value(b, &row, "running").await,
            num(&stage["queue"]["running"]),
            "{row}"
        );
        assert_eq!(
            value(b, &row, "finished").await,
            num(&stage["work_ms"]["count"]),
            "{row}"
        );
    }
    let backend = &d["backends"][0];
    assert_eq!(backend["backend_id"], "scripted");
    let row = "#backends tr[data-backend=\"scripted\"]";
    assert_eq!(value(b, row, "healthy").await, num(&backend["healthy"]));
    let failures = d["failures"].as_array().unwrap();
    assert_eq!(
        failures.len(),
        1,
        "the broken setup is the one failure: {d:#}"
    );
    assert!(
        failures[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the task is broken"),
        "{d:#}"
    );
    let shown = b
        .find(Locator::Css("#failures [data-field=\"reason\"]"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(shown.trim(), failures[0]["reason"].as_str().unwrap().trim());
    assert_eq!(
        value(b, "#failures tr", "jobs").await,
        num(&failures[0]["jobs"])
    );
    per_minute_matches(b, &d).await;
}

/// Results per minute: one bar per minute, all statuses together.
async fn per_minute_matches(b: &Browser, d: &Value) {
    let mut per_minute = std::collections::BTreeMap::<i64, i64>::new();
    for m in d["throughput"]["per_minute"].as_array().unwrap() {
        *per_minute.entry(m["minute"].as_i64().unwrap()).or_default() +=
            m["jobs"].as_i64().unwrap();
    }
    let bars = b
        .find_all(Locator::Css("#per-minute rect.bar-mark"))
        .await
        .unwrap();
    assert_eq!(bars.len(), per_minute.len());
    for (bar, jobs) in bars.iter().zip(per_minute.values()) {
        assert_eq!(
            bar.attr("data-value").await.unwrap(),
            Some(jobs.to_string())
        );
    }
}

/// A failed job's view says where it failed (stage, attempt), its error, and the
/// events before its end, as the API holds them; and its prompt and stage timeline.
async fn failed_job_matches_the_api(b: &Browser, client: &Client, id: &str) {
    let view = client.job(id).await.unwrap();
    let job = &view.job;
    let stage = b
        .find(Locator::Css("#error-context [data-field=\"error_stage\"]"))
        .await
        .unwrap();
    assert_eq!(content(&stage).await, job.stage.as_str());
    assert_eq!(
        value(b, "#error-context", "error_attempt").await,
        job.attempts.to_string()
    );
    let text = b
        .find(Locator::Css("#error-context [data-field=\"error_text\"]"))
        .await
        .unwrap();
    assert_eq!(content(&text).await, job.error.clone().unwrap());
    assert!(content(&text).await.contains("the task is broken"));
    let shown = b
        .find_all(Locator::Css("#error-events tbody tr"))
        .await
        .unwrap();
    assert_eq!(shown.len(), view.events.len().min(6));
    let last = shown.last().unwrap();
    let event = content(
        &last
            .find(Locator::Css("[data-field=\"event\"]"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(event, view.events.last().unwrap().event);
    // The whole event log in the timeline.
    assert_eq!(
        b.find_all(Locator::Css("#events tbody tr"))
            .await
            .unwrap()
            .len(),
        view.events.len()
    );
}

/// The sampling batch's counters and accepted groups, each sample's reward, as
/// `GET /v1/batches/{id}` has them.
async fn groups_match_the_api(b: &Browser, client: &Client) {
    let v = client.sampling_batch("page-sampling").await.unwrap();
    let c = &v.batch.counters;
    for (field, n) in [
        ("informative", c.informative),
        ("uniform", c.uniform),
        ("incomplete", c.incomplete),
        ("stale_groups", c.stale_groups),
        ("groups_decided", c.groups_decided),
        ("jobs_saved", c.jobs_saved),
    ] {
        assert_eq!(
            value(b, "#sampling-summary", field).await,
            n.to_string(),
            "{field}"
        );
    }
    let verdicts = client.sampling_verdicts("page-sampling").await.unwrap();
    let jobs = client.batch_jobs("page-sampling").await.unwrap();
    let rows = b.find_all(Locator::Css("#groups tbody tr")).await.unwrap();
    assert_eq!(rows.len(), verdicts.groups.len());
    assert_eq!(
        i64::try_from(verdicts.groups.len()).unwrap(),
        c.groups_launched
    );
    // Every accepted group is among them, with its rank.
    for g in &v.groups {
        let row = format!("#groups tr[data-group=\"{}\"]", g.group_id);
        assert_eq!(value(b, &row, "accepted_rank").await, g.rank.to_string());
    }
    for g in &verdicts.groups {
        let row = format!("#groups tr[data-group=\"{}\"]", g.group_id);
        let state = b
            .find(Locator::Css(&format!("{row} [data-field=\"state\"]")))
            .await
            .unwrap();
        assert_eq!(content(&state).await, g.state);
        assert_eq!(
            value(b, &row, "reward_mean").await,
            num(&json!(g.reward_mean))
        );
        let samples: Vec<_> = jobs
            .iter()
            .filter(|j| j.group_id.as_deref() == Some(&g.group_id))
            .collect();
        let chips = b
            .find_all(Locator::Css(&format!("{row} a[data-job]")))
            .await
            .unwrap();
        assert_eq!(chips.len(), samples.len(), "{row}");
        for j in samples {
            let chip = b
                .find(Locator::Css(&format!("{row} a[data-job=\"{}\"]", j.id)))
                .await
                .unwrap();
            assert_eq!(
                chip.attr("data-value").await.unwrap(),
                Some(num(&json!(j.reward)))
            );
        }
    }
}

/// Every number of the training tab, and every mark of its charts, is the API's.
async fn training_matches_the_api(b: &Browser, client: &Client) {
    let t = serde_json::to_value(client.training(20).await.unwrap()).unwrap();
    let batches = t["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 3, "{t:#}");
    for batch in batches {
        let id = batch["batch_id"].as_str().unwrap();
        let row = format!("#training-batches tr[data-batch=\"{id}\"]");
        for (field, v) in [
            ("results", &batch["results"]),
            ("done", &batch["done"]),
            ("reward_mean", &batch["reward_mean"]),
            ("reward_std", &batch["reward_std"]),
            ("turns_mean", &batch["turns_mean"]),
            ("response_p50", &batch["response_tokens"]["p50"]),
            ("response_p90", &batch["response_tokens"]["p90"]),
            ("response_max", &batch["response_tokens_max"]),
            ("tool_calls", &batch["tool_calls"]),
            ("tool_errors", &batch["tool_errors"]),
            ("tool_error_rate", &batch["tool_error_rate"]),
        ] {
            assert_eq!(value(b, &row, field).await, num(v), "{row} {field}");
        }
        for c in batch["finish_reasons"].as_array().unwrap() {
            let css = format!(
                "{row} [data-field=\"finish_reasons\"] [data-count=\"{}\"]",
                c["value"].as_str().unwrap()
            );
            let chip = b.find(Locator::Css(&css)).await.unwrap();
            assert_eq!(
                chip.attr("data-value").await.unwrap(),
                Some(num(&c["jobs"])),
                "{css}"
            );
        }
        for (field, list) in [
            ("turns", &batch["turns"]),
            ("response_histogram", &batch["response_tokens_histogram"]),
        ] {
            let css = format!("{row} [data-field=\"{field}\"] [data-bucket]");
            let bars = b.find_all(Locator::Css(&css)).await.unwrap();
            let list = list.as_array().unwrap();
            assert_eq!(bars.len(), list.len(), "{css}");
            for (bar, c) in bars.iter().zip(list) {
                assert_eq!(
                    bar.attr("data-bucket").await.unwrap().as_deref(),
                    c["value"].as_str()
                );
                assert_eq!(bar.attr("data-value").await.unwrap(), Some(num(&c["jobs"])));
            }
        }
    }
    // The agent batches have episodes: turns, responses and tool calls.
    let agents = batches
        .iter()
        .find(|b| b["batch_id"] == "page-agents")
        .unwrap();
    assert!(agents["tool_calls"].as_i64().unwrap() > 0, "{agents:#}");
    assert!(
        !agents["turns"].as_array().unwrap().is_empty(),
        "{agents:#}"
    );

    training_charts_match(b, &t).await;
}

/// The training tab's charts: every mark is a number of `GET /v1/training` (`t`).
async fn training_charts_match(b: &Browser, t: &Value) {
    let batches = t["batches"].as_array().unwrap();
    // Mean reward by batch: a bar per batch with a mean.
    let with_mean: Vec<&Value> = batches
        .iter()
        .filter(|b| !b["reward_mean"].is_null())
        .collect();
    let bars = b
        .find_all(Locator::Css("#chart-reward-batch rect.bar-mark"))
        .await
        .unwrap();
    assert_eq!(bars.len(), with_mean.len());
    for (bar, batch) in bars.iter().zip(&with_mean) {
        assert_eq!(
            bar.attr("data-label").await.unwrap().as_deref(),
            batch["batch_id"].as_str()
        );
        assert_eq!(
            bar.attr("data-value").await.unwrap(),
            Some(num(&batch["reward_mean"]))
        );
    }
    // Mean reward per minute: a point per minute with done results.
    let minutes: Vec<&Value> = t["minutes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !m["reward_mean"].is_null())
        .collect();
    assert!(!minutes.is_empty(), "{t:#}");
    let dots = b
        .find_all(Locator::Css("#chart-reward-time circle"))
        .await
        .unwrap();
    assert_eq!(dots.len(), minutes.len());
    for (dot, m) in dots.iter().zip(&minutes) {
        assert_eq!(dot.attr("data-x").await.unwrap(), Some(num(&m["minute"])));
        assert_eq!(
            dot.attr("data-y").await.unwrap(),
            Some(num(&m["reward_mean"]))
        );
    }
    // Results per minute.
    let all_minutes = t["minutes"].as_array().unwrap();
    let bars = b
        .find_all(Locator::Css("#chart-throughput rect.bar-mark"))
        .await
        .unwrap();
    assert_eq!(bars.len(), all_minutes.len());
    for (bar, m) in bars.iter().zip(all_minutes) {
        assert_eq!(
            bar.attr("data-value").await.unwrap(),
            Some(num(&m["results"]))
        );
    }
    // Stage work p50 per minute: a series per stage.
    for stage in ["init", "run", "eval"] {
        let points: Vec<&Value> = t["stage_latency"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["stage"] == stage && !s["work_ms"]["p50"].is_null())
            .collect();
        assert!(!points.is_empty(), "no {stage} latency: {t:#}");
        let css = format!("#chart-stage-latency circle[data-series=\"{stage}\"]");
        let dots = b.find_all(Locator::Css(&css)).await.unwrap();
        assert_eq!(dots.len(), points.len(), "{css}");
        for (dot, p) in dots.iter().zip(&points) {
            assert_eq!(dot.attr("data-x").await.unwrap(), Some(num(&p["minute"])));
            assert_eq!(
                dot.attr("data-y").await.unwrap(),
                Some(num(&p["work_ms"]["p50"]))
            );
        }
    }
    // Axis labels on every chart.
    for id in [
        "chart-reward-time",
        "chart-reward-batch",
        "chart-throughput",
        "chart-stage-latency",
    ] {
        let labels = b
            .find_all(Locator::Css(&format!("#{id} .axis-label")))
            .await
            .unwrap();
        assert_eq!(labels.len(), 2, "{id} has an x and a y label");
    }
}

/// The job view shows the job's reward, and its trajectory as the API holds it.
async fn job_matches_the_api(b: &Browser, client: &Client, id: &str) {
    let view = client.job(id).await.unwrap();
    let result = view.result.expect("the job ended");
    let reward = value(b, "#job-summary", "reward").await;
    assert_eq!(reward.parse::<f64>().ok(), result.reward, "{reward}");
    let run = view.job.run_output.expect("RUN's output");
    let turns = run["turns"].as_array().unwrap();
    assert!(!turns.is_empty());
    let shown = b.find_all(Locator::Css("#trajectory .turn")).await.unwrap();
    assert_eq!(shown.len(), turns.len());
    assert_eq!(
        value(b, "#trajectory", "response_tokens").await,
        run["response_ids"].as_array().unwrap().len().to_string()
    );
    for (turn, el) in turns.iter().zip(&shown) {
        let text = content(&el.find(Locator::Css(".model-text")).await.unwrap()).await;
        assert_eq!(text, turn["text"].as_str().unwrap());
        let observations = el.find_all(Locator::Css(".observation")).await.unwrap();
        let tools = turn["tools"].as_array().unwrap();
        assert_eq!(observations.len(), tools.len());
        for (o, t) in observations.iter().zip(tools) {
            assert_eq!(content(o).await, t["observation"].as_str().unwrap());
        }
    }
    let drift = b
        .find(Locator::Css("#trajectory [data-field=\"drift\"]"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let identical = run["drift"]["identical"].as_bool().unwrap();
    assert_eq!(drift.starts_with("none"), identical, "{drift}");
    // The prompt: the task's messages, each as written.
    let messages = view.job.task["spec"]["messages"].as_array().unwrap();
    let shown = b
        .find_all(Locator::Css("#prompt [data-field=\"prompt\"]"))
        .await
        .unwrap();
    assert_eq!(shown.len(), messages.len());
    for (el, m) in shown.iter().zip(messages) {
        assert_eq!(content(el).await, m["content"].as_str().unwrap());
    }
    // The stage timeline: each stage's wait and work, and every event.
    let timings = serde_json::to_value(&view.job.timings).unwrap();
    for stage in ["init", "run", "eval"] {
        let t = &timings[stage];
        let row = format!("#stage-times tr[data-stage=\"{stage}\"]");
        let wait = t["started_at"].as_i64().unwrap() - t["queued_at"].as_i64().unwrap();
        let work = t["finished_at"].as_i64().unwrap() - t["started_at"].as_i64().unwrap();
        assert_eq!(value(b, &row, "wait_ms").await, wait.to_string(), "{row}");
        assert_eq!(value(b, &row, "work_ms").await, work.to_string(), "{row}");
    }
    assert_eq!(
        b.find_all(Locator::Css("#events tbody tr"))
            .await
            .unwrap()
            .len(),
        view.events.len()
    );
}
