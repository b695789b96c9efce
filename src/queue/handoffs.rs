//! Hand-offs and outcomes, what the stage workers, the job endings, the reconciler and
//! the gateway's submits publish: stage hand-offs (one, or a batch's many), results,
//! dead letters, and the cancel broadcast the workers listen to.

use std::future::IntoFuture;

use async_nats::jetstream;
use bytes::Bytes;
use futures::future::try_join_all;

use super::{Queue, QueueError, js_err};
use crate::domain::{EpochMs, JobResult, WorkMessage};

impl Queue {
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

    /// Publishes the hand-off again under a message id of its own, so that the server
    /// does not drop it as a copy of the first (it would, inside the duplicate window,
    /// even when the first is gone: delivered, and acknowledged by a worker whose claim
    /// had been superseded, while the job went back to its queue). A copy that does
    /// reach a worker is dropped at pickup by the claim's compare-and-set. `at` makes
    /// the id; one publish per job and `at` is what the caller guarantees.
    pub async fn publish_work_again(
        &self,
        msg: &WorkMessage,
        route: Option<&str>,
        at: EpochMs,
    ) -> Result<(), QueueError> {
        let id = format!("{}:again:{}", msg.msg_id(), at.0);
        let ack = self.send_work_as(msg, route, id).await?;
        ack.await
            .map_err(|e| js_err("publish ack")(e.to_string()))?;
        Ok(())
    }

    async fn send_work(
        &self,
        msg: &WorkMessage,
        route: Option<&str>,
    ) -> Result<jetstream::context::PublishAckFuture, QueueError> {
        self.send_work_as(msg, route, msg.msg_id()).await
    }

    async fn send_work_as(
        &self,
        msg: &WorkMessage,
        route: Option<&str>,
        id: String,
    ) -> Result<jetstream::context::PublishAckFuture, QueueError> {
        let payload = serde_json::to_vec(msg).expect("work message serialises");
        self.js
            .send_publish(
                self.subjects.work(msg.stage, route),
                jetstream::message::PublishMessage::build()
                    .payload(Bytes::from(payload))
                    .message_id(id),
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

    /// Subscribes to cancel broadcasts (payload: the job id).
    pub async fn subscribe_cancel(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.client
            .subscribe(self.subjects.cancel())
            .await
            .map_err(|e| js_err("cancel subscribe")(e.to_string()))
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
}
