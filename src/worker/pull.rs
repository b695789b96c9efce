//! The flow-controlled pull loop: a worker never asks the queue for more messages than
//! it has free slots, so no message waits in a local buffer while its ack timer runs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Worker;
use crate::queue::{Delivery, WorkSource};

/// Most messages asked for in one pull request.
const MAX_PER_PULL: usize = 256;

impl Worker {
    /// Pulls from the stage's source, never asking for more messages than free slots.
    ///
    /// Slots are reserved before a pull request is made, so a request waiting on an
    /// empty stage holds them: that is what we want, a long poll that delivers the
    /// moment a message arrives. Each delivery takes one reserved slot, which its stage
    /// holds until it is done; the slots a request did not use are freed when it ends.
    /// A request that cannot be made is retried after a growing pause
    /// ([`crate::retry::pull_errors`]).
    pub(super) async fn pull(
        self: Arc<Self>,
        mut source: Box<dyn WorkSource>,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let mut failures = 0u32;
        let mut delays = crate::retry::pull_errors();
        loop {
            let first = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
                () = shutdown.cancelled() => break,
            };
            let mut permits = vec![first];
            while permits.len() < MAX_PER_PULL {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let asked = permits.len();
            let mut deliver = |d: Box<dyn Delivery>| match permits.pop() {
                Some(permit) => {
                    tracker.spawn(self.clone().handle(d, permit));
                }
                // A source that hands out more than it was asked for breaks flow
                // control; the extra message is left to come back.
                None => tracing::error!(asked, "the queue delivered more messages than asked for"),
            };
            let pulled = tokio::select! {
                r = source.pull(asked, &mut deliver) => r,
                () = shutdown.cancelled() => break,
            };
            match pulled {
                Ok(_) if failures > 0 => {
                    failures = 0;
                    delays = crate::retry::pull_errors();
                }
                Ok(_) => {}
                Err(e) => {
                    failures += 1;
                    let backoff = delays.next().unwrap_or(Duration::from_millis(6_400));
                    tracing::warn!(error = %e, failures, ?backoff, "pull request failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = shutdown.cancelled() => break,
                    }
                }
            }
        }
    }
}
