//! The model endpoint relay: an HTTP listener inside the sandbox whose requests are
//! answered by the host.
//!
//! An agent program (one written elsewhere, on the `openai` SDK, LiteLLM, …) runs in
//! the sandbox and wants an OpenAI-compatible base URL. The sandbox has no network, so
//! the server listens on the sandbox's own loopback (`127.0.0.1`, a port the kernel
//! picks) and relays each HTTP request to the host over the sandbox socket it already
//! serves, by long polling: the host asks `endpoint_next`, which answers with the next
//! request the agent made (or with none when its wait ran out), and answers that
//! request with `endpoint_reply`. The relay knows nothing of models: it checks the
//! episode's key (`Authorization: Bearer <key>`, or `api-key: <key>`), caps the body,
//! and passes method, path and body on; which paths exist, what they return and how
//! many calls an episode may make is the host's to decide. Nothing it receives is
//! forwarded anywhere but to the host, so it cannot be used to reach another address.
//!
//! Requests are answered in any order: an agent with several calls in flight (parallel
//! sub-agents) gets each answer as the host sends it.

use crate::protocol::{EndpointCall, EndpointNext, EndpointOpenArgs, EndpointReplyArgs};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

/// The largest request body the relay takes when the host sets no cap (8 MiB: a long
/// conversation's messages, well below a protocol frame).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// How many requests may wait for the host to take them.
const QUEUE: usize = 64;

/// The host's answer to one relayed request.
#[derive(Debug)]
struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

/// A request waiting for the host to take it.
struct Waiting {
    call: EndpointCall,
    reply: oneshot::Sender<Reply>,
}

/// The listener once opened: its port and the key its requests must carry.
#[derive(Debug, Clone)]
struct Opened {
    port: u16,
    key: String,
}

/// The relay's state: at most one listener per sandbox, opened by the host's first
/// `endpoint_open`.
pub struct ModelEndpoint {
    opened: tokio::sync::Mutex<Option<Opened>>,
    queue_tx: mpsc::Sender<Waiting>,
    queue_rx: tokio::sync::Mutex<mpsc::Receiver<Waiting>>,
    /// Requests the host has taken and not yet answered, by id.
    taken: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
}

impl Default for ModelEndpoint {
    fn default() -> Self {
        let (queue_tx, queue_rx) = mpsc::channel(QUEUE);
        ModelEndpoint {
            opened: tokio::sync::Mutex::new(None),
            queue_tx,
            queue_rx: tokio::sync::Mutex::new(queue_rx),
            taken: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl ModelEndpoint {
    /// Opens the listener (once; a second open with the same key answers with the same
    /// port) and returns its port.
    pub async fn open(self: &std::sync::Arc<Self>, args: &EndpointOpenArgs) -> Result<u16, String> {
        if args.key.len() < 16 {
            return Err("the endpoint's key must be at least 16 characters".into());
        }
        let mut opened = self.opened.lock().await;
        if let Some(o) = opened.as_ref() {
            return if o.key == args.key {
                Ok(o.port)
            } else {
                Err("the endpoint is already open with another key".into())
            };
        }
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("cannot listen on the sandbox's loopback: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("cannot read the listener's port: {e}"))?
            .port();
        *opened = Some(Opened {
            port,
            key: args.key.clone(),
        });
        let me = self.clone();
        let key = args.key.clone();
        let max_body = args.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        tokio::spawn(async move { me.accept(listener, key, max_body).await });
        Ok(port)
    }

    async fn accept(
        self: std::sync::Arc<Self>,
        listener: TcpListener,
        key: String,
        max_body: usize,
    ) {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "endpoint accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let me = self.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let me = me.clone();
                    let key = key.clone();
                    async move { Ok::<_, std::convert::Infallible>(me.relay(req, &key, max_body).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(error = %e, "endpoint connection ended");
                }
            });
        }
    }

    /// One HTTP request: checked here, answered by the host.
    async fn relay(
        &self,
        req: Request<Incoming>,
        key: &str,
        max_body: usize,
    ) -> Response<Full<Bytes>> {
        if !authorized(req.headers(), key) {
            return error(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "this endpoint serves one episode: use the OPENAI_API_KEY it was started with",
            );
        }
        let method = req.method().as_str().to_string();
        let path = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
        let body = match Limited::new(req.into_body(), max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    &format!("the request body is over this endpoint's {max_body} bytes"),
                );
            }
        };
        let Ok(body) = String::from_utf8(body.to_vec()) else {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "the request body is not UTF-8",
            );
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let waiting = Waiting {
            call: EndpointCall {
                id,
                method,
                path,
                body,
            },
            reply: tx,
        };
        if self.queue_tx.send(waiting).await.is_err() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the endpoint is closing",
            );
        }
        match rx.await {
            Ok(r) => Response::builder()
                .status(StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY))
                .header("content-type", r.content_type)
                .body(Full::new(Bytes::from(r.body)))
                .unwrap_or_else(|_| {
                    error(
                        StatusCode::BAD_GATEWAY,
                        "bad_reply",
                        "the host's reply was malformed",
                    )
                }),
            Err(_) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the host dropped this request",
            ),
        }
    }

    /// The next request the agent made, waiting up to `wait` for one.
    pub async fn next(&self, wait: Duration) -> EndpointNext {
        let mut rx = self.queue_rx.lock().await;
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(w)) => {
                self.taken
                    .lock()
                    .expect("endpoint lock")
                    .insert(w.call.id, w.reply);
                EndpointNext { call: Some(w.call) }
            }
            _ => EndpointNext { call: None },
        }
    }

    /// Answers request `args.id`; false when there is no such request waiting (answered
    /// already, or the agent hung up).
    pub fn reply(&self, args: EndpointReplyArgs) -> bool {
        let Some(tx) = self.taken.lock().expect("endpoint lock").remove(&args.id) else {
            return false;
        };
        tx.send(Reply {
            status: args.status,
            content_type: args
                .content_type
                .unwrap_or_else(|| "application/json".to_string()),
            body: args.body,
        })
        .is_ok()
    }
}

/// Whether the request carries the episode's key (compared in constant time).
fn authorized(headers: &hyper::HeaderMap, key: &str) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())))
}

/// An OpenAI-style error answer made by the relay itself.
fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": {"message": message, "type": code, "code": code}});
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a fixed response builds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_episodes_key_is_let_in() {
        let key = "k".repeat(32);
        let mut h = hyper::HeaderMap::new();
        assert!(!authorized(&h, &key));
        h.insert("authorization", format!("Bearer {key}").parse().unwrap());
        assert!(authorized(&h, &key));
        h.insert("authorization", "Bearer nope".parse().unwrap());
        assert!(!authorized(&h, &key));
        let mut h = hyper::HeaderMap::new();
        h.insert("api-key", key.parse().unwrap());
        assert!(authorized(&h, &key));
    }
}
