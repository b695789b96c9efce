//! Every retry schedule of the service, one named [`backon`] policy per concern.
//!
//! A loop that retries takes its delays from one of these (an iterator of waits;
//! `None` means give up; a fresh one starts the schedule again) instead of computing
//! its own, and a call retried with backon's `Retryable` takes a builder, so what the
//! service does when something fails can be read, and changed, in one place. Waits
//! between processes that may all fail at once (many workers losing the same NATS
//! server, many RUN workers waiting for the same backend) are jittered, so they do not
//! come back in step; waits for a local event (a socket appearing) are not.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Re-subscribing or re-provisioning after the NATS server failed a request (the
/// cancel and result watchers, the advisory watcher, provisioning at start while the
/// server is not up yet): from half a second, doubling to 5 s, jittered, until
/// shutdown.
pub fn reconnect() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

/// A worker's pull request failed: from 100 ms, doubling to 6.4 s, jittered, until
/// shutdown; a successful pull starts the schedule again.
pub fn pull_errors() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_millis(6_400))
        .with_jitter()
        .without_max_times()
        .build()
}

/// How long the server holds back a message a worker NAKed after its `delivered`-th
/// delivery: `base`, doubling with each delivery, at most `max`. Not jittered: it is a
/// function of the delivery count, which the server already spreads.
pub fn nak_delay(base: Duration, max: Duration, delivered: i64) -> Duration {
    let step = usize::try_from(delivered.max(1) - 1).unwrap_or(0).min(32);
    ExponentialBuilder::new()
        .with_min_delay(base)
        .with_max_delay(max.max(base))
        .without_max_times()
        .build()
        .nth(step)
        .unwrap_or(max)
}

/// A RUN waiting for a healthy backend of its model: from half a second, doubling to
/// 5 s, jittered; the caller stops at the episode's deadline.
pub fn backend_wait() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

/// An inference request that failed (connection refused, 5xx, a dropped stream):
/// `backoff`, doubling, jittered, at most `retries` times.
pub fn inference_faults(backoff: Duration, retries: u32) -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(backoff)
        .without_max_delay()
        .with_jitter()
        .with_max_times(retries as usize)
        .build()
}

/// A submit the database aborted for colliding with another (Postgres's deadlock or
/// serialization failure): from 10 ms, doubling, jittered, at most 5 times.
pub fn submit_conflicts() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(10))
        .with_max_times(5)
        .with_jitter()
}

/// An inference server that says it is paused (weights being updated): polled from
/// `backoff`, doubling to 2 s, jittered, for at most `max_pause` in all. These waits
/// do not use up the fault retries.
pub fn inference_paused(backoff: Duration, max_pause: Duration) -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(backoff)
        .with_max_delay(Duration::from_secs(2).max(backoff))
        .with_jitter()
        .without_max_times()
        .with_total_delay(Some(max_pause))
        .build()
}

/// Polling for a starting sandbox's socket: from 200 µs, doubling to 10 ms (a sandbox
/// usually answers within a few ms, and a start is on the critical path of INIT); the
/// caller stops at its deadline.
pub fn sandbox_socket() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_micros(200))
        .with_max_delay(Duration::from_millis(10))
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nak_delays_double_per_delivery_up_to_the_maximum() {
        let (base, max) = (Duration::from_millis(500), Duration::from_secs(30));
        let delays: Vec<u128> = (0..10)
            .map(|d| nak_delay(base, max, d).as_millis())
            .collect();
        assert_eq!(
            delays,
            [500, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(nak_delay(base, max, i64::MAX), max);
    }

    #[test]
    fn fault_retries_stop_after_the_configured_number() {
        let delays: Vec<Duration> = inference_faults(Duration::from_millis(10), 3).collect();
        assert_eq!(delays.len(), 3);
        // Jittered: each within [d, 2d) of 10, 20, 40 ms.
        for (got, d) in delays.iter().zip([10u64, 20, 40]) {
            let d = Duration::from_millis(d);
            assert!(
                *got >= d && *got < 2 * d,
                "{got:?} outside [{d:?}, {:?})",
                2 * d
            );
        }
    }

    #[test]
    fn pauses_are_waited_out_for_at_most_the_total() {
        let total: Duration =
            inference_paused(Duration::from_millis(100), Duration::from_secs(10)).sum();
        assert!(total <= Duration::from_secs(10), "{total:?}");
        assert!(total >= Duration::from_secs(6), "gave up early: {total:?}");
    }
}
