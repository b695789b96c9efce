//! What the sampling-batch drivers exchange: wakes (core NATS, one driver each) and the
//! accepted groups a batch streams to its trainer.

use async_nats::jetstream;
use bytes::Bytes;

use super::{Queue, QueueError, js_err};
use crate::domain::sampling::AcceptedGroup;

impl Queue {
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
}
