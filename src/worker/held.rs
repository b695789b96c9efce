//! The stage entry a worker holds between its claim and its end: what the lease keeps
//! alive and what the recorder ends the job under. Its own module, below the three that
//! use it (claim, lease, record), so none of them imports another to reach it.

use crate::domain::WorkMessage;
use crate::store::FinishIf;

/// A stage entry this worker has claimed.
pub(super) struct Held {
    /// The stage entry.
    pub(super) work: WorkMessage,
    /// The claim's token (the job's `attempts` after the claim).
    pub(super) attempt: i64,
    /// Starts of this stage entry, this one included.
    pub(super) stage_attempts: i64,
    /// The queue's delivery count of the message.
    pub(super) delivered: i64,
}

impl Held {
    /// The condition under which this claim may end the job.
    pub(super) fn cond(&self) -> FinishIf {
        FinishIf::Claimed {
            msg: self.work.clone(),
            attempt: self.attempt,
        }
    }
}
