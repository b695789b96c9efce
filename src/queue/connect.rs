//! Connecting and provisioning, what every process does once at its start: the
//! connection with the deployment's credentials, the streams (created, or scaled to the
//! configured replicas), and a stage worker's durable consumers.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

use super::{ANY_ROUTE, Queue, QueueError, Subjects, js_err, replicas_err};
use crate::config::Settings;
use crate::domain::Stage;

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
}
