//! The queue as a stage worker sees it: deliveries pulled a few at a time and answered
//! (ack, nak with a delay, in progress, terminate), hand-offs, results and dead letters
//! published, and cancel broadcasts heard.
//!
//! Behind traits so the worker's protocol (claim, lease, record, flow control, hand-back)
//! can be driven in memory by its unit tests, with barriers instead of a server and
//! sleeps; [`Queue`] implements them over JetStream, and the end-to-end tests keep
//! running the worker against a real server.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::{Queue, QueueError, js_err};
use crate::domain::{JobResult, Stage, WorkMessage};

/// How a worker answers a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Done with it: the queue forgets the message.
    Ack,
    /// Not now: deliver it again, after the delay if one is given.
    Nak(Option<Duration>),
    /// Still working on it: restart the redelivery timer.
    Progress,
    /// It can never be handled (it does not decode): never deliver it again.
    Term,
}

/// One delivery of a stage message.
#[async_trait]
pub trait Delivery: Send + Sync {
    /// The message body (a JSON [`WorkMessage`] when well-formed).
    fn payload(&self) -> &[u8];
    /// Where it was published, for logs.
    fn subject(&self) -> &str;
    /// How many times the queue has delivered it, this time included.
    fn delivered(&self) -> i64;
    /// Answers the delivery. A failed answer only means the message comes back.
    async fn answer(&self, answer: Answer) -> Result<(), QueueError>;
}

/// A stage's deliveries for one worker.
#[async_trait]
pub trait WorkSource: Send {
    /// Asks for at most `max` messages and hands each to `deliver` as it arrives;
    /// returns, with how many came, once this request is over (answered, expired, or
    /// its server lost). An error means the request could not be made: the caller
    /// backs off and asks again.
    async fn pull(
        &mut self,
        max: usize,
        deliver: &mut (dyn FnMut(Box<dyn Delivery>) + Send),
    ) -> Result<usize, QueueError>;
}

/// What moves or ends a job publishes: hand-offs, results, dead-letter copies and the
/// sampling drivers' wakes.
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Publishes a stage hand-off and waits until the queue has stored it.
    async fn publish_work(&self, msg: &WorkMessage, route: Option<&str>) -> Result<(), QueueError>;
    /// Publishes a job's result and waits until the queue has stored it.
    async fn publish_result(&self, result: &JobResult) -> Result<(), QueueError>;
    /// Keeps a copy of a message that is given up on, with why.
    async fn publish_dead(
        &self,
        msg: &WorkMessage,
        attempts: i64,
        error: &str,
    ) -> Result<(), QueueError>;
    /// Wakes the sampling drivers of `batch_id` (a group of it was decided).
    async fn publish_wake(&self, batch_id: &str) -> Result<(), QueueError>;
}

/// Everything a stage worker needs of the queue.
#[async_trait]
pub trait WorkQueue: Outbox {
    /// The deliveries of `stage` for a worker on `node` (for RUN: its node's and any
    /// node's), set up if they are not yet.
    async fn source(&self, stage: Stage, node: &str) -> Result<Box<dyn WorkSource>, QueueError>;
    /// The ids of the jobs whose cancel is broadcast from now on; the stream ends when
    /// the connection drops (subscribe again).
    async fn cancels(&self) -> Result<BoxStream<'static, String>, QueueError>;
}

#[async_trait]
impl Outbox for Queue {
    async fn publish_work(&self, msg: &WorkMessage, route: Option<&str>) -> Result<(), QueueError> {
        Queue::publish_work(self, msg, route).await
    }

    async fn publish_result(&self, result: &JobResult) -> Result<(), QueueError> {
        Queue::publish_result(self, result).await
    }

    async fn publish_dead(
        &self,
        msg: &WorkMessage,
        attempts: i64,
        error: &str,
    ) -> Result<(), QueueError> {
        Queue::publish_dead(self, msg, attempts, error).await
    }

    async fn publish_wake(&self, batch_id: &str) -> Result<(), QueueError> {
        Queue::publish_wake(self, batch_id).await
    }
}

