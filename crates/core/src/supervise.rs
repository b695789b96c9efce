//! Background tasks that never die silently.
//!
//! A process runs a few loops beside its main work: the reconciler, the backend health
//! prober, the result and cancel watchers, the sandbox reaper, a worker's puller. Each
//! is meant to run until shutdown. One that ends early (it returned, or panicked) leaves
//! the process looking alive while, say, nothing reaps sandboxes or repairs lost
//! hand-offs. [`spawn_essential`] runs such a loop under a watcher: if it ends before
//! shutdown, its cause is logged as an error and the process's shutdown token is
//! cancelled, so the process drains and exits with an error (and Slurm, systemd or the
//! user starts it again) instead of running on without it. [`spawn_logged`] runs a
//! one-off piece of work a request does not wait for, so that its panic is logged.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// An essential task ended before shutdown.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the {task} task {how} before shutdown")]
pub struct TaskFailed {
    /// Which task.
    pub task: &'static str,
    /// `ended`, or `panicked: <message>`.
    pub how: String,
}

/// A supervised task; [`Essential::finish`] waits for it.
#[derive(Debug)]
#[must_use = "an essential task's failure is reported by `finish`"]
pub struct Essential(JoinHandle<Result<(), TaskFailed>>);

impl Essential {
    /// Waits for the task to end (it ends once shutdown is cancelled); the error says
    /// how it ended if that was before shutdown.
    pub async fn finish(self) -> Result<(), TaskFailed> {
        match self.0.await {
            Ok(r) => r,
            // The watcher itself only awaits; it ends early only with the runtime.
            Err(e) => Err(TaskFailed {
                task: "supervisor",
                how: format!("stopped: {e}"),
            }),
        }
    }
}

/// Spawns `task`, a loop that should run until `shutdown` is cancelled. If it ends
/// first, or panics at any time, the cause is logged and `shutdown` is cancelled.
pub fn spawn_essential<F>(task: &'static str, shutdown: &CancellationToken, future: F) -> Essential
where
    F: Future<Output = ()> + Send + 'static,
{
    let handle = tokio::spawn(future);
    let shutdown = shutdown.clone();
    Essential(tokio::spawn(async move {
        let how = match handle.await {
            Ok(()) if shutdown.is_cancelled() => return Ok(()),
            Ok(()) => "ended".to_string(),
            Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e.into_panic())),
            Err(e) => format!("was cancelled: {e}"),
        };
        let failed = TaskFailed { task, how };
        tracing::error!(task, error = %failed, "an essential task stopped; shutting the process down");
        shutdown.cancel();
        Err(failed)
    }))
}

/// Spawns `future`, one piece of work a request started and does not wait for (the
/// rest of a cancel), whose failure something else repairs (the reconciler's sweep): a
/// panic is logged as an error with `task` and its message rather than lost with the
/// task. The future logs its own errors.
pub fn spawn_logged<F>(task: &'static str, future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let handle = tokio::spawn(future);
    tokio::spawn(async move {
        if let Err(e) = handle.await
            && e.is_panic()
        {
            let how = panic_message(e.into_panic());
            tracing::error!(task, panic = %how, "a background task panicked; the reconciler's sweep repairs its work");
        }
    });
}

/// The text a panic was raised with, when it was a string (for the log line that reports
/// a task's panic, here and in the store's writer tasks).
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "(a non-text panic payload)".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_stops_at_shutdown_is_fine() {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let t = spawn_essential("loop", &shutdown, async move { stop.cancelled().await });
        shutdown.cancel();
        t.finish().await.unwrap();
    }

    #[tokio::test]
    async fn a_task_that_ends_early_shuts_the_process_down() {
        let shutdown = CancellationToken::new();
        let t = spawn_essential("early", &shutdown, async {});
        let e = t.finish().await.unwrap_err();
        assert_eq!((e.task, e.how.as_str()), ("early", "ended"));
        assert!(shutdown.is_cancelled());
    }

    #[tokio::test]
    async fn a_panic_is_reported_with_its_message() {
        let shutdown = CancellationToken::new();
        let t = spawn_essential("boom", &shutdown, async { panic!("the reaper fell over") });
        let e = t.finish().await.unwrap_err();
        assert_eq!(e.how, "panicked: the reaper fell over");
        assert!(shutdown.is_cancelled());
    }
}
