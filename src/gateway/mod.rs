//! The HTTP gateway: the API trainers and dashboards use.
//!
//! Stateless: everything lives in the database and the queue, so any number of gateways
//! can run behind a balancer. The OpenAPI document at `GET /openapi.json` is generated
//! from the handlers' annotations, so it cannot drift from the code. With
//! `gateway.token` set, every other endpoint but `GET /healthz` and the status page's
//! files requires the token (see [`auth`]). The status page ([`page`]) is served at `/`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::status::{DependencyHealth, Health, StatusView};
use crate::config::Settings;
use crate::queue::Queue;
use crate::stage::Registry;
use crate::store::Store;

pub mod auth;
pub mod backends;
pub mod batches;
pub mod dashboard;
pub mod error;
pub mod jobs;
pub mod nats;
pub mod page;
mod params;
pub mod policy;
pub mod results;
pub mod training;
mod wire;

use error::{ApiError, ApiErrorBody};
use params::{ApiQuery, CheckQuery};

/// Shared state of all handlers.
#[derive(Clone)]
pub struct AppState {
    /// Job state.
    pub store: Arc<dyn Store>,
    /// The queue.
    pub queue: Queue,
    /// Known task kinds (for validation).
    pub kinds: Registry,
    /// Settings.
    pub settings: Arc<Settings>,
    /// Changes whenever a result is published (a wake-up for long-polls and streams).
    pub results_signal: watch::Receiver<u64>,
    /// Fires at shutdown; streaming responses end on it.
    pub shutdown: CancellationToken,
    /// Metrics renderer.
    pub metrics: PrometheusHandle,
    /// What this host's sandboxes are held to (reported by `GET /healthz`).
    pub sandbox: crate::sandbox::SandboxReport,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "rollout",
        description = "Rollout service for RL training of multi-turn LLM agents: submit tasks, \
                       receive scored trajectories."
    ),
    tags(
        (name = "jobs", description = "Submit, inspect and cancel jobs"),
        (name = "results", description = "Receive results in a stable order"),
        (name = "batches", description = "Dynamic-sampling batches: K informative groups, early cancel of the rest"),
        (name = "backends", description = "The inference backend pool"),
        (name = "policy", description = "Policy versions: which weights produced which tokens, and weight updates without draining"),
        (name = "service", description = "Health, metrics and counts"),
    )
)]
struct ApiDoc;

/// Builds the router and the OpenAPI document, behind the bearer-token check when
/// `gateway.token` is set.
pub fn router(state: AppState) -> Router {
    let max_body = state.settings.gateway.max_body_bytes;
    let auth_state = state.clone();
    let (kinds, settings) = (state.kinds.clone(), state.settings.clone());
    let token_required = !state.settings.gateway.token.is_empty();
    let (router, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::submit, jobs::list_jobs))
        .routes(routes!(jobs::get_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(results::results))
        .routes(routes!(results::results_stream))
        .routes(routes!(batches::create_batch))
        .routes(routes!(batches::get_batch))
        .routes(routes!(batches::cancel_batch))
        .routes(routes!(batches::groups))
        .routes(routes!(batches::groups_stream))
        .routes(routes!(batches::verdicts))
        .routes(routes!(backends::list_backends, backends::add_backend))
        .routes(routes!(backends::get_backend, backends::remove_backend))
        .routes(routes!(policy::announce_policy, policy::current_policy))
        .routes(routes!(policy::resume_policy))
        .routes(routes!(status))
        .routes(routes!(dashboard::dashboard))
        .routes(routes!(training::training))
        .routes(routes!(healthz))
        .routes(routes!(metrics_text))
        .with_state(state)
        .split_for_parts();
    let mut api = api;
    if token_required {
        auth::document(&mut api);
    }
    let api = Arc::new(served_document(&api, &kinds, &settings));
    router
        .route("/", axum::routing::get(page::index))
        .route("/ui/app.js", axum::routing::get(page::script))
        .route("/ui/app.css", axum::routing::get(page::style))
        .route(
            "/openapi.json",
            axum::routing::get(move || {
                let api = api.clone();
                async move { Json(api.as_ref().clone()) }
            }),
        )
        .fallback(|| async {
            ApiError::not_found("no such endpoint; see GET /openapi.json for the API")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint; see GET /openapi.json for the API",
                None,
            )
        })
        .layer(DefaultBodyLimit::max(max_body))
        // Outermost, so a request without the token reaches nothing else.
        .layer(axum::middleware::from_fn_with_state(
            auth_state,
            auth::require_token,
        ))
}

