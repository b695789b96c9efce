//! `eventually`: the one way the integration tests wait for something that happens in
//! the background (a result, a sandbox gone, a process exited, a counter reached).
//!
//! The time limit is a safety net against a
//! hang, never a timing assertion: it is generous, and what a test checks is the state it
//! waited for.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// Polls `check` until it returns `Ok`, and returns that value. Between polls it waits
/// 10 ms, doubling up to 200 ms. Past `within` it panics naming `what` and the last
/// `Err` observation (the state the test saw instead, for the failure message).
pub async fn eventually<T, E, Fut>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Fut,
) -> T
where
    E: Debug,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut wait = Duration::from_millis(10);
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not so after {within:?}; last seen: {last:?}")
            }
            Err(_) => {}
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(200));
    }
}

/// `Ok(())` when `cond` holds, else `Err(seen)`: for [`eventually`] on a plain condition.
pub fn holds<E>(cond: bool, seen: E) -> Result<(), E> {
    if cond { Ok(()) } else { Err(seen) }
}
