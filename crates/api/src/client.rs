//! A small HTTP client for the gateway's API, used by `rollout submit`, `rollout status`,
//! `rollout up --submit`, the tests and the benchmarks, and usable from any program that
//! talks to a running service: it needs only the wire types ([`crate::api`]) and
//! `rollout-core`, not the service.
//!
//! A gateway with `gateway.token` set answers 401 to requests without it; give the
//! client the token with [`Client::with_token`] and every request carries it.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::api::batches::{BatchRequest, BatchView, GroupPage};
use crate::api::jobs::{CancelResponse, JobPage, JobView, SubmitResponse};
use crate::api::results::ResultPage;
use crate::api::status::StatusView;
use rollout_core::domain::Task;

/// A failed API call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The gateway could not be reached.
    #[error(
        "cannot reach the gateway at {url}: {source} (is `rollout serve` or `rollout up` running? set --gateway)"
    )]
    Unreachable {
        /// The URL called.
        url: String,
        /// The transport error.
        source: reqwest::Error,
    },
    /// The gateway refused the request for want of the right token (HTTP 401).
    #[error(
        "the gateway at {url} answered 401 Unauthorized: {hint}; pass the gateway's token \
         with --token, the ROLLOUT_GATEWAY_TOKEN variable or gateway.token in the settings",
        hint = unauthorized_hint(.sent_token)
    )]
    Unauthorized {
        /// The URL called.
        url: String,
        /// The gateway's own error message.
        message: String,
        /// Whether the request carried a token (a wrong one) or none.
        sent_token: bool,
    },
    /// The gateway answered with an error: its message as a sentence, the field at
    /// fault for bad input, and the HTTP status last.
    #[error("{message}{} (HTTP {status})", field.as_ref().map(|f| format!(" (field `{f}`)")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// The gateway's message (`error` of its JSON body), or the body itself when
        /// it is not the gateway's JSON.
        message: String,
        /// The offending field for bad input (`field` of the body).
        field: Option<String>,
    },
    /// The answer was not the expected JSON.
    #[error("unexpected answer from the gateway: {0}")]
    Decode(reqwest::Error),
}

/// The part of [`ClientError::Unauthorized`]'s message that depends on whether a token
/// was sent.
fn unauthorized_hint(sent_token: &bool) -> &'static str {
    if *sent_token {
        "the token sent is not the one it expects"
    } else {
        "it requires a token and none was sent"
    }
}

