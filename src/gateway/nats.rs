//! Submitting over NATS, for trainers that publish and subscribe rather than call HTTP.
//!
//! A NATS request on `<prefix>.submit` carries exactly the body of `POST /v1/jobs` and
//! gets exactly its answer as the reply: the [`SubmitResponse`](super::jobs::SubmitResponse) (batch id and one entry
//! per task, `duplicate: true` for a `client_id` seen before, so a retried request
//! creates nothing twice), or on failure an error body `{"error", "field", "status"}`
//! with the HTTP status the same input would have got, also in the `Nats-Service-Error`
//! and `Nats-Service-Error-Code` headers (the NATS services convention). The gateways
//! answer in one queue group, so each request is handled once however many run. A
//! request published without a reply subject is still submitted (and logged); its ids
//! are then only in the results.
//!
//! A request on `<prefix>.batches.submit` likewise carries the body of `POST
//! /v1/batches` and gets its [`BatchView`](crate::api::batches::BatchView) (idempotent by
//! `batch_id`), or the same error body; one on `<prefix>.policy.announce` the body of
//! `POST /v1/policy` and its [`PolicyView`](crate::api::policy::PolicyView); one on
//! `<prefix>.policy.resume` `{"version": N}`, answered as `POST /v1/policy/{N}/resume`.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::AppState;
use super::batches::create_body;
use super::error::ApiError;
use super::jobs::{submit_body, too_large};
use super::policy::{announce_body, resume_body};
use crate::queue::{Queue, QueueError};

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

/// Which request a subscription carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `<prefix>.submit`: the body of `POST /v1/jobs`.
    Jobs,
    /// `<prefix>.batches.submit`: the body of `POST /v1/batches`.
    Batches,
    /// `<prefix>.policy.announce`: the body of `POST /v1/policy`.
    Policy,
    /// `<prefix>.policy.resume`: `{"version": N}`, as `POST /v1/policy/{N}/resume`.
    PolicyResume,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Jobs => "submit requests",
            Endpoint::Batches => "batch requests",
            Endpoint::Policy => "policy announcements",
            Endpoint::PolicyResume => "policy resumes",
        }
    }

    /// The name its listener task is supervised under.
    pub fn listener(self) -> &'static str {
        match self {
            Endpoint::Jobs => "NATS submit listener",
            Endpoint::Batches => "NATS batch listener",
            Endpoint::Policy => "NATS policy listener",
            Endpoint::PolicyResume => "NATS policy resume listener",
        }
    }

    /// Subscribes to its subject in the gateways' queue group.
    pub async fn subscribe(self, queue: &Queue) -> Result<async_nats::Subscriber, QueueError> {
        match self {
            Endpoint::Jobs => queue.subscribe_submits().await,
            Endpoint::Batches => queue.subscribe_batch_submits().await,
            Endpoint::Policy => queue.subscribe_policy_announcements().await,
            Endpoint::PolicyResume => queue.subscribe_policy_resumes().await,
        }
    }

    /// Handles one body as the HTTP endpoint would; the reply's JSON.
    async fn handle(self, state: &AppState, body: &[u8]) -> Result<serde_json::Value, ApiError> {
        let value = match self {
            Endpoint::Jobs => serde_json::to_value(submit_body(state, body).await?),
            Endpoint::Batches => serde_json::to_value(create_body(state, body).await?),
            Endpoint::Policy => serde_json::to_value(announce_body(state, body).await?),
            Endpoint::PolicyResume => serde_json::to_value(resume_body(state, body).await?),
        };
        Ok(value.expect("a reply serialises"))
    }
}

/// Answers requests on `endpoint`'s subject (starting with `subscription`, made before
/// the gateway took requests) until `shutdown`; requests being handled then are
/// finished first.
pub async fn serve_submits(
    state: AppState,
    endpoint: Endpoint,
    subscription: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    let state = Arc::new(state);
    let handlers = TaskTracker::new();
    let queue = state.queue.clone();
    Queue::follow(
        endpoint.name(),
        Some(subscription),
        || endpoint.subscribe(&queue),
        |msg| {
            let state = state.clone();
            let span = tracing::info_span!("nats_submit", subject = %msg.subject);
            handlers.spawn(answer(state, endpoint, msg).instrument(span));
            std::future::ready(())
        },
        &shutdown,
    )
    .await;
    handlers.close();
    handlers.wait().await;
}

/// Handles one request and replies.
async fn answer(state: Arc<AppState>, endpoint: Endpoint, msg: async_nats::Message) {
    let outcome = if msg.payload.len() > state.settings.gateway.max_body_bytes {
        Err(too_large(&state))
    } else {
        endpoint.handle(&state, &msg.payload).await
    }
    .map_err(|e| SubmitErrorReply {
        error: e.body.error,
        field: e.body.field,
        status: e.status.as_u16(),
    });
    let Some(reply) = msg.reply else {
        match outcome {
            Ok(_) => tracing::info!(
                "{} without a reply subject: submitted, nobody told",
                endpoint.name()
            ),
            Err(e) => tracing::warn!(
                error = %e.error,
                "{} without a reply subject refused, nobody told",
                endpoint.name()
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
        tracing::warn!(error = %e, "cannot send the reply; the requester will retry");
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("a reply serialises")
}

/// A header value must be one line.
fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// The reply to a request on a submit or announce subject, decoded: the response (a
/// [`SubmitResponse`](super::jobs::SubmitResponse) for `<prefix>.submit`, a
/// [`BatchView`](crate::api::batches::BatchView) for `<prefix>.batches.submit`, a
/// [`PolicyView`](crate::api::policy::PolicyView) for `<prefix>.policy.announce`), or
/// the error. The error's shape is tried first: a response whose fields are all
/// optional (a `PolicyView`) would read any error body as itself.
pub fn decode_reply<T: DeserializeOwned>(payload: &[u8]) -> Result<T, SubmitErrorReply> {
    if let Ok(e) = serde_json::from_slice::<SubmitErrorReply>(payload) {
        return Err(e);
    }
    serde_json::from_slice::<T>(payload).map_err(|e| SubmitErrorReply {
        error: format!("unreadable reply: {e}"),
        field: None,
        status: 502,
    })
}
