//! Subject and stream names under a deployment's prefix: pure naming, shared by every
//! part of the queue.

use crate::domain::Stage;

/// Subject and stream names under one prefix.
#[derive(Debug, Clone)]
pub struct Subjects {
    /// The prefix (provisioning names the streams' wildcard subjects with it).
    pub(super) prefix: String,
}

impl Subjects {
    /// Names under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    /// `P.init`.
    pub fn init(&self) -> String {
        format!("{}.init", self.prefix)
    }

    /// `P.run.<route>`, where route is a node name or `any`.
    pub fn run(&self, route: &str) -> String {
        format!("{}.run.{route}", self.prefix)
    }

    /// `P.eval`.
    pub fn eval(&self) -> String {
        format!("{}.eval", self.prefix)
    }

    /// The subject a work message is published on.
    pub fn work(&self, stage: Stage, route: Option<&str>) -> String {
        match stage {
            Stage::Init => self.init(),
            Stage::Run => self.run(route.unwrap_or(ANY_ROUTE)),
            Stage::Eval => self.eval(),
        }
    }

    /// `P.done.<batch>`.
    pub fn done(&self, batch: &str) -> String {
        format!("{}.done.{batch}", self.prefix)
    }

    /// `P.done.>`.
    pub fn done_all(&self) -> String {
        format!("{}.done.>", self.prefix)
    }

    /// `P.dead`.
    pub fn dead(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// `P.cancel`.
    pub fn cancel(&self) -> String {
        format!("{}.cancel", self.prefix)
    }

    /// `P.policy`: core NATS, payload the policy state as JSON after every change (every
    /// RUN worker hears it; one that misses it reads the state from the database soon
    /// after).
    pub fn policy(&self) -> String {
        format!("{}.policy", self.prefix)
    }

    /// `P.policy.announce`: core NATS requests carrying the body of `POST /v1/policy`,
    /// answered by one gateway like [`Subjects::submit`].
    pub fn policy_announce(&self) -> String {
        format!("{}.policy.announce", self.prefix)
    }

    /// `P.policy.resume`: core NATS requests carrying `{"version": N}`, answered as
    /// `POST /v1/policy/{N}/resume` is, by one gateway.
    pub fn policy_resume(&self) -> String {
        format!("{}.policy.resume", self.prefix)
    }

    /// `P.submit`: core NATS requests carrying the body of `POST /v1/jobs`, answered by
    /// one of the gateways (not captured by a stream: a submit nobody answers fails at
    /// the requester, who retries it with the same client ids).
    pub fn submit(&self) -> String {
        format!("{}.submit", self.prefix)
    }

    /// Requests to create a sampling batch (the body of `POST /v1/batches`), answered by
    /// one gateway like [`Subjects::submit`].
    pub fn batches_submit(&self) -> String {
        format!("{}.batches.submit", self.prefix)
    }

    /// Core NATS, payload a batch id: a group of that sampling batch was decided, so a
    /// batch driver should launch, cancel or publish what follows from it.
    pub fn batches_wake(&self) -> String {
        format!("{}.batches.wake", self.prefix)
    }

    /// A sampling batch's accepted groups, one message per group in rank order (on the
    /// GROUPS stream, so a trainer can replay them).
    pub fn groups(&self, batch: &str) -> String {
        format!("{}.groups.{batch}", self.prefix)
    }

    /// Stream name `PREFIX_SUFFIX` (stream names cannot contain `.`; upper case by
    /// convention).
    pub fn stream(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix.to_uppercase().replace('-', "_"))
    }
}

/// The RUN route of jobs that may run on any node (no node-local sandbox).
pub const ANY_ROUTE: &str = "any";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_and_streams() {
        let s = Subjects::new("rollout");
        assert_eq!(s.init(), "rollout.init");
        assert_eq!(s.work(Stage::Run, None), "rollout.run.any");
        assert_eq!(s.work(Stage::Run, Some("n1")), "rollout.run.n1");
        assert_eq!(s.done("b1"), "rollout.done.b1");
        assert_eq!(Subjects::new("t-1").stream("WORK"), "T_1_WORK");
    }
}
