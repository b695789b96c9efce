//! The policy version a process sees as current, kept up to date: the RUN workers tag
//! every model token with it.
//!
//! Fed by the gateway's broadcasts (`P.policy`), which arrive at once, and by a read of
//! the database every `refresh`, which catches a broadcast lost with a reconnect. It
//! only moves forward, whichever source tells it first.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::queue::Queue;
use crate::store::PolicyStore;

/// The current policy version (`None` before the trainer announces one), shared by every
/// job of a process.
#[derive(Debug, Clone)]
pub struct PolicyWatch {
    tx: Arc<watch::Sender<Option<i64>>>,
}

impl Default for PolicyWatch {
    fn default() -> Self {
        Self::new(None)
    }
}

impl PolicyWatch {
    /// A watch starting at `version`.
    pub fn new(version: Option<i64>) -> Self {
        Self {
            tx: Arc::new(watch::channel(version).0),
        }
    }

    /// The version current now.
    pub fn current(&self) -> Option<i64> {
        *self.tx.borrow()
    }

    /// Moves to `version` if it is newer than the current one; true if it did.
    pub fn advance(&self, version: i64) -> bool {
        self.tx.send_if_modified(|v| {
            if v.is_none_or(|current| current < version) {
                *v = Some(version);
                true
            } else {
                false
            }
        })
    }

    /// Keeps the watch current until `done`: from the broadcasts, and from `store`
    /// every `refresh`.
    pub async fn follow(
        self,
        store: Arc<dyn PolicyStore>,
        queue: Queue,
        refresh: Duration,
        done: CancellationToken,
    ) {
        let from_db = async {
            let mut tick = tokio::time::interval(refresh);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match store.current_policy().await {
                    Ok(Some(p)) => {
                        if self.advance(p.version) {
                            tracing::info!(
                                version = p.version,
                                "policy version read from the database"
                            );
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot read the current policy version"),
                }
            }
        };
        let from_broadcasts = Queue::follow(
            "policy versions",
            None,
            || queue.subscribe_policy(),
            |m| {
                match std::str::from_utf8(&m.payload)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(v) => {
                        if self.advance(v) {
                            tracing::info!(version = v, "policy version announced");
                        }
                    }
                    None => tracing::warn!("malformed policy version broadcast ignored"),
                }
                std::future::ready(())
            },
            &done,
        );
        tokio::select! {
            () = from_db => {}
            () = from_broadcasts => {}
            () = done.cancelled() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_only_moves_forward() {
        let w = PolicyWatch::default();
        assert_eq!(w.current(), None);
        assert!(w.advance(3));
        assert!(!w.advance(3));
        assert!(!w.advance(2));
        assert!(w.advance(5));
        assert_eq!(w.current(), Some(5));
    }
}
