//! The reconciler: repairs hand-offs lost between the database and the queue.
//!
//! A stage commits to the database, then publishes, then acks. If a process dies between
//! the commit and the publish (or a server failure loses a message), the database says a
//! job is queued but no message exists. Redelivered messages repair most of these; the
//! reconciler catches the rest by re-publishing, with the same `Nats-Msg-Id`, the
//! hand-off of every live job that has not changed for `stale_after_ms`, and publishing
//! results that were written but never marked published. Re-publishing is always safe: a
//! message the server still holds is deduplicated, and one that reaches a worker after
//! the job moved on is recognised as stale and dropped. Any number of reconcilers may
//! run at once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::ReconcilerSettings;
use crate::now_ms;
use crate::queue::Queue;
use crate::store::Store;

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// Stage messages re-published.
    pub republished: usize,
    /// Results published.
    pub results_published: usize,
}

/// Runs sweeps every `interval_ms` until `shutdown` fires.
pub async fn run(
    store: Arc<dyn Store>,
    queue: Queue,
    settings: ReconcilerSettings,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(settings.interval_ms));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match sweep(store.as_ref(), &queue, &settings).await {
            Ok(s) if s != Sweep::default() => tracing::info!(
                republished = s.republished,
                results_published = s.results_published,
                "reconciler repaired hand-offs"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reconciler sweep failed"),
        }
    }
}

/// One sweep.
pub async fn sweep(
    store: &dyn Store,
    queue: &Queue,
    settings: &ReconcilerSettings,
) -> anyhow::Result<Sweep> {
    let now = now_ms();
    let mut out = Sweep::default();
    let stale = store
        .take_stale(
            now - settings.stale_after_ms as i64,
            now,
            settings.batch_limit,
        )
        .await?;
    for job in stale {
        queue.publish_work(&job.msg, job.route.as_deref()).await?;
        store
            .record_event(
                &job.msg.job_id,
                "republished",
                Some(job.msg.stage),
                None,
                Some("no progress within reconciler.stale_after_ms"),
                now,
            )
            .await?;
        out.republished += 1;
    }
    // Results are normally marked within milliseconds; give in-flight publishes time.
    let results = store
        .unpublished_results(now - 10_000, settings.batch_limit)
        .await?;
    for r in results {
        queue.publish_result(&r).await?;
        store.mark_published(&[r.seq], now_ms()).await?;
        out.results_published += 1;
    }
    Ok(out)
}
