//! NATS JetStream: the only queue between stages.
//!
//! Layout for a deployment with subject prefix `P` (default `rollout`):
//!
//! | stream | retention | subjects | consumers |
//! |---|---|---|---|
//! | `P_WORK` | work queue | `P.init`, `P.run.<node>`, `P.run.any`, `P.eval` | `init`, `run-<node>`, `run-any`, `eval` |
//! | `P_RESULTS` | limits | `P.done.<batch>` | read by trainers |
//! | `P_DEAD` | limits | `P.dead` | kept for inspection |
//!
//! Every stream is created with `nats.replicas` copies (1 on a single server, 3 on a
//! three-server cluster); consumers follow their stream's count. With three copies a
//! server can die at any moment: a message the server acknowledged is on a majority of
//! the servers, the clients reconnect to the others (`nats.url` lists them), and what
//! was in flight on the dead one is recovered the usual way: a failed publish is
//! retried by nak or by the reconciler, a lost ack or pull request ends in a
//! redelivery, which the compare-and-set on the job row makes harmless.
//!
//! Cancels are broadcast on the core subject `P.cancel` (no stream: a worker that misses
//! one still finds the job cancelled in the database at its next lease renewal).
//!
//! A work-queue stream allows one consumer per subject, so each stage has exactly one
//! durable pull consumer shared by every worker of that stage; workers scale by pulling
//! from the same consumer. Streams and consumers are created or updated idempotently at
//! start-up by whoever starts first. Every publish carries a `Nats-Msg-Id` derived from
//! the hand-off it represents, so a re-publish inside the duplicate window is dropped by
//! the server.

mod work;

pub use work::{Answer, Delivery, Outbox, WorkQueue, WorkSource};

use std::future::{Future, IntoFuture};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::future::try_join_all;

use crate::config::Settings;
use crate::domain::EpochMs;
use crate::domain::sampling::AcceptedGroup;
use crate::domain::{JobResult, Stage, WorkMessage};

/// A queue failure. All are transient from the job's point of view.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The server could not be reached.
    #[error(
        "cannot connect to NATS at {url}: {detail} (is nats-server running with JetStream, \
         `nats-server -js`? set ROLLOUT__NATS__URL to its address)"
    )]
    Connect {
        /// The URL tried.
        url: String,
        /// The client's error.
        detail: String,
    },
    /// The server refused the connection's credentials, or their absence.
    #[error(
        "NATS at {url} refused the connection: {detail} (give the credentials the server \
         expects: nats.user and nats.password, nats.token or nats.creds_file, e.g. \
         ROLLOUT__NATS__TOKEN)"
    )]
    Unauthorized {
        /// The URL tried, without any password in it.
        url: String,
        /// The client's error.
        detail: String,
    },
    /// The `.creds` file named by `nats.creds_file` could not be read or parsed.
    #[error(
        "cannot use the NATS credentials file {path} (nats.creds_file): {detail}; give the \
         path of the .creds file the NATS operator issued"
    )]
    CredsFile {
        /// The file.
        path: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The servers cannot keep the configured number of copies of a stream.
    #[error(
        "cannot keep {replicas} copies of stream {stream} (nats.replicas = {replicas}): \
         {detail}; {advice}"
    )]
    Replicas {
        /// The stream.
        stream: String,
        /// The configured count.
        replicas: usize,
        /// The server's error.
        detail: String,
        /// What to do about it.
        advice: &'static str,
    },
    /// A JetStream request failed.
    #[error("JetStream {what} failed: {detail}")]
    JetStream {
        /// What was attempted.
        what: &'static str,
        /// The server's or client's error.
        detail: String,
    },
}

fn js_err(what: &'static str) -> impl FnOnce(String) -> QueueError {
    move |detail| QueueError::JetStream { what, detail }
}

