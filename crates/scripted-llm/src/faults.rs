//! Faults on command: what `POST /control` sets ([`Control`]), and how a generation
//! request plays the fault set ([`play_fault`]) instead of, or part-way through, its
//! answer. A test of the service's retries, timeouts and health checks needs a server
//! that fails when told to, as a real one fails only when it likes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::Shared;

/// A fault to play: how the stand-in misbehaves, the ways a real inference server (or
/// the network to it) does, so the service's handling of each can be tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// Answer normally.
    Ok,
    /// Answer generation requests with HTTP 500.
    Fail,
    /// Never answer generation requests (until the client gives up).
    Stall,
    /// Close the connection without an answer.
    Drop,
    /// Answer everything, `/health` included, with HTTP 503.
    Down,
    /// Answer generation requests with HTTP 503, `/health` still answering: a server,
    /// or a proxy in front of one, that is overloaded or draining. (Neither vLLM nor
    /// SGLang answers a pause this way: a paused vLLM holds requests until it resumes,
    /// which `POST /pause` plays; see [`crate::pause`].)
    Paused,
    /// Abort the generation part-way, as vLLM (`finish_reason: "abort"`) and SGLang
    /// (`{"type": "abort"}`) answer a request they drop (a weight update, a pause).
    Abort,
}

/// `POST /control` body: play `mode` for the next `count` generation requests (all of
/// them when absent), then answer normally again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Control {
    /// The fault.
    pub mode: FaultMode,
    /// How many requests it applies to.
    #[serde(default)]
    pub count: Option<u64>,
}

impl Shared {
    /// The fault for this request, consuming one from its count.
    pub(crate) fn take_fault(&self) -> FaultMode {
        let mut f = self.fault.lock().expect("lock");
        let mode = f.0;
        if mode == FaultMode::Ok {
            return mode;
        }
        if let Some(n) = f.1.as_mut() {
            if *n == 0 {
                *f = (FaultMode::Ok, None);
                return FaultMode::Ok;
            }
            *n -= 1;
        }
        mode
    }

    /// Whether the fault set is [`FaultMode::Down`]: then even `/health` and
    /// `/v1/models` answer 503.
    pub(crate) fn is_down(&self) -> bool {
        self.fault.lock().expect("lock").0 == FaultMode::Down
    }
}

/// Plays the fault set for the next request (counting it): `Err` is the response to
/// send instead of an answer, `Ok(true)` an answer cut short as aborted.
pub(crate) async fn play_fault(s: &Shared) -> Result<bool, Response> {
    match s.take_fault() {
        FaultMode::Ok => Ok(false),
        FaultMode::Abort => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        FaultMode::Paused => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Err((
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"object": "error", "message": "the server is paused", "code": 503})),
            )
                .into_response())
        }
        FaultMode::Fail => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(serde_json::json!({"object": "error", "message": "scripted failure", "code": 500})),
            )
                .into_response())
        }
        FaultMode::Down => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Err(StatusCode::SERVICE_UNAVAILABLE.into_response())
        }
        FaultMode::Stall => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            s.shutdown.cancelled().await;
            Err(StatusCode::SERVICE_UNAVAILABLE.into_response())
        }
        FaultMode::Drop => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            // Headers, then a body that fails: the connection is closed mid-answer.
            let body = Body::from_stream(futures::stream::once(async {
                Err::<bytes::Bytes, _>(std::io::Error::other("scripted connection drop"))
            }));
            Err(Response::builder()
                .status(StatusCode::OK)
                .body(body)
                .expect("response builds"))
        }
    }
}

/// `POST /control`: sets the fault to play (see [`Control`]).
pub(crate) async fn post_control(
    State(s): State<Arc<Shared>>,
    Json(c): Json<Control>,
) -> StatusCode {
    tracing::info!(mode = ?c.mode, count = ?c.count, "fault mode set");
    *s.fault.lock().expect("lock") = (c.mode, c.count);
    StatusCode::NO_CONTENT
}