#[async_trait]
impl WorkQueue for Queue {
    async fn source(&self, stage: Stage, node: &str) -> Result<Box<dyn WorkSource>, QueueError> {
        let consumers = self.consumers(stage, node).await?;
        Ok(Box::new(NatsSource {
            consumers,
            primary: 0,
        }))
    }

    async fn cancels(&self) -> Result<BoxStream<'static, String>, QueueError> {
        let sub = self.subscribe_cancel().await?;
        Ok(sub
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
            .boxed())
    }
}

/// The longest a worker waits for the answer to a fetch (a pull that the server answers
/// at once, with the messages it has or with none). Far above a live server's answer
/// time, and short enough that a request lost with its server costs little.
const FETCH_LIMIT: Duration = Duration::from_secs(5);

/// A stage's durable pull consumers: one for INIT and EVAL; for RUN, the node's own
/// and then any node's ([`super::ANY_ROUTE`]).
struct NatsSource {
    consumers: Vec<PullConsumer>,
    /// The consumer that last had messages: the one long-polled.
    primary: usize,
}

#[async_trait]
impl WorkSource for NatsSource {
    /// With one consumer, a long poll that delivers the moment a message arrives. A RUN
    /// worker has two (its node's subject and `any`), and usually only one of them
    /// carries traffic; so it first sweeps both without waiting, and long-polls only the
    /// one that last had messages, briefly, so a message on the other waits at most that
    /// long.
    async fn pull(
        &mut self,
        max: usize,
        deliver: &mut (dyn FnMut(Box<dyn Delivery>) + Send),
    ) -> Result<usize, QueueError> {
        let mut got = 0;
        let long_poll = if self.consumers.len() > 1 {
            for (i, c) in self.consumers.iter().enumerate() {
                if got == max {
                    break;
                }
                match c.fetch().max_messages(max - got).messages().await {
                    Ok(mut batch) => {
                        // A fetch has no expiry, so the client never gives up on it by
                        // itself: if the server that took the request dies (a cluster's
                        // consumer leader), no answer ever comes. Waiting at most
                        // FETCH_LIMIT keeps the loop going; what the lost request would
                        // have delivered is redelivered.
                        let drained = tokio::time::timeout(FETCH_LIMIT, async {
                            while let Some(Ok(msg)) = batch.next().await {
                                deliver(Box::new(NatsDelivery(msg)));
                                got += 1;
                                self.primary = i;
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
            if got > 0 {
                return Ok(got);
            }
            Duration::from_millis(250)
        } else {
            Duration::from_secs(2)
        };
        let mut batch = self.consumers[self.primary]
            .batch()
            .max_messages(max)
            .expires(long_poll)
            .messages()
            .await
            .map_err(|e| js_err("pull request")(e.to_string()))?;
        while let Some(m) = batch.next().await {
            match m {
                Ok(msg) => {
                    deliver(Box::new(NatsDelivery(msg)));
                    got += 1;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "pull batch ended with an error");
                    break;
                }
            }
        }
        Ok(got)
    }
}

/// A JetStream message delivered by a pull consumer.
struct NatsDelivery(jetstream::Message);

#[async_trait]
impl Delivery for NatsDelivery {
    fn payload(&self) -> &[u8] {
        &self.0.payload
    }

    fn subject(&self) -> &str {
        self.0.subject.as_str()
    }

    fn delivered(&self) -> i64 {
        self.0.info().map(|i| i.delivered).unwrap_or(1)
    }

    async fn answer(&self, answer: Answer) -> Result<(), QueueError> {
        let kind = match answer {
            Answer::Ack => AckKind::Ack,
            Answer::Nak(delay) => AckKind::Nak(delay),
            Answer::Progress => AckKind::Progress,
            Answer::Term => AckKind::Term,
        };
        self.0
            .ack_with(kind)
            .await
            .map_err(|e| js_err("acknowledgement")(e.to_string()))
    }
}