/// The [`QueueError::Replicas`] of a stream request the server refused for its replica
/// count, if that is why it refused.
fn replicas_err(
    stream: &str,
    replicas: usize,
    e: &jetstream::context::CreateStreamError,
) -> Option<QueueError> {
    use jetstream::ErrorCode;
    let jetstream::context::CreateStreamErrorKind::JetStream(js) = e.kind() else {
        return None;
    };
    let advice = match js.error_code() {
        ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED => {
            "this nats-server is not part of a JetStream cluster: set nats.replicas = 1, or \
             run three servers as a cluster (see the README's production setup) and list \
             them all in nats.url"
        }
        ErrorCode::INSUFFICIENT_RESOURCES
        | ErrorCode::CLUSTER_NO_PEERS
        | ErrorCode::CLUSTER_INCOMPLETE => {
            "the JetStream cluster has fewer servers up than copies asked for: start the \
             missing servers, or set nats.replicas to at most the number of servers"
        }
        ErrorCode::STREAM_REPLICAS_NOT_UPDATABLE => {
            "this nats-server cannot change an existing stream's replica count: set \
             nats.replicas back to the stream's count, or remove the stream once it is \
             empty (`nats stream rm`) so it is created again with the new count"
        }
        _ => return None,
    };
    Some(QueueError::Replicas {
        stream: stream.to_string(),
        replicas,
        detail: js.to_string(),
        advice,
    })
}

/// Subject and stream names under one prefix.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// Names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    /// `P.init`.
    pub fn init(&self) -> String {
        format!("{}.init", self.prefix)
    }

    /// `P.run.<route>`, where route is a node name or `any`.
    pub fn run(&self, route: &str) -> String {
        format!("{}.run.{route}", self.prefix)
    }

    /// `P.eval`.
    pub fn eval(&self) -> String {
        format!("{}.eval", self.prefix)
    }

    /// The subject a work message is published on.
    pub fn work(&self, stage: Stage, route: Option<&str>) -> String {
        match stage {
            Stage::Init => self.init(),
            Stage::Run => self.run(route.unwrap_or(ANY_ROUTE)),
            Stage::Eval => self.eval(),
        }
    }

    /// `P.done.<batch>`.
    pub fn done(&self, batch: &str) -> String {
        format!("{}.done.{batch}", self.prefix)
    }

    /// `P.done.>`.
    pub fn done_all(&self) -> String {
        format!("{}.done.>", self.prefix)
    }

    /// `P.dead`.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// `P.cancel`.
    pub fn cancel(&self) -> String {
        format!("{}.cancel", self.prefix)
    }

    /// `P.policy`: core NATS, payload the policy state as JSON after every change (every
    /// RUN worker hears it; one that misses it reads the state from the database soon
    /// after).
    pub fn policy(&self) -> String {
        format!("{}.policy", self.prefix)
    }

    /// `P.policy.announce`: core NATS requests carrying the body of `POST /v1/policy`,
    /// answered by one gateway like [`Subjects::submit`].
    pub fn policy_announce(&self) -> String {
        format!("{}.policy.announce", self.prefix)
    }

    /// `P.policy.resume`: core NATS requests carrying `{"version": N}`, answered as
    /// `POST /v1/policy/{N}/resume` is, by one gateway.
    pub fn policy_resume(&self) -> String {
        format!("{}.policy.resume", self.prefix)
    }

    /// `P.submit`: core NATS requests carrying the body of `POST /v1/jobs`, answered by
    /// one of the gateways (not captured by a stream: a submit nobody answers fails at
    /// the requester, who retries it with the same client ids).
    pub fn submit(&self) -> String {
        format!("{}.submit", self.prefix)
    }

    /// Requests to create a sampling batch (the body of `POST /v1/batches`), answered by
    /// one gateway like [`Subjects::submit`].
    pub fn batches_submit(&self) -> String {
        format!("{}.batches.submit", self.prefix)
    }

    /// Core NATS, payload a batch id: a group of that sampling batch was decided, so a
    /// batch driver should launch, cancel or publish what follows from it.
    pub fn batches_wake(&self) -> String {
        format!("{}.batches.wake", self.prefix)
    }

    /// A sampling batch's accepted groups, one message per group in rank order (on the
    /// GROUPS stream, so a trainer can replay them).
    pub fn groups(&self, batch: &str) -> String {
        format!("{}.groups.{batch}", self.prefix)
    }

    /// Stream name `PREFIX_SUFFIX` (stream names cannot contain `.`; upper case by
    /// convention).
    pub fn stream(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix.to_uppercase().replace('-', "_"))
    }
}

