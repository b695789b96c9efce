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

//!
//! The [`Queue`] handle's methods are split by who calls them: [`connect`] (every
//! process at its start: connection, streams, a worker's consumers), [`handoffs`] (the
//! workers, job endings, reconciler and submits: hand-offs, results, dead letters,
//! cancels), [`gateway`] (what the gateways listen to), [`policy`] (the policy version
//! every process follows) and [`batches`] (the sampling-batch drivers); [`subjects`]
//! names everything, and [`work`] is the stage workers' view of their consumers.

mod batches;
mod connect;
mod gateway;
mod handoffs;
mod policy;
mod subjects;
mod work;

pub use subjects::{ANY_ROUTE, Subjects};
pub use work::{Answer, Delivery, Outbox, WorkQueue, WorkSource};

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;

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
