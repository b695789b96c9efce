//! The jobs a worker is running, so a cancel broadcast reaches them.
//!
//! A job is registered before its claim (a cancel that arrives between the claim's
//! commit and the hook's start must not be missed) and unregistered when the guard the
//! registration returns is dropped, on every path out of the stage. Two deliveries of
//! one job on the same worker (a redelivery while the first still runs) share one token
//! and one entry, counted: the second's early exit must not unregister the first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Cancel tokens of the running jobs, by job id.
#[derive(Debug, Default, Clone)]
pub(super) struct RunningJobs {
    jobs: Arc<Mutex<HashMap<String, Entry>>>,
}

#[derive(Debug)]
struct Entry {
    token: CancellationToken,
    holders: usize,
}

impl RunningJobs {
    /// Registers `job_id`; the job's token is cancelled by [`RunningJobs::cancel`] until
    /// the returned guard is dropped.
    pub(super) fn register(&self, job_id: &str) -> Registration {
        let mut jobs = self.jobs.lock().expect("running jobs lock");
        let entry = jobs.entry(job_id.to_string()).or_insert_with(|| Entry {
            token: CancellationToken::new(),
            holders: 0,
        });
        entry.holders += 1;
        Registration {
            jobs: self.clone(),
            job_id: job_id.to_string(),
            token: entry.token.clone(),
        }
    }

    /// Cancels the job's stage if it runs here; true if it did.
    pub(super) fn cancel(&self, job_id: &str) -> bool {
        match self.jobs.lock().expect("running jobs lock").get(job_id) {
            Some(e) => {
                e.token.cancel();
                true
            }
            None => false,
        }
    }

    fn release(&self, job_id: &str) {
        let mut jobs = self.jobs.lock().expect("running jobs lock");
        if let Some(e) = jobs.get_mut(job_id) {
            e.holders -= 1;
            if e.holders == 0 {
                jobs.remove(job_id);
            }
        }
    }
}

/// A job's place in [`RunningJobs`]; dropping it unregisters the job.
#[derive(Debug)]
pub(super) struct Registration {
    jobs: RunningJobs,
    job_id: String,
    token: CancellationToken,
}

impl Registration {
    /// The token a cancel broadcast for the job fires.
    pub(super) fn token(&self) -> &CancellationToken {
        &self.token
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.jobs.release(&self.job_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_reaches_a_registered_job_and_not_after_it_is_dropped() {
        let running = RunningJobs::default();
        let reg = running.register("j1");
        assert!(!running.cancel("j2"));
        assert!(running.cancel("j1"));
        assert!(reg.token().is_cancelled());
        drop(reg);
        assert!(
            !running.cancel("j1"),
            "dropping the guard unregisters the job"
        );
    }

    #[test]
    fn a_second_delivery_leaving_early_keeps_the_first_registered() {
        let running = RunningJobs::default();
        let first = running.register("j1");
        let second = running.register("j1");
        drop(second);
        assert!(running.cancel("j1"));
        assert!(first.token().is_cancelled());
        drop(first);
        assert!(running.jobs.lock().unwrap().is_empty());
    }
}