/// The RUN route of jobs that may run on any node (no node-local sandbox).
pub const ANY_ROUTE: &str = "any";

/// A connection to NATS with the deployment's streams provisioned.
#[derive(Clone)]
pub struct Queue {
    client: async_nats::Client,
    js: jetstream::Context,
    subjects: Subjects,
    ack_wait: Duration,
    max_deliver: i64,
    duplicate_window: Duration,
    max_result_bytes: usize,
    replicas: usize,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("subjects", &self.subjects)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// Connects to one of the servers in `settings` (`nats.url` may list a cluster's) with
    /// its credentials (`nats.user` and `nats.password`, `nats.token` or
    /// `nats.creds_file`, whichever is set) and provisions the streams. The client
    /// reconnects on its own, to any listed server or one the cluster told it of, for as
    /// long as the process runs. Every process connects through here, so a server with
    /// authorization needs only the settings. `name` labels the connection in the
    /// server's monitoring. With `wait_for_server`, keeps retrying until the server
    /// answers (workers started before NATS); otherwise fails at once with an error
    /// saying what to check.
    pub async fn connect(
        settings: &Settings,
        name: &str,
        wait_for_server: bool,
    ) -> Result<Queue, QueueError> {
        let urls = settings.nats.urls();
        let mut opts =
            async_nats::ConnectOptions::new()
                .name(name)
                .event_callback(|event| async move {
                    match event {
                        async_nats::Event::Disconnected => tracing::warn!("NATS disconnected"),
                        async_nats::Event::Connected => tracing::info!("NATS connected"),
                        async_nats::Event::LameDuckMode => {
                            tracing::warn!("NATS server entering lame duck mode")
                        }
                        other => tracing::debug!(event = %other, "NATS event"),
                    }
                });
        if wait_for_server {
            opts = opts.retry_on_initial_connect();
        }
        let nats = &settings.nats;
        if !nats.user.is_empty() {
            opts = opts.user_and_password(nats.user.clone(), nats.password.clone());
        } else if !nats.token.is_empty() {
            opts = opts.token(nats.token.clone());
        } else if !nats.creds_file.as_os_str().is_empty() {
            opts = opts.credentials_file(&nats.creds_file).await.map_err(|e| {
                QueueError::CredsFile {
                    path: nats.creds_file.display().to_string(),
                    detail: e.to_string(),
                }
            })?;
        }
        let shown_url = crate::config::redact_url(&urls.join(","));
        let client = opts
            .connect(urls.as_slice())
            .await
            .map_err(|e| match e.kind() {
                async_nats::ConnectErrorKind::AuthorizationViolation
                | async_nats::ConnectErrorKind::Authentication => QueueError::Unauthorized {
                    url: shown_url.clone(),
                    detail: e.to_string(),
                },
                _ => QueueError::Connect {
                    url: shown_url.clone(),
                    detail: e.to_string(),
                },
            })?;
        let js = jetstream::new(client.clone());
        let queue = Queue {
            client,
            js,
            subjects: Subjects::new(&settings.nats.prefix),
            ack_wait: settings.ack_wait(),
            // The delivery limit is enforced on stage starts recorded in the database;
            // deliveries that start nothing (a copy that found the stage leased, a claim
            // during a database outage) also count here, so the server's own limit is
            // a generous backstop (see the reconciler's max-deliveries handling).
            max_deliver: 4 * settings.queue.delivery_limit + 10,
            duplicate_window: Duration::from_millis(settings.queue.duplicate_window_ms),
            max_result_bytes: settings.queue.max_result_bytes,
            replicas: settings.nats.replicas,
        };
        // A worker started before the server (a Slurm job on a fresh allocation) keeps
        // trying; everything else reports the problem at once.
        let mut tries = 0u32;
        let mut delays = crate::retry::reconnect();
        loop {
            match queue.provision().await {
                Ok(()) => return Ok(queue),
                Err(e) if wait_for_server => {
                    tries += 1;
                    if tries % 10 == 1 {
                        tracing::warn!(error = %e, url = %shown_url, "NATS not ready; retrying");
                    }
                    tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Creates or updates the three streams (idempotent; safe to race).
    pub async fn provision(&self) -> Result<(), QueueError> {
        let s = &self.subjects;
        let work = stream::Config {
            name: s.stream("WORK"),
            subjects: vec![s.init(), format!("{}.run.>", s.prefix), s.eval()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            ..Default::default()
        };
        let results = stream::Config {
            name: s.stream("RESULTS"),
            subjects: vec![s.done_all()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            max_age: Duration::from_secs(7 * 24 * 3600),
            ..Default::default()
        };
        let dead = stream::Config {
            name: s.stream("DEAD"),
            subjects: vec![s.dead()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            ..Default::default()
        };
        let groups = stream::Config {
            name: s.stream("GROUPS"),
            subjects: vec![format!("{}.groups.>", s.prefix)],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            max_age: Duration::from_secs(7 * 24 * 3600),
            ..Default::default()
        };
        for mut cfg in [work, results, dead, groups] {
            cfg.num_replicas = self.replicas;
            self.create_or_scale(cfg).await?;
        }
        Ok(())
    }

    /// Creates the stream `cfg` describes, or updates it to `cfg`. An existing stream
    /// with fewer copies than `nats.replicas` is scaled up to it (the server copies its
    /// messages to the new peers; logged, since a large stream takes a while). One with
    /// more keeps them, also logged: a process started with the default of 1 (a worker
    /// someone forgot to configure) must not take a cluster's redundancy away. Reducing
    /// the count is an operator's decision, made on the server (`nats stream edit
    /// --replicas`).
    async fn create_or_scale(&self, mut cfg: stream::Config) -> Result<(), QueueError> {
        let name = cfg.name.clone();
        if let Ok(existing) = self.js.get_stream(&name).await {
            let had = existing.cached_info().config.num_replicas.max(1);
            if had < cfg.num_replicas {
                tracing::warn!(
                    stream = %name,
                    from = had,
                    to = cfg.num_replicas,
                    "stream has fewer copies than nats.replicas; scaling it up"
                );
            } else if had > cfg.num_replicas {
                tracing::warn!(
                    stream = %name,
                    copies = had,
                    nats_replicas = cfg.num_replicas,
                    "stream has more copies than nats.replicas; keeping them (set \
                     nats.replicas alike in every process; reduce with `nats stream edit`)"
                );
                cfg.num_replicas = had;
            }
        }
        let replicas = cfg.num_replicas;
        self.js.create_or_update_stream(cfg).await.map_err(|e| {
            replicas_err(&name, replicas, &e)
                .unwrap_or_else(|| js_err("stream provisioning")(format!("{name}: {e}")))
        })?;
        Ok(())
    }

    /// The subject names.
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// The underlying core client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The highest delivery count a consumer hands out (`4 × delivery_limit + 10`).
    pub fn max_deliver(&self) -> i64 {
        self.max_deliver
    }

    /// Creates or updates the durable consumers a worker of `stage` on `node` pulls from:
    /// one for INIT and EVAL, two for RUN (its node's subject and `any`).
    pub async fn consumers(
        &self,
        stage: Stage,
        node: &str,
    ) -> Result<Vec<consumer::PullConsumer>, QueueError> {
        let plan: Vec<(String, String)> = match stage {
            Stage::Init => vec![("init".into(), self.subjects.init())],
            Stage::Eval => vec![("eval".into(), self.subjects.eval())],
            Stage::Run => vec![
                (format!("run-{node}"), self.subjects.run(node)),
                (format!("run-{ANY_ROUTE}"), self.subjects.run(ANY_ROUTE)),
            ],
        };
        let stream = self
            .js
            .get_stream(self.subjects.stream("WORK"))
            .await
            .map_err(|e| js_err("stream lookup")(e.to_string()))?;
        let mut out = Vec::new();
        for (durable, subject) in plan {
            let cfg = consumer::pull::Config {
                durable_name: Some(durable),
                filter_subject: subject,
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: self.ack_wait,
                max_deliver: self.max_deliver,
                max_ack_pending: 100_000,
                max_waiting: 4096,
                ..Default::default()
            };
            let c = stream
                .create_consumer(cfg)
                .await
                .map_err(|e| js_err("consumer provisioning")(e.to_string()))?;
            out.push(c);
        }
        Ok(out)
    }

    /// Publishes a stage hand-off and waits until the server has stored it.
    pub async fn publish_work(
        &self,
        msg: &WorkMessage,
        route: Option<&str>,
    ) -> Result<(), QueueError> {
        let ack = self.send_work(msg, route).await?;
        ack.await
            .map_err(|e| js_err("publish ack")(e.to_string()))?;
        Ok(())
    }

    /// Publishes many hand-offs with their acks awaited together (submit of a batch).
    pub async fn publish_work_many(
        &self,
        msgs: Vec<(WorkMessage, Option<String>)>,
    ) -> Result<(), QueueError> {
        let mut pending = Vec::new();
        for (msg, route) in msgs {
            pending.push(self.send_work(&msg, route.as_deref()).await?.into_future());
            // Bound the futures held at once so a huge batch cannot exhaust memory.
            if pending.len() >= 1024 {
                try_join_all(pending.drain(..))
                    .await
                    .map_err(|e| js_err("publish ack")(e.to_string()))?;
            }
        }
        try_join_all(pending)
            .await
            .map_err(|e| js_err("publish ack")(e.to_string()))?;
        Ok(())
    }

    async fn send_work(
        &self,
        msg: &WorkMessage,
        route: Option<&str>,
    ) -> Result<jetstream::context::PublishAckFuture, QueueError> {
        let payload = serde_json::to_vec(msg).expect("work message serialises");
        self.js
            .send_publish(
                self.subjects.work(msg.stage, route),
                jetstream::message::PublishMessage::build()
                    .payload(Bytes::from(payload))
                    .message_id(msg.msg_id()),
            )
            .await
            .map_err(|e| js_err("publish")(e.to_string()))
    }

    /// Publishes a result on `P.done.<batch>` (inline, or as a reference when larger than
    /// the configured limit) and waits for the server to store it.
    pub async fn publish_result(&self, result: &JobResult) -> Result<(), QueueError> {
        let mut payload = serde_json::to_vec(result).expect("result serialises");
        if payload.len() > self.max_result_bytes {
            payload = serde_json::to_vec(&serde_json::json!({
                "seq": result.seq,
                "job_id": result.job_id,
                "batch_id": result.batch_id,
                "group_id": result.group_id,
                "client_id": result.client_id,
                "status": result.status,
                "reward": result.reward,
                "error": result.error.as_deref().map(|e| truncate(e, 4096)),
                "truncated": true,
                "href": format!("/v1/jobs/{}", result.job_id),
            }))
            .expect("reference serialises");
        }
        let ack = self
            .js
            .send_publish(
                self.subjects.done(&result.batch_id),
                jetstream::message::PublishMessage::build()
                    .payload(Bytes::from(payload))
                    .message_id(format!("{}:result", result.job_id)),
            )
            .await
            .map_err(|e| js_err("result publish")(e.to_string()))?;
        ack.await
            .map_err(|e| js_err("result publish ack")(e.to_string()))?;
        Ok(())
    }

    /// Keeps a message that exhausted its deliveries on `P.dead`, with why.
    pub async fn publish_dead(
        &self,
        msg: &WorkMessage,
        attempts: i64,
        error: &str,
    ) -> Result<(), QueueError> {
        let payload = serde_json::json!({
            "message": msg,
            "attempts": attempts,
            "error": error,
            "at": EpochMs::now(),
        });
        let ack = self
            .js
            .send_publish(
                self.subjects.dead(),
                jetstream::message::PublishMessage::build()
                    .payload(Bytes::from(payload.to_string()))
                    .message_id(format!("{}:dead", msg.msg_id())),
            )
            .await
            .map_err(|e| js_err("dead-letter publish")(e.to_string()))?;
        ack.await
            .map_err(|e| js_err("dead-letter publish ack")(e.to_string()))?;
        Ok(())
    }

    /// Broadcasts a cancel of `job_id` to every worker.
    pub async fn publish_cancel(&self, job_id: &str) -> Result<(), QueueError> {
        self.client
            .publish(self.subjects.cancel(), Bytes::from(job_id.to_string()))
            .await
            .map_err(|e| js_err("cancel publish")(e.to_string()))?;
        self.client
            .flush()
            .await
            .map_err(|e| js_err("cancel flush")(e.to_string()))
    }

    /// Broadcasts the policy row (the current version and the weight update in
    /// progress, as JSON) to every process that follows it.
    pub async fn publish_policy(
        &self,
        state: &crate::domain::policy::PolicyState,
    ) -> Result<(), QueueError> {
        let body =
            serde_json::to_vec(state).map_err(|e| js_err("policy publish")(e.to_string()))?;
        self.client
            .publish(self.subjects.policy(), Bytes::from(body))
            .await
            .map_err(|e| js_err("policy publish")(e.to_string()))?;
        self.client
            .flush()
            .await
            .map_err(|e| js_err("policy flush")(e.to_string()))
    }

    /// Subscribes to policy announcement requests in the gateways' queue group.
    pub async fn subscribe_policy_announcements(
        &self,
    ) -> Result<async_nats::Subscriber, QueueError> {
        self.queue_subscribe(self.subjects.policy_announce(), "gateways")
            .await
    }

    /// Subscribes to policy resume requests in the gateways' queue group.
    pub async fn subscribe_policy_resumes(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.queue_subscribe(self.subjects.policy_resume(), "gateways")
            .await
    }

    /// Subscribes to policy version broadcasts (every subscriber hears each).
    pub async fn subscribe_policy(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.client
            .subscribe(self.subjects.policy())
            .await
            .map_err(|e| js_err("policy subscribe")(e.to_string()))
    }

    /// Wakes the batch drivers for `batch_id` (core NATS: a lost wake costs one
    /// reconciler sweep, which drives every batch with work).
    pub async fn publish_wake(&self, batch_id: &str) -> Result<(), QueueError> {
        self.client
            .publish(
                self.subjects.batches_wake(),
                Bytes::from(batch_id.to_string()),
            )
            .await
            .map_err(|e| js_err("wake publish")(e.to_string()))
    }

    /// Subscribes to batch wakes in the drivers' queue group: each wake reaches one
    /// gateway's driver.
    pub async fn subscribe_wakes(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.queue_subscribe(self.subjects.batches_wake(), "batch-drivers")
            .await
    }

    /// Publishes an accepted group on `<prefix>.groups.<batch>` and waits for the server
    /// to store it; a repeat is dropped by its message id.
    pub async fn publish_group(&self, group: &AcceptedGroup) -> Result<(), QueueError> {
        let payload = serde_json::to_vec(group).expect("group serialises");
        let ack = self
            .js
            .send_publish(
                self.subjects.groups(&group.batch_id),
                jetstream::message::PublishMessage::build()
                    .payload(Bytes::from(payload))
                    .message_id(format!("{}:group:{}", group.batch_id, group.rank)),
            )
            .await
            .map_err(|e| js_err("group publish")(e.to_string()))?;
        ack.await
            .map_err(|e| js_err("group publish ack")(e.to_string()))?;
        Ok(())
    }

    /// Subscribes to `subject` in queue group `group` and makes sure the server has the
    /// subscription before returning (it reaches the server with the next flush; until
    /// then a request would find no responder).
    async fn queue_subscribe(
        &self,
        subject: String,
        group: &str,
    ) -> Result<async_nats::Subscriber, QueueError> {
        let sub = self
            .client
            .queue_subscribe(subject.clone(), group.to_string())
            .await
            .map_err(|e| js_err("subscribe")(format!("{subject}: {e}")))?;
        self.client
            .flush()
            .await
            .map_err(|e| js_err("subscribe")(format!("{subject}: {e}")))?;
        Ok(sub)
    }

    /// Subscribes to cancel broadcasts (payload: the job id).
    pub async fn subscribe_cancel(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.client
            .subscribe(self.subjects.cancel())
            .await
            .map_err(|e| js_err("cancel subscribe")(e.to_string()))
    }

    /// Subscribes to submit requests in the gateways' queue group, so each request is
    /// answered by exactly one gateway however many run.
    pub async fn subscribe_submits(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.queue_subscribe(self.subjects.submit(), "gateways")
            .await
    }

    /// Subscribes to sampling-batch requests in the gateways' queue group.
    pub async fn subscribe_batch_submits(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.queue_subscribe(self.subjects.batches_submit(), "gateways")
            .await
    }

    /// Subscribes (core, lossy) to result publications, as a wake-up signal.
    pub async fn subscribe_results(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.client
            .subscribe(self.subjects.done_all())
            .await
            .map_err(|e| js_err("results subscribe")(e.to_string()))
    }

    /// Subscribes to the server's advisories of work messages that ran out of deliveries
    /// (`$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<work stream>.*`).
    pub async fn subscribe_max_deliveries(&self) -> Result<async_nats::Subscriber, QueueError> {
        let subject = format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.*",
            self.subjects.stream("WORK")
        );
        self.client
            .subscribe(subject)
            .await
            .map_err(|e| js_err("advisory subscribe")(e.to_string()))
    }

    /// Feeds every message of a core subscription (or any stream that ends when its
    /// connection drops) to `on_message` until `done`,
    /// subscribing again (waiting as [`crate::retry::reconnect`] says) whenever
    /// subscribing fails or the subscription ends, as it does when the connection
    /// drops. `first`, when given, is used before subscribing anew: a caller that must
    /// not miss a message subscribes before it starts the work the messages concern.
    /// Messages are handled one at a time; a handler that must not hold up the next
    /// spawns its work.
    pub async fn follow<F, Fut, S, H>(
        what: &str,
        mut first: Option<S>,
        mut subscribe: F,
        mut on_message: impl FnMut(S::Item) -> H,
        done: &tokio_util::sync::CancellationToken,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<S, QueueError>>,
        S: futures::Stream + Unpin,
        H: Future<Output = ()>,
    {
        use futures::StreamExt;
        let mut delays = crate::retry::reconnect();
        loop {
            let next = match first.take() {
                Some(s) => Ok(s),
                None => tokio::select! {
                    s = subscribe() => s,
                    () = done.cancelled() => return,
                },
            };
            let mut sub = match next {
                Ok(s) => s,
                Err(e) => {
                    let wait = delays.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(error = %e, ?wait, "cannot subscribe to {what}; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => continue,
                        () = done.cancelled() => return,
                    }
                }
            };
            delays = crate::retry::reconnect();
            loop {
                let m = tokio::select! {
                    m = sub.next() => match m {
                        Some(m) => m,
                        None => break,
                    },
                    () = done.cancelled() => return,
                };
                on_message(m).await;
            }
        }
    }

    /// Whether the server answers a round trip now.
    pub async fn ping(&self) -> Result<(), QueueError> {
        tokio::time::timeout(Duration::from_secs(2), self.client.flush())
            .await
            .map_err(|_| js_err("ping")("timed out after 2 s".into()))?
            .map_err(|e| js_err("ping")(e.to_string()))
    }

    /// How many messages a stream holds (tests and diagnostics).
    pub async fn stream_messages(&self, suffix: &str) -> Result<u64, QueueError> {
        let mut s = self
            .js
            .get_stream(self.subjects.stream(suffix))
            .await
            .map_err(|e| js_err("stream lookup")(e.to_string()))?;
        let info = s
            .info()
            .await
            .map_err(|e| js_err("stream info")(e.to_string()))?;
        Ok(info.state.messages)
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_at_char_boundaries() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
    }

    #[test]
    fn subjects_and_streams() {
        let s = Subjects::new("rollout");
        assert_eq!(s.init(), "rollout.init");
        assert_eq!(s.work(Stage::Run, None), "rollout.run.any");
        assert_eq!(s.work(Stage::Run, Some("n1")), "rollout.run.n1");
        assert_eq!(s.done("b1"), "rollout.done.b1");
        assert_eq!(Subjects::new("t-1").stream("WORK"), "T_1_WORK");
    }
}
