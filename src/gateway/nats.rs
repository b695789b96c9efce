//! Submitting over NATS, for trainers that publish and subscribe rather than call HTTP.
//!
//! A NATS request on `<prefix>.submit` carries exactly the body of `POST /v1/jobs` and
//! gets exactly its answer as the reply: the [`SubmitResponse`] (batch id and one entry
//! per task, `duplicate: true` for a `client_id` seen before, so a retried request
//! creates nothing twice), or on failure an error body `{"error", "field", "status"}`
//! with the HTTP status the same input would have got, also in the `Nats-Service-Error`
//! and `Nats-Service-Error-Code` headers (the NATS services convention). The gateways
//! answer in one queue group, so each request is handled once however many run. A
//! request published without a reply subject is still submitted (and logged); its ids
//! are then only in the results.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::AppState;
use super::jobs::{SubmitResponse, submit_body, too_large};
use crate::queue::Queue;

/// The reply to a submit request that failed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SubmitErrorReply {
    /// What went wrong and what to do about it.
    pub error: String,
    /// The offending field for bad input, as a path such as `tasks[2].spec.run_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The HTTP status `POST /v1/jobs` answers the same input with (400 bad input, 503
    /// retry later, …).
    pub status: u16,
}

/// Answers submit requests on `<prefix>.submit` (starting with `subscription`, made by
/// [`Queue::subscribe_submits`] before the gateway took requests) until `shutdown`;
/// requests being handled then are finished first.
pub async fn serve_submits(
    state: AppState,
    subscription: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    let state = Arc::new(state);
    let handlers = TaskTracker::new();
    let queue = state.queue.clone();
    Queue::follow(
        "submit requests",
        Some(subscription),
        || queue.subscribe_submits(),
        |msg| {
            let state = state.clone();
            let span = tracing::info_span!("nats_submit", subject = %msg.subject);
            handlers.spawn(answer(state, msg).instrument(span));
            std::future::ready(())
        },
        &shutdown,
    )
    .await;
    handlers.close();
    handlers.wait().await;
}

/// Submits one request's tasks and replies.
async fn answer(state: Arc<AppState>, msg: async_nats::Message) {
    let outcome = if msg.payload.len() > state.settings.gateway.max_body_bytes {
        Err(too_large(&state))
    } else {
        submit_body(&state, &msg.payload).await
    }
    .map_err(|e| SubmitErrorReply {
        error: e.body.error,
        field: e.body.field,
        status: e.status.as_u16(),
    });
    let Some(reply) = msg.reply else {
        match outcome {
            Ok(r) => tracing::info!(
                batch_id = %r.batch_id,
                jobs = r.jobs.len(),
                "submit request without a reply subject: submitted, nobody told"
            ),
            Err(e) => tracing::warn!(
                error = %e.error,
                "submit request without a reply subject refused, nobody told"
            ),
        }
        return;
    };
    let client = state.queue.client();
    let sent = match outcome {
        Ok(response) => client.publish(reply, encode(&response).into()).await,
        Err(e) => {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Service-Error", one_line(&e.error).as_str());
            headers.insert("Nats-Service-Error-Code", e.status.to_string().as_str());
            client
                .publish_with_headers(reply, headers, encode(&e).into())
                .await
        }
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot send the submit reply; the requester will retry");
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("a reply serialises")
}

/// A header value must be one line.
fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// The reply to a submit request, decoded: the response, or the error.
pub fn decode_reply(payload: &[u8]) -> Result<SubmitResponse, SubmitErrorReply> {
    match serde_json::from_slice::<SubmitResponse>(payload) {
        Ok(r) => Ok(r),
        Err(_) => Err(
            serde_json::from_slice::<SubmitErrorReply>(payload).unwrap_or_else(|e| {
                SubmitErrorReply {
                    error: format!("unreadable submit reply: {e}"),
                    field: None,
                    status: 502,
                }
            }),
        ),
    }
}
