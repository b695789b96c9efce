//! The policy state a process sees (the current version and the weight update in
//! progress), kept up to date: the RUN workers tag every model token with the version,
//! and hold new turns while an update is in progress.
//!
//! Fed by the gateway's broadcasts (`P.policy`, the state as JSON), which arrive at once,
//! and by a read of the database every `refresh`, which catches a broadcast lost with a
//! reconnect. Each state carries the database row's change count (`seq`): the watch
//! only moves to a later one, whichever source tells it first, so a database read that
//! crosses a broadcast never brings back a pause that has ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::domain::EpochMs;
use crate::domain::policy::{PolicyPause, PolicyState, PolicyVersion};
use crate::queue::Queue;
use crate::store::PolicyStore;

/// The policy state, shared by every job of a process.
#[derive(Debug, Clone)]
pub struct PolicyWatch {
    tx: Arc<watch::Sender<PolicyState>>,
    /// Database reads asked for by [`PolicyWatch::catch_up`], and the last one the
    /// follower began after (so a read that began before the ask never answers it).
    asked: Arc<AtomicU64>,
    served: Arc<watch::Sender<u64>>,
    wanted: Arc<Notify>,
    followed: Arc<AtomicBool>,
}

/// The longest [`PolicyWatch::catch_up`] waits for the follower's read.
const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

impl Default for PolicyWatch {
    fn default() -> Self {
        Self::new(PolicyState::default())
    }
}

