//! Which backend a job uses.
//!
//! A job picks the healthy backend with the fewest active assignments (weighted by the
//! backend's capacity), preferring the backend its prompt group already uses, so the G
//! samples of one prompt share its prefix cache, unless that backend is over its fair
//! share. The group's backend is remembered after its samples end, since the prompt stays
//! in that backend's cache: a sample that starts after the others finished goes there
//! too. Every later turn of the job goes to the same backend (the assignment is
//! sticky). The counts are rows in the database, one per job in RUN, so any number of
//! run workers agree on them, and they go back down when the job leaves RUN however it
//! leaves (a trigger deletes the row on every transition out of RUN and on every
//! terminal status). ProRL Agent's pool keeps a min-heap of counts that only ever grow,
//! which balances jobs ever assigned rather than jobs running, and scatters a group's
//! samples over all backends.
//!
//! The decision itself is [`crate::domain::placement::choose`], a pure function the
//! store calls inside the transaction that reads the counts and writes the assignment;
//! this module keeps the pool's I/O: registering configured backends and probing
//! their health.

use std::time::Duration;

use crate::domain::EpochMs;

/// How long the pool remembers where a prompt group ran: longer than a batch's samples
/// take to start.
const GROUP_HOME_TTL: Duration = Duration::from_secs(6 * 3600);

/// Registers the configuration's `[[backends]]` (source `config`), leaving those added
/// through the API alone. Every process calls it at start, so a worker started with a
/// config file that names new backends makes them known at once.
pub async fn register_configured(
    store: &dyn crate::store::BackendStore,
    backends: &[crate::domain::backend::BackendSpec],
) -> Result<(), crate::store::StoreError> {
    for spec in backends {
        store.upsert_backend(spec, "config", EpochMs::now()).await?;
    }
    Ok(())
}

/// Probes every registered backend's `GET /health` every `health_interval_ms`,
/// records the verdicts (a backend marked down gets no new jobs until it answers again),
/// keeps the per-backend gauges current and forgets the homes of groups not placed for
/// hours, until `shutdown`. Any number of processes
/// may run it: the verdicts they write agree.
pub async fn run_health_prober(
    store: std::sync::Arc<dyn crate::store::BackendStore>,
    settings: crate::config::PoolSettings,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let client = super::client::InferenceClient::new((&settings).into());
    let timeout = std::time::Duration::from_millis(settings.health_timeout_ms);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(
        settings.health_interval_ms,
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        // A group's home only matters while its samples are still being started.
        if let Err(e) = store
            .forget_group_homes(EpochMs::now().before(GROUP_HOME_TTL))
            .await
        {
            tracing::warn!(error = %e, "cannot prune old group homes");
        }
        let backends = match store.backends().await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list backends to probe");
                continue;
            }
        };
        let probes = backends.iter().map(|b| {
            let client = &client;
            async move { (b, client.health(&b.spec, timeout).await) }
        });
        for (b, verdict) in futures::future::join_all(probes).await {
            let id = b.spec.id.clone();
            let healthy = verdict.is_ok();
            let error = verdict.err();
            match store
                .set_backend_health(&id, healthy, error.as_deref(), EpochMs::now())
                .await
            {
                Ok(Some(before)) if before != healthy => {
                    if healthy {
                        tracing::info!(backend = %id, "backend is up");
                    } else {
                        tracing::warn!(backend = %id, error = error.as_deref().unwrap_or(""), "backend is down");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(backend = %id, error = %e, "cannot record the backend's health")
                }
            }
            metrics::gauge!(crate::metrics::BACKEND_HEALTHY, "backend" => id.clone())
                .set(if healthy { 1.0 } else { 0.0 });
            metrics::gauge!(crate::metrics::BACKEND_ACTIVE, "backend" => id).set(b.active as f64);
        }
    }
}
