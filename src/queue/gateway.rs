//! What the gateways listen to: submits and sampling-batch requests, policy
//! announcements and resumes (each in the gateways' queue group, so one gateway answers
//! each however many run), result publications as a wake-up signal, and the server's
//! advisories of work messages that ran out of deliveries.

use super::{Queue, QueueError, js_err};

impl Queue {
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
}