/// Gateway client. `Debug` hides the token.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the gateway at `base` (e.g. `http://127.0.0.1:7878`).
    pub fn new(base: &str) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build()
            .expect("HTTP client builds");
        Self {
            base: base.trim_end_matches('/').to_string(),
            http,
            token: None,
        }
    }

    /// The same client sending `token` as `Authorization: Bearer <token>` with every
    /// request, for a gateway with `gateway.token` set. `None` or an empty token sends
    /// none, so an optional setting can be passed straight through.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Sends `req` with the token, if any; a 401 becomes [`ClientError::Unauthorized`]
    /// and any other non-2xx answer [`ClientError::Api`].
    async fn checked(
        &self,
        req: reqwest::RequestBuilder,
        url: String,
    ) -> Result<reqwest::Response, ClientError> {
        let req = match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        };
        let resp = req
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.clone(),
                source,
            })?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            if status == reqwest::StatusCode::UNAUTHORIZED {
                let message = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or(body);
                return Err(ClientError::Unauthorized {
                    url,
                    message,
                    sent_token: self.token.is_some(),
                });
            }
            let parsed = serde_json::from_str::<crate::api::error::ApiErrorBody>(&body).ok();
            return Err(match parsed {
                Some(b) => ClientError::Api {
                    status: status.as_u16(),
                    message: b.error,
                    field: b.field,
                },
                None => ClientError::Api {
                    status: status.as_u16(),
                    message: if body.trim().is_empty() {
                        status.to_string()
                    } else {
                        body
                    },
                    field: None,
                },
            });
        }
        Ok(resp)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        url: String,
    ) -> Result<T, ClientError> {
        let resp = self.checked(req, url).await?;
        resp.json().await.map_err(ClientError::Decode)
    }

    /// `POST /v1/jobs`.
    pub async fn submit(
        &self,
        tasks: &[Task],
        batch_id: Option<&str>,
    ) -> Result<SubmitResponse, ClientError> {
        let url = format!("{}/v1/jobs", self.base);
        let body = serde_json::json!({"tasks": tasks, "batch_id": batch_id});
        self.send(self.http.post(&url).json(&body), url).await
    }

    /// `GET /v1/results`.
    pub async fn results(
        &self,
        batch: Option<&str>,
        after: i64,
        wait_ms: u64,
    ) -> Result<ResultPage, ClientError> {
        let mut url = format!(
            "{}/v1/results?after={after}&wait_ms={wait_ms}&limit=1000",
            self.base
        );
        if let Some(b) = batch {
            url.push_str(&format!("&batch={b}"));
        }
        self.send(self.http.get(&url), url).await
    }

    /// Long-polls the results of `batch` until `n` have arrived; returns them in `seq`
    /// order.
    pub async fn collect_results(
        &self,
        batch: &str,
        n: usize,
    ) -> Result<Vec<rollout_core::domain::JobResult>, ClientError> {
        let mut out = Vec::with_capacity(n);
        let mut after = 0;
        while out.len() < n {
            let page = self.results(Some(batch), after, 5000).await?;
            after = page.next_cursor;
            out.extend(page.results);
        }
        Ok(out)
    }

    /// `GET /v1/backends`.
    pub async fn backends(
        &self,
    ) -> Result<Vec<rollout_core::domain::backend::BackendState>, ClientError> {
        let url = format!("{}/v1/backends", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `POST /v1/backends`.
    pub async fn add_backend(
        &self,
        spec: &rollout_core::domain::backend::BackendSpec,
    ) -> Result<rollout_core::domain::backend::BackendState, ClientError> {
        let url = format!("{}/v1/backends", self.base);
        self.send(self.http.post(&url).json(spec), url).await
    }

    /// `DELETE /v1/backends/{id}`.
    pub async fn remove_backend(&self, id: &str) -> Result<(), ClientError> {
        let url = format!("{}/v1/backends/{id}", self.base);
        self.checked(self.http.delete(&url), url).await.map(drop)
    }

    /// `POST /v1/policy`: announces policy `version` (the trainer's weights are now at
    /// it).
    pub async fn announce_policy(
        &self,
        version: i64,
    ) -> Result<crate::api::policy::PolicyView, ClientError> {
        let url = format!("{}/v1/policy", self.base);
        let body = crate::api::policy::PolicyRequest {
            version,
            mode: None,
            lease_s: None,
        };
        self.send(self.http.post(&url).json(&body), url).await
    }

    /// `POST /v1/policy` with a `mode`: starts a weight update to `version`; returns
    /// once every backend has stopped generating. `lease_s` bounds the update (the
    /// service resumes by itself after it).
    pub async fn pause_policy(
        &self,
        version: i64,
        mode: crate::api::policy::UpdateMode,
        lease_s: Option<u64>,
    ) -> Result<crate::api::policy::PolicyView, ClientError> {
        let url = format!("{}/v1/policy", self.base);
        let body = crate::api::policy::PolicyRequest {
            version,
            mode: Some(mode),
            lease_s,
        };
        self.send(self.http.post(&url).json(&body), url).await
    }

    /// `POST /v1/policy/{version}/resume`: ends the weight update; `version` is current.
    pub async fn resume_policy(
        &self,
        version: i64,
    ) -> Result<crate::api::policy::PolicyView, ClientError> {
        let url = format!("{}/v1/policy/{version}/resume", self.base);
        self.send(self.http.post(&url), url).await
    }

    /// `GET /v1/policy`: the current policy version.
    pub async fn policy(&self) -> Result<crate::api::policy::PolicyView, ClientError> {
        let url = format!("{}/v1/policy", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/status`.
    pub async fn status(&self, batch: Option<&str>) -> Result<StatusView, ClientError> {
        let mut url = format!("{}/v1/status", self.base);
        if let Some(b) = batch {
            url.push_str(&format!("?batch={b}"));
        }
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/dashboard`: what the status page shows.
    pub async fn dashboard(&self) -> Result<crate::api::dashboard::Dashboard, ClientError> {
        let url = format!("{}/v1/dashboard", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/dashboard?limit=…`: the dashboard with the latest `limit` batches,
    /// failure reasons and sampling batches.
    pub async fn dashboard_latest(
        &self,
        limit: i64,
    ) -> Result<crate::api::dashboard::Dashboard, ClientError> {
        let url = format!("{}/v1/dashboard?limit={limit}", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/training`: the training view of the latest `batches` batches.
    pub async fn training(
        &self,
        batches: i64,
    ) -> Result<crate::api::training::Training, ClientError> {
        let url = format!("{}/v1/training?batches={batches}", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/jobs/{id}`.
    pub async fn job(&self, id: &str) -> Result<JobView, ClientError> {
        let url = format!("{}/v1/jobs/{id}", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// Every job of `batch` (`GET /v1/jobs?batch=…`, page by page), with its timings.
    pub async fn batch_jobs(
        &self,
        batch: &str,
    ) -> Result<Vec<rollout_core::domain::Job>, ClientError> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!("{}/v1/jobs?batch={batch}&limit=1000", self.base);
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            let page: JobPage = self.send(self.http.get(&url), url).await?;
            out.extend(page.jobs);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(out),
            }
        }
    }

    /// `POST /v1/jobs/{id}/cancel`.
    pub async fn cancel(&self, id: &str) -> Result<CancelResponse, ClientError> {
        let url = format!("{}/v1/jobs/{id}/cancel", self.base);
        self.send(self.http.post(&url), url).await
    }

    /// `POST /v1/batches`: a dynamic-sampling batch (see `docs/sampling.md`).
    pub async fn submit_sampling(&self, req: &BatchRequest) -> Result<BatchView, ClientError> {
        let url = format!("{}/v1/batches", self.base);
        self.send(self.http.post(&url).json(req), url).await
    }

    /// `GET /v1/batches/{id}`: a sampling batch's status, counters and accepted groups.
    pub async fn sampling_batch(&self, id: &str) -> Result<BatchView, ClientError> {
        let url = format!("{}/v1/batches/{id}", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/batches/{id}/groups`: accepted groups ranked after `after`, waiting up
    /// to `wait_ms` while none is ready and the batch runs.
    pub async fn sampling_groups(
        &self,
        id: &str,
        after: i64,
        wait_ms: u64,
    ) -> Result<GroupPage, ClientError> {
        let url = format!(
            "{}/v1/batches/{id}/groups?after={after}&wait_ms={wait_ms}",
            self.base
        );
        self.send(self.http.get(&url), url).await
    }

    /// `GET /v1/batches/{id}/verdicts`: every group of a sampling batch with its
    /// verdict so far.
    pub async fn sampling_verdicts(
        &self,
        id: &str,
    ) -> Result<crate::api::batches::VerdictPage, ClientError> {
        let url = format!("{}/v1/batches/{id}/verdicts?limit=10000", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// `POST /v1/batches/{id}/cancel`: ends a running sampling batch and cancels its
    /// live samples.
    pub async fn cancel_sampling(&self, id: &str) -> Result<BatchView, ClientError> {
        let url = format!("{}/v1/batches/{id}/cancel", self.base);
        self.send(self.http.post(&url), url).await
    }

    /// `POST /v1/batches/{id}/cancel` for any batch, a plain one or a sampling batch:
    /// nothing of it is scored from the answer on, and its live jobs end `cancelled`.
    pub async fn cancel_batch(
        &self,
        id: &str,
    ) -> Result<crate::api::batches::CancelledBatch, ClientError> {
        let url = format!("{}/v1/batches/{id}/cancel", self.base);
        self.send(self.http.post(&url), url).await
    }
}

/// What a followed batch ended with.
#[derive(Debug, Clone, Default)]
pub struct BatchSummary {
    /// Results received.
    pub results: u64,
    /// Of which `done`.
    pub done: u64,
    /// Of which `failed`.
    pub failed: u64,
    /// Of which `cancelled`.
    pub cancelled: u64,
    /// Of which `timed_out`.
    pub timed_out: u64,
    /// Of which `stale` (scored, but older than their `max_staleness` allowed).
    pub stale: u64,
    /// Sum of rewards of `done` results.
    pub reward_sum: f64,
    /// Wall time from start of following to the last result.
    pub elapsed: Duration,
    /// The same counts per task label ([`task_label`]: kind and grader), for the jobs
    /// the follower was given labels for.
    pub by_label: std::collections::BTreeMap<String, LabelSummary>,
    /// Jobs that ended `failed`, `timed_out` or `cancelled`, by status and the first
    /// line of their error ([`failure_reason`]).
    pub failures: std::collections::BTreeMap<(String, String), FailureCount>,
}

/// How many jobs ended with one failure reason, and one of them to look at.
#[derive(Debug, Clone, Default)]
pub struct FailureCount {
    /// Jobs.
    pub jobs: u64,
    /// The first of them.
    pub example_job_id: String,
}

/// The reason a summary groups a failed job under: the first line of its error, cut to
/// 160 characters (the dashboard's `failures_by_reason` groups by the same length).
pub fn failure_reason(error: Option<&str>) -> String {
    let line = error.and_then(|e| e.lines().next()).unwrap_or("").trim();
    if line.is_empty() {
        return "(no error recorded)".to_string();
    }
    match line.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

impl BatchSummary {
    /// Jobs that ended `failed` or `timed_out` (what `--fail-on-error` fails on).
    pub fn failed_jobs(&self) -> u64 {
        self.failed + self.timed_out
    }
}

/// A summary's counts for one label.
#[derive(Debug, Clone, Default)]
pub struct LabelSummary {
    /// Results received.
    pub results: u64,
    /// Of which `done`.
    pub done: u64,
    /// Sum of rewards of `done` results.
    pub reward_sum: f64,
}

/// What a task is, for a summary's breakdown: its kind, and its grader where it has one
/// (`agent/math`, `shell/command`, `synthetic`).
pub fn task_label(task: &Task) -> String {
    let grader = match (task.spec.get("grader"), task.spec.get("check")) {
        (Some(g), _) => g["type"].as_str().map(str::to_string),
        (None, Some(_)) => Some("command".to_string()),
        (None, None) => None,
    };
    match grader {
        Some(g) => format!("{}/{g}", task.kind),
        None => task.kind.clone(),
    }
}

/// Job id → [`task_label`] for submitted `tasks` and the jobs the submit answered with
/// (one per task, in order).
pub fn job_labels<'a>(
    tasks: &[Task],
    jobs: impl IntoIterator<Item = &'a crate::api::jobs::Submitted>,
) -> std::collections::HashMap<String, String> {
    tasks
        .iter()
        .zip(jobs)
        .map(|(t, j)| (j.id.clone(), task_label(t)))
        .collect()
}

impl std::fmt::Display for BatchSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mean = if self.done > 0 {
            self.reward_sum / self.done as f64
        } else {
            0.0
        };
        let secs = self.elapsed.as_secs_f64();
        write!(
            f,
            "{} results in {:.2} s ({:.1}/s): {} done, {} failed, {} timed out, {} cancelled; mean reward of done jobs {:.3}",
            self.results,
            secs,
            if secs > 0.0 {
                self.results as f64 / secs
            } else {
                0.0
            },
            self.done,
            self.failed,
            self.timed_out,
            self.cancelled,
            mean
        )?;
        for (label, l) in &self.by_label {
            let mean = if l.done > 0 {
                l.reward_sum / l.done as f64
            } else {
                0.0
            };
            write!(
                f,
                "\n  {label:<16} {:>6} results {:>6} done   mean reward {mean:.3}",
                l.results, l.done
            )?;
        }
        let mut failures: Vec<_> = self.failures.iter().collect();
        failures.sort_by(|a, b| b.1.jobs.cmp(&a.1.jobs).then_with(|| a.0.cmp(b.0)));
        if !failures.is_empty() {
            write!(f, "\nwhy jobs did not end done:")?;
        }
        for ((status, reason), c) in failures {
            write!(
                f,
                "\n  {:>6} {status:<9} {reason} (e.g. job {})",
                c.jobs, c.example_job_id
            )?;
        }
        Ok(())
    }
}

impl Client {
    /// Follows a batch's results until `expected` have arrived, showing a progress bar on
    /// a terminal (or a line every few seconds otherwise); `labels` (job id → label, see
    /// [`job_labels`]) break the summary down.
    pub async fn follow_batch(
        &self,
        batch: &str,
        expected: u64,
        labels: &std::collections::HashMap<String, String>,
    ) -> Result<BatchSummary, ClientError> {
        use rollout_core::domain::Status;
        use std::io::IsTerminal;
        let start = std::time::Instant::now();
        let bar = if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(expected);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}",
                )
                .expect("valid template"),
            );
            Some(bar)
        } else {
            None
        };
        let mut last_line = std::time::Instant::now();
        let mut s = BatchSummary::default();
        let mut after = 0;
        while s.results < expected {
            let page = self.results(Some(batch), after, 2000).await?;
            after = page.next_cursor;
            for r in &page.results {
                s.results += 1;
                if let Some(label) = labels.get(&r.job_id) {
                    let l = s.by_label.entry(label.clone()).or_default();
                    l.results += 1;
                    if r.status == Status::Done {
                        l.done += 1;
                        l.reward_sum += r.reward.unwrap_or(0.0);
                    }
                }
                if matches!(
                    r.status,
                    Status::Failed | Status::TimedOut | Status::Cancelled
                ) {
                    let key = (
                        r.status.as_str().to_string(),
                        failure_reason(r.error.as_deref()),
                    );
                    let c = s.failures.entry(key).or_default();
                    if c.jobs == 0 {
                        c.example_job_id = r.job_id.clone();
                    }
                    c.jobs += 1;
                }
                match r.status {
                    Status::Done => {
                        s.done += 1;
                        s.reward_sum += r.reward.unwrap_or(0.0);
                    }
                    Status::Failed => s.failed += 1,
                    Status::Cancelled => s.cancelled += 1,
                    Status::TimedOut => s.timed_out += 1,
                    Status::Stale => s.stale += 1,
                    Status::Queued | Status::Running => {}
                }
            }
            let mut msg = format!(
                "done {} failed {} timed_out {} cancelled {}",
                s.done, s.failed, s.timed_out, s.cancelled
            );
            if s.stale > 0 {
                msg.push_str(&format!(" stale {}", s.stale));
            }
            match &bar {
                Some(bar) => {
                    bar.set_position(s.results);
                    bar.set_message(msg);
                }
                None if last_line.elapsed() >= Duration::from_secs(3) || s.results >= expected => {
                    eprintln!("progress: {}/{} results ({msg})", s.results, expected);
                    last_line = std::time::Instant::now();
                }
                None => {}
            }
        }
        if let Some(bar) = bar {
            bar.finish();
        }
        s.elapsed = start.elapsed();
        Ok(s)
    }
}

/// Reads tasks from JSON Lines (blank lines and `#` comments skipped), naming the line of
/// the first bad one.
pub fn read_tasks_jsonl(text: &str) -> Result<Vec<Task>, String> {
    read_task_lines(text)
        .map(|lines| lines.into_iter().map(|(_, t)| t).collect())
        .map_err(|(line, e)| format!("line {line}: {e}"))
}

/// [`read_tasks_jsonl`], each task with its 1-based line, so that a task the gateway
/// refuses can be named by its line in the file; a bad line is the error, with its
/// number.
pub fn read_task_lines(text: &str) -> Result<Vec<(usize, Task)>, (usize, String)> {
    let mut tasks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let de = &mut serde_json::Deserializer::from_str(line);
        let task: Task = serde_path_to_error::deserialize(de)
            .map_err(|e| (i + 1, format!("{} at `{}`", e.inner(), e.path())))?;
        tasks.push((i + 1, task));
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::jobs::Submitted;
    use rollout_core::domain::{Stage, Status};

    #[test]
    fn a_failure_reason_is_the_first_line_cut_to_160_characters() {
        assert_eq!(failure_reason(None), "(no error recorded)");
        assert_eq!(failure_reason(Some("  \nsecond")), "(no error recorded)");
        assert_eq!(failure_reason(Some("boom \nat line 2")), "boom");
        // Cut at a character, not a byte: the dashboard's grouping counts the same way.
        let cut = failure_reason(Some(&"é".repeat(200)));
        assert_eq!(cut, format!("{}…", "é".repeat(160)));
    }

    #[test]
    fn a_task_is_labelled_by_its_kind_and_grader() {
        let task = |kind, spec| Task::new(kind, spec);
        let math = task("agent", serde_json::json!({"grader": {"type": "math"}}));
        assert_eq!(task_label(&math), "agent/math");
        let shell = task("shell", serde_json::json!({"check": "test -f out"}));
        assert_eq!(task_label(&shell), "shell/command");
        let plain = task("synthetic", serde_json::json!({}));
        assert_eq!(task_label(&plain), "synthetic");
        let submitted = |id: &str| Submitted {
            id: id.into(),
            client_id: None,
            status: Status::Queued,
            stage: Stage::Init,
            duplicate: false,
        };
        let labels = job_labels(&[math, plain], &[submitted("j1"), submitted("j2")]);
        assert_eq!(labels["j1"], "agent/math");
        assert_eq!(labels["j2"], "synthetic");
    }

    #[test]
    fn task_lines_skip_blanks_and_comments_and_name_a_bad_line() {
        let text =
            "# tasks\n\n{\"kind\": \"synthetic\", \"spec\": {}}\n  \n{\"kind\": \"shell\"}\n";
        let lines = read_task_lines(text).unwrap();
        let at: Vec<(usize, &str)> = lines.iter().map(|(n, t)| (*n, t.kind.as_str())).collect();
        assert_eq!(at, [(3, "synthetic"), (5, "shell")]);
        let err = read_tasks_jsonl("{\"kind\": \"synthetic\"}\n{\"kind\": 7}\n").unwrap_err();
        assert!(err.starts_with("line 2: "), "{err}");
        assert!(err.contains("at `kind`"), "{err}");
    }

    #[test]
    fn the_token_is_sent_only_when_set_and_never_shown() {
        let client = Client::new("http://gateway:7878/").with_token(Some("s3cret".into()));
        let shown = format!("{client:?}");
        assert!(shown.contains("http://gateway:7878\""), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            Client::new("x")
                .with_token(Some(String::new()))
                .token
                .is_none()
        );
    }

    #[test]
    fn an_api_error_reads_as_the_gateways_sentence() {
        let e = ClientError::Api {
            status: 400,
            message: "`run_ms` must be at most 60000".into(),
            field: Some("tasks[2].spec.run_ms".into()),
        };
        assert_eq!(
            e.to_string(),
            "`run_ms` must be at most 60000 (field `tasks[2].spec.run_ms`) (HTTP 400)"
        );
    }

    #[tokio::test]
    async fn a_gateway_that_is_not_there_is_unreachable() {
        // Port 9 (discard) on the loopback: nothing listens, the connection is refused.
        let client = Client::new("http://127.0.0.1:9");
        match client.status(None).await {
            Err(ClientError::Unreachable { url, .. }) => {
                assert_eq!(url, "http://127.0.0.1:9/v1/status");
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }
}