/// The OpenAPI document as this gateway serves it: the types' document with what only
/// the running service knows filled in (the task kinds it runs, how many tasks a submit
/// may carry, the longest long-poll wait), so that a request the document allows is one
/// this gateway accepts.
fn served_document(
    api: &utoipa::openapi::OpenApi,
    kinds: &Registry,
    settings: &Settings,
) -> serde_json::Value {
    let mut doc = serde_json::to_value(api).expect("the OpenAPI document serialises");
    // A response that flattens a request type (`allOf` of its reference and its own
    // fields) is served as one object: the request type refuses unknown fields
    // (`additionalProperties: false`), which the response must not inherit.
    let schemas = doc["components"]["schemas"].clone();
    if let Some(all) = doc["components"]["schemas"].as_object_mut() {
        for schema in all.values_mut() {
            if let Some(merged) = merge_all_of(schema, &schemas) {
                *schema = merged;
            }
        }
    }
    if let Some(kind) = doc.pointer_mut("/components/schemas/Task/properties/kind") {
        kind["enum"] = serde_json::json!(kinds.names());
    }
    if let Some(tasks) = doc.pointer_mut("/components/schemas/SubmitRequest/properties/tasks") {
        tasks["maxItems"] = serde_json::json!(settings.gateway.max_tasks_per_request);
    }
    if let Some(prompts) = doc.pointer_mut("/components/schemas/BatchRequest/properties/prompts") {
        prompts["maxItems"] = serde_json::json!(settings.gateway.max_tasks_per_request);
    }
    for path in [
        "/paths/~1v1~1results/get/parameters",
        "/paths/~1v1~1batches~1{id}~1groups/get/parameters",
    ] {
        if let Some(params) = doc.pointer_mut(path).and_then(|p| p.as_array_mut()) {
            for p in params.iter_mut().filter(|p| p["name"] == "wait_ms") {
                p["schema"]["maximum"] = serde_json::json!(settings.gateway.max_wait_ms);
            }
        }
    }
    doc
}

/// `schema`'s `allOf` parts (references resolved in `schemas`) as one object schema, or
/// `None` when it has none or a part is not a plain object.
fn merge_all_of(
    schema: &serde_json::Value,
    schemas: &serde_json::Value,
) -> Option<serde_json::Value> {
    let parts = schema["allOf"].as_array()?;
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    for part in parts {
        let part = match part["$ref"].as_str() {
            Some(r) => &schemas[r.rsplit('/').next()?],
            None => part,
        };
        if part["type"] != "object" {
            return None;
        }
        properties.extend(part["properties"].as_object()?.clone());
        required.extend(part["required"].as_array().cloned().unwrap_or_default());
    }
    let mut merged = serde_json::json!({
        "type": "object",
        "required": required,
        "properties": properties,
    });
    if let Some(d) = schema.get("description") {
        merged["description"] = d.clone();
    }
    Some(merged)
}

/// Keeps `tx` changing whenever a result is published, until `shutdown`.
pub async fn watch_results(queue: Queue, tx: watch::Sender<u64>, shutdown: CancellationToken) {
    Queue::follow(
        "results",
        None,
        || queue.subscribe_results(),
        |_| {
            tx.send_modify(|n| *n += 1);
            std::future::ready(())
        },
        &shutdown,
    )
    .await;
}

/// Query of `GET /v1/status` (documented by hand in the path's `params`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusQuery {
    /// Only this batch.
    batch: Option<String>,
}

