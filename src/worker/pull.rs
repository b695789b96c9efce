//! The flow-controlled pull loop: a worker never asks the server for more messages than
//! it has free slots, so no message waits in a local buffer while its ack timer runs.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Worker;

/// Most messages asked for in one pull request.
const MAX_BATCH: usize = 256;

/// The longest a worker waits for the answer to a fetch (a pull that the server answers
/// at once, with the messages it has or with none). Far above a live server's answer
/// time, and short enough that a request lost with its server costs little.
const FETCH_LIMIT: Duration = Duration::from_secs(5);

impl Worker {
    /// Pulls from the stage's consumers, never asking for more messages than free slots.
    ///
    /// Slots are reserved before a pull request is made, so a request waiting on an empty
    /// consumer holds them. With one consumer that is what we want (a long-poll that
    /// delivers the moment a message arrives). A RUN worker has two (its node's subject
    /// and `any`), and usually only one of them carries traffic; so it first sweeps both
    /// without waiting, and long-polls only the one that last had messages, briefly, so
    /// a message on the other waits at most that long.
    pub(super) async fn pull(
        self: Arc<Self>,
        consumers: Vec<jetstream::consumer::PullConsumer>,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let mut failures = 0u32;
        let mut delays = crate::retry::pull_errors();
        let mut primary = 0usize;
        let long_poll = if consumers.len() > 1 {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(2)
        };
        'outer: loop {
            let first = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
                _ = shutdown.cancelled() => break,
            };
            let mut permits = vec![first];
            while permits.len() < MAX_BATCH {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            if consumers.len() > 1 {
                let mut got = false;
                for (i, c) in consumers.iter().enumerate() {
                    if permits.is_empty() {
                        break;
                    }
                    match c.fetch().max_messages(permits.len()).messages().await {
                        Ok(mut batch) => {
                            // A fetch has no expiry, so the client never gives up on
                            // it by itself: if the server that took the request dies
                            // (a cluster's consumer leader), no answer ever comes.
                            // Waiting at most FETCH_LIMIT keeps the loop going; what
                            // the lost request would have delivered is redelivered.
                            let drained = tokio::time::timeout(FETCH_LIMIT, async {
                                while let Some(Ok(msg)) = batch.next().await {
                                    let permit = permits.pop().expect("one permit per message");
                                    tracker.spawn(self.clone().handle(msg, permit));
                                    got = true;
                                    primary = i;
                                }
                            })
                            .await;
                            if drained.is_err() {
                                tracing::warn!(
                                    ?FETCH_LIMIT,
                                    "fetch unanswered (server lost?); pulling again"
                                );
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "fetch failed"),
                    }
                }
                if got {
                    continue;
                }
            }
            let batch = consumers[primary]
                .batch()
                .max_messages(permits.len())
                .expires(long_poll)
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => {
                    if failures > 0 {
                        failures = 0;
                        delays = crate::retry::pull_errors();
                    }
                    b
                }
                Err(e) => {
                    failures += 1;
                    let backoff = delays.next().unwrap_or(Duration::from_millis(6_400));
                    tracing::warn!(error = %e, failures, ?backoff, "pull request failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => continue,
                        _ = shutdown.cancelled() => break,
                    }
                }
            };
            loop {
                tokio::select! {
                    m = batch.next() => match m {
                        Some(Ok(msg)) => {
                            let permit = permits.pop().expect("one permit per requested message");
                            tracker.spawn(self.clone().handle(msg, permit));
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "pull batch ended with an error");
                            break;
                        }
                        None => break,
                    },
                    _ = shutdown.cancelled() => break 'outer,
                }
            }
        }
    }
}