impl PolicyWatch {
    /// A watch starting at `state`.
    pub fn new(state: PolicyState) -> Self {
        Self {
            tx: Arc::new(watch::channel(state).0),
            asked: Arc::new(AtomicU64::new(0)),
            served: Arc::new(watch::channel(0).0),
            wanted: Arc::new(Notify::new()),
            followed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Has the follower read the database now, and waits until it has (at most
    /// [`CATCH_UP_WAIT`]; at once when nothing follows this watch). Called when a
    /// generation comes back aborted: an update's pause is in the database before any
    /// backend is asked to stop, so this read sees it even when its broadcast has not
    /// arrived yet, and the turn is not sent again to a paused server.
    pub async fn catch_up(&self) {
        if !self.followed.load(Ordering::Acquire) {
            return;
        }
        let ask = self.asked.fetch_add(1, Ordering::AcqRel) + 1;
        let mut served = self.served.subscribe();
        self.wanted.notify_one();
        let _ = tokio::time::timeout(CATCH_UP_WAIT, served.wait_for(|n| *n >= ask)).await;
    }

    /// A watch at `version`, with no update in progress (for tests and tools).
    pub fn at_version(version: Option<i64>) -> Self {
        Self::new(PolicyState {
            seq: 0,
            current: version.map(|version| PolicyVersion {
                version,
                announced_at: 0,
            }),
            pause: None,
        })
    }

    /// The version current now.
    pub fn current(&self) -> Option<i64> {
        self.tx.borrow().version()
    }

    /// The whole state now.
    pub fn state(&self) -> PolicyState {
        *self.tx.borrow()
    }

    /// The weight update holding generation now, if any (one whose lease ran out holds
    /// nothing).
    pub fn holding(&self) -> Option<PolicyPause> {
        self.tx.borrow().holding(EpochMs::now().0)
    }

    /// Moves to `state` if it is later than the one held; true if it did.
    pub fn observe(&self, state: PolicyState) -> bool {
        let moved = self.tx.send_if_modified(|s| {
            if state.seq > s.seq {
                *s = state;
                true
            } else {
                false
            }
        });
        if let (true, Some(v)) = (moved, state.version()) {
            #[allow(clippy::cast_precision_loss)] // a trainer's step count, far below 2^52
            metrics::gauge!(crate::metrics::POLICY_VERSION).set(v as f64);
        }
        moved
    }

    /// Moves the current version to `version` if it is newer, without a database row
    /// behind it (tests, and a stand-in trainer); true if it did.
    pub fn advance(&self, version: i64) -> bool {
        self.tx.send_if_modified(|s| {
            if s.version().is_none_or(|current| current < version) {
                s.current = Some(PolicyVersion {
                    version,
                    announced_at: EpochMs::now().0,
                });
                true
            } else {
                false
            }
        })
    }

    /// Returns once no weight update holds generation: at once when none is in
    /// progress, else at its resume or when its lease runs out, whichever comes first.
    pub async fn ready(&self) {
        let mut rx = self.tx.subscribe();
        loop {
            let now = EpochMs::now().0;
            let Some(pause) = rx.borrow_and_update().holding(now) else {
                return;
            };
            let left = Duration::from_millis(u64::try_from(pause.until - now).unwrap_or(0));
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(left) => {}
            }
        }
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
        self.followed.store(true, Ordering::Release);
        let from_db = async {
            let mut tick = tokio::time::interval(refresh);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = self.wanted.notified() => {}
                }
                // Every ask made before this read began is answered by it.
                let serving = self.asked.load(Ordering::Acquire);
                match store.policy_state().await {
                    Ok(state) => {
                        if self.observe(state) {
                            log_change("read from the database", &state);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot read the policy state"),
                }
                self.served.send_if_modified(|n| {
                    let moved = serving > *n;
                    *n = (*n).max(serving);
                    moved
                });
            }
        };
        let from_broadcasts = Queue::follow(
            "policy versions",
            None,
            || queue.subscribe_policy(),
            |m| {
                match serde_json::from_slice::<PolicyState>(&m.payload) {
                    Ok(state) => {
                        if self.observe(state) {
                            log_change("announced", &state);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "malformed policy broadcast ignored"),
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

/// Broadcasts `state` to every process that follows it. A lost broadcast is only
/// logged: the followers re-read the policy row every few seconds.
pub async fn broadcast(queue: &Queue, state: &PolicyState) {
    if let Err(e) = queue.publish_policy(state).await {
        tracing::warn!(error = %e, "policy state not broadcast; the workers will read it from the database");
    }
}

fn log_change(how: &'static str, state: &PolicyState) {
    match state.pause {
        Some(p) => tracing::info!(
            version = ?state.version(),
            to = p.version,
            mode = p.mode.as_str(),
            "weight update in progress ({how}): new turns wait for the resume"
        ),
        None => tracing::info!(version = ?state.version(), "policy version current ({how})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::policy::UpdateMode;

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

    fn paused(seq: i64, until: i64) -> PolicyState {
        PolicyState {
            seq,
            current: None,
            pause: Some(PolicyPause {
                version: 1,
                mode: UpdateMode::Abort,
                since: 0,
                until,
            }),
        }
    }

    #[tokio::test]
    async fn turns_wait_for_the_resume_and_a_late_read_does_not_bring_the_pause_back() {
        let w = PolicyWatch::default();
        let far = EpochMs::now().0 + 600_000;
        assert!(w.observe(paused(1, far)));
        let ready = tokio::spawn({
            let w = w.clone();
            async move { w.ready().await }
        });
        tokio::task::yield_now().await;
        assert!(!ready.is_finished(), "held while paused");
        let resumed = PolicyState {
            seq: 2,
            current: Some(PolicyVersion {
                version: 1,
                announced_at: 5,
            }),
            pause: None,
        };
        assert!(w.observe(resumed));
        ready.await.unwrap();
        // A database read from before the resume arrives after it: ignored.
        assert!(!w.observe(paused(1, far)));
        assert_eq!(w.holding(), None);
        assert_eq!(w.current(), Some(1));
    }

    #[tokio::test]
    async fn a_pause_whose_lease_ran_out_holds_nothing() {
        let w = PolicyWatch::default();
        w.observe(paused(1, EpochMs::now().0 + 50));
        assert!(w.holding().is_some());
        // Returns when the lease runs out, with no resume heard.
        w.ready().await;
        assert_eq!(w.holding(), None);
    }
}