impl CheckQuery for StatusQuery {
    fn check(&self) -> Result<(), ApiError> {
        params::check_opt_text("batch", self.batch.as_deref())
    }
}

/// Job counts by status and stage, for everything or one batch.
#[utoipa::path(
    get,
    path = "/v1/status",
    tag = "service",
    params(("batch" = Option<String>, Query, description = "Only this batch", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 200, body = StatusView),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 404, body = ApiErrorBody),
    )
)]
async fn status(
    State(state): State<AppState>,
    ApiQuery(StatusQuery { batch: batch_id }): ApiQuery<StatusQuery>,
) -> Result<Json<StatusView>, ApiError> {
    let counts = state.store.counts(batch_id.as_deref()).await?;
    let batch = match &batch_id {
        Some(b) => Some(
            state
                .store
                .batch(b)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("no batch with id `{b}`")))?,
        ),
        None => None,
    };
    Ok(Json(StatusView {
        counts: counts.into_iter().map(wire::status_count).collect(),
        batch,
    }))
}

/// Health: whether NATS and the database answer. 503 when either does not. Needs no
/// token, so load balancers can probe it; when the gateway has a token, the reasons a
/// dependency is down (which may name hosts) are shown only to callers that send it.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "service",
    responses((status = 200, body = Health), (status = 503, body = Health))
)]
async fn healthz(State(state): State<AppState>, headers: HeaderMap) -> (StatusCode, Json<Health>) {
    let show_errors = auth::check(&headers, &state.settings.gateway.token).is_ok();
    let (nats, db) = tokio::join!(state.queue.ping(), async {
        tokio::time::timeout(Duration::from_secs(2), state.store.ping())
            .await
            .map_err(|_| "timed out after 2 s".to_string())?
            .map_err(|e| e.to_string())
    });
    let dep = |r: Result<(), String>| DependencyHealth {
        ok: r.is_ok(),
        error: r.err().filter(|_| show_errors),
    };
    let nats = dep(nats.map_err(|e| e.to_string()));
    let database = dep(db);
    let ok = nats.ok && database.ok;
    (
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        Json(Health {
            status: if ok { "ok" } else { "degraded" }.into(),
            nats,
            database,
            sandbox: serde_json::to_value(&state.sandbox).unwrap_or_default(),
        }),
    )
}

/// Prometheus metrics of this process, plus job counts by status from the database.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "service",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain"))
)]
async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    // Scraped every few seconds for the life of the service: `totals` reads no
    // finished job's row, where `counts` would read every job ever submitted.
    if let Ok(totals) = state.store.totals().await {
        for (st, n) in totals {
            metrics::gauge!(crate::metrics::JOBS_BY_STATUS, "status" => st.as_str()).set(n as f64);
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(),
    )
}

/// Serves `router` on `listener` until `shutdown`, then drains connections for at most
/// five seconds (streaming responses end on `shutdown` themselves; the deadline covers
/// anything else that would hold shutdown hostage).
///
/// Every accepted connection has Nagle's algorithm off (axum leaves it on): an event
/// stream writes results as small frames back to back, and with Nagle each frame after
/// the first would wait for the client's acknowledgement of the one before, which a
/// client that only reads delays by up to 40 ms.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not turn Nagle's algorithm off on a connection");
        }
    });
    let signal = shutdown.clone();
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        signal.cancelled().await;
    });
    let server = server.into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => r,
        _ = async {
            shutdown.cancelled().await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        } => {
            tracing::warn!("connections still open 5 s after shutdown; closing them");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn accepted_connections_have_nagle_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(serve(listener, router, shutdown.clone()));
        // One request answered on a connection kept open, so the server's side of it is
        // still there to inspect.
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\nok") {
            let mut buf = [0; 512];
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buf[..n]);
        }
        let client_port = client.local_addr().unwrap().port();
        assert_eq!(
            crate::store::nodelay::nodelay_of_peer_port(client_port),
            Some(true)
        );
        drop(client);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
