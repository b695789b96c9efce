//! The policy version broadcast, which every process follows: the gateway publishes the
//! policy row after each change, and workers and gateways tag generated tokens with it.

use bytes::Bytes;

use super::{Queue, QueueError, js_err};

impl Queue {
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

    /// Subscribes to policy version broadcasts (every subscriber hears each).
    pub async fn subscribe_policy(&self) -> Result<async_nats::Subscriber, QueueError> {
        self.client
            .subscribe(self.subjects.policy())
            .await
            .map_err(|e| js_err("policy subscribe")(e.to_string()))
    }
}
