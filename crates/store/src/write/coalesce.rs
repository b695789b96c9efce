//! Statement coalescing: many tasks' single-row writes of one kind, run as one
//! multi-row statement.
//!
//! On a database server, a statement's fixed cost (a round trip, parsing and binding,
//! a commit with its WAL flush) is several times the cost of the row it changes. Every
//! stage of every job starts with a claim and ends with a hand-off, each one row, so at
//! high rates those fixed costs are what saturates the server. A [`Coalescer`] queues
//! such writes and runs whatever has queued up as one statement over arrays of
//! parameters: one write alone when the service is quiet (no waiting for company), a
//! hundred when a previous statement of the kind is still running. A few statements of
//! a kind run at once, so one slow statement does not hold every caller.
//!
//! Callers see the semantics of one statement each: a reply means the row's write is
//! committed (or did not apply), and an error means it was not applied. Writes to the
//! same row never share a statement (a multi-row `UPDATE` changes a row once). If a
//! statement of several writes fails, each write is tried again alone, so one write the
//! database refuses cannot fail the others, and each caller gets its own error.
//!
//! A panic while a statement runs (a bug in its code) fails that statement's writes
//! alone: the task that coalesces outlives it, where dying would close the queue and
//! fail every later write of the kind while the process looked alive.

use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};

use crate::{StoreError, StoreResult};

/// Most writes in one statement.
const MAX_PER_STATEMENT: usize = 256;

/// Most statements of one kind running at once.
const IN_FLIGHT: usize = 4;

/// One kind of coalesced write: how a group of them runs as one statement.
pub(crate) trait WriteKind: Send + Sync + 'static {
    /// One caller's write.
    type Req: Send + 'static;
    /// What that caller gets back.
    type Resp: Send + 'static;

    /// What names the row a write changes.
    type Key: Eq + std::hash::Hash;

    /// Most statements of this kind running at once.
    const IN_FLIGHT: usize = IN_FLIGHT;

    /// The row a write changes: two writes with the same key never share a statement.
    fn key(req: &Self::Req) -> Self::Key;

    /// Runs `reqs` (distinct keys) as one statement and returns one answer per write, in
    /// order.
    fn run(&self, reqs: &[Self::Req]) -> impl Future<Output = StoreResult<Vec<Self::Resp>>> + Send;
}

/// A queued write and where its answer goes.
type Queued<B> = (
    <B as WriteKind>::Req,
    oneshot::Sender<StoreResult<<B as WriteKind>::Resp>>,
);

/// The queue of a task that coalesces writes of kind `B`. Cloning it shares the task.
pub(crate) struct Coalescer<B: WriteKind> {
    queue: mpsc::Sender<Queued<B>>,
}

impl<B: WriteKind> Clone for Coalescer<B> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<B: WriteKind> std::fmt::Debug for Coalescer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

impl<B: WriteKind> Coalescer<B> {
    /// Starts the task that runs `kind`'s statements; it runs until every clone of the
    /// returned queue is dropped and every queued write is answered.
    pub(crate) fn start(kind: B) -> Self {
        let (queue, rx) = mpsc::channel(4 * MAX_PER_STATEMENT);
        tokio::spawn(run(Arc::new(kind), rx));
        Self { queue }
    }

    /// Queues `req` and waits for its statement.
    pub(crate) async fn write(&self, req: B::Req) -> StoreResult<B::Resp> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send((req, tx))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

/// The coalescing task: takes what has queued up (up to [`MAX_PER_STATEMENT`] distinct rows)
/// whenever fewer than [`IN_FLIGHT`] statements are running, and runs it.
async fn run<B: WriteKind>(kind: Arc<B>, mut rx: mpsc::Receiver<Queued<B>>) {
    let mut running = FuturesUnordered::new();
    // Writes to a row already in the group being formed, for a later group.
    let mut held: Vec<Queued<B>> = Vec::new();
    let mut open = true;
    loop {
        if !open && held.is_empty() && running.is_empty() {
            return;
        }
        let can_start = running.len() < B::IN_FLIGHT;
        tokio::select! {
            // Held writes are already here: start them without waiting for new ones.
            first = rx.recv(), if can_start && open && held.is_empty() => match first {
                Some(first) => {
                    let group = take_group::<B>(vec![first], &mut held, &mut rx);
                    running.push(run_group(kind.clone(), group));
                }
                None => open = false,
            },
            () = std::future::ready(()), if can_start && !held.is_empty() => {
                let group = take_group::<B>(std::mem::take(&mut held), &mut held, &mut rx);
                running.push(run_group(kind.clone(), group));
            }
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
}

/// Forms one statement's writes from `start` and whatever else is queued: at most
/// [`MAX_PER_STATEMENT`], one per row; writes to a row already taken go to `held`.
fn take_group<B: WriteKind>(
    start: Vec<Queued<B>>,
    held: &mut Vec<Queued<B>>,
    rx: &mut mpsc::Receiver<Queued<B>>,
) -> Vec<Queued<B>> {
    let mut group = Vec::with_capacity(start.len().min(MAX_PER_STATEMENT));
    let mut keys = HashSet::new();
    let mut place = |q: Queued<B>, group: &mut Vec<Queued<B>>, held: &mut Vec<Queued<B>>| {
        if group.len() < MAX_PER_STATEMENT && keys.insert(B::key(&q.0)) {
            group.push(q);
        } else {
            held.push(q);
        }
    };
    for q in start {
        place(q, &mut group, held);
    }
    while group.len() < MAX_PER_STATEMENT {
        match rx.try_recv() {
            Ok(q) => place(q, &mut group, held),
            Err(_) => break,
        }
    }
    group
}

/// Runs one statement's writes and answers each caller; if a statement of several
/// fails, tries each write alone.
async fn run_group<B: WriteKind>(kind: Arc<B>, group: Vec<Queued<B>>) {
    let (reqs, replies): (Vec<B::Req>, Vec<_>) = group.into_iter().unzip();
    match run_caught(kind.as_ref(), &reqs).await {
        Ok(answers) if answers.len() == reqs.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(answers) => {
            let e = format!(
                "a statement of {} writes gave {} answers",
                reqs.len(),
                answers.len()
            );
            tracing::error!(error = %e, "coalesced write answered wrongly");
            for reply in replies {
                let _ = reply.send(Err(StoreError::GroupWrite(e.clone())));
            }
        }
        Err(e) if reqs.len() == 1 => {
            let _ = replies.into_iter().next().map(|r| r.send(Err(e)));
        }
        Err(e) => {
            tracing::debug!(error = %e, writes = reqs.len(), "a coalesced statement failed; trying its writes one by one");
            for (req, reply) in reqs.into_iter().zip(replies) {
                let answer = run_caught(kind.as_ref(), std::slice::from_ref(&req))
                    .await
                    .and_then(|mut a| {
                        a.pop().ok_or_else(|| {
                            StoreError::GroupWrite("a statement of one write gave no answer".into())
                        })
                    });
                let _ = reply.send(answer);
            }
        }
    }
}

/// `kind.run(reqs)`, a panic in it turned into an error of these writes.
fn run_caught<'a, B: WriteKind>(
    kind: &'a B,
    reqs: &'a [B::Req],
) -> impl Future<Output = StoreResult<Vec<B::Resp>>> + Send + 'a {
    let n = reqs.len();
    AssertUnwindSafe(kind.run(reqs))
        .catch_unwind()
        .map(move |ran| {
            ran.unwrap_or_else(|panic| {
                let e = format!(
                    "a statement of {n} writes panicked: {}",
                    rollout_core::supervise::panic_message(panic)
                );
                tracing::error!(error = %e, "coalesced write failed");
                Err(StoreError::GroupWrite(e))
            })
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records each statement's keys; refuses any statement holding the key "bad", and
    /// answers each write with its key's length.
    struct Recorder {
        statements: Mutex<Vec<Vec<String>>>,
        gate: tokio::sync::Semaphore,
    }

    impl Recorder {
        async fn record(&self, reqs: &[String]) -> StoreResult<Vec<usize>> {
            // Held until the test lets statements finish, so writes pile up.
            self.gate.acquire().await.unwrap().forget();
            self.statements.lock().unwrap().push(reqs.to_vec());
            if reqs.iter().any(|r| r == "bad") {
                return Err(StoreError::Corrupt("refused".into()));
            }
            assert!(!reqs.iter().any(|r| r == "boom"), "boom in a statement");
            Ok(reqs.iter().map(String::len).collect())
        }
    }

    #[tokio::test]
    async fn writes_queued_together_share_statements_one_per_row_and_a_refusal_stays_with_its_writer()
     {
        let rec = Arc::new(Recorder {
            statements: Mutex::default(),
            gate: tokio::sync::Semaphore::new(0),
        });
        let c = Coalescer::start(Shared(rec.clone()));
        // The first IN_FLIGHT writes start statements of their own and wait at the gate;
        // everything queued behind them is coalesced.
        let mut calls = Vec::new();
        for k in ["a", "bb", "ccc", "dddd", "e", "ff", "e", "bad", "ggg"] {
            let c = c.clone();
            calls.push(tokio::spawn(async move { c.write(k.to_string()).await }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        rec.gate.add_permits(1_000);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        let ok: Vec<Option<usize>> = answers.iter().map(|a| a.as_ref().ok().copied()).collect();
        assert_eq!(
            ok,
            vec![
                Some(1),
                Some(2),
                Some(3),
                Some(4),
                Some(1),
                Some(2),
                Some(1),
                None,
                Some(3)
            ]
        );
        assert!(
            matches!(answers[7], Err(StoreError::Corrupt(_))),
            "the refused write gets the database's own error: {:?}",
            answers[7]
        );
        let statements = rec.statements.lock().unwrap().clone();
        for s in &statements {
            let distinct: HashSet<&String> = s.iter().collect();
            assert_eq!(
                distinct.len(),
                s.len(),
                "a row twice in one statement: {s:?}"
            );
        }
        assert!(
            statements.iter().any(|s| s.len() > 1),
            "writes queued behind running statements were coalesced: {statements:?}"
        );
    }

    /// A statement that panics fails its own writes with an error naming the panic,
    /// and the coalescer goes on: a later write still runs.
    #[tokio::test]
    async fn a_statement_that_panics_fails_its_writes_and_the_next_write_still_runs() {
        let rec = Arc::new(Recorder {
            statements: Mutex::default(),
            gate: tokio::sync::Semaphore::new(1_000),
        });
        let c = Coalescer::start(Shared(rec.clone()));
        let e = c.write("boom".to_string()).await.unwrap_err();
        assert!(
            matches!(&e, StoreError::GroupWrite(m) if m.contains("boom in a statement")),
            "{e}"
        );
        assert_eq!(c.write("after".to_string()).await.unwrap(), 5);
    }

    /// The recorder as a kind of coalesced write (the test keeps a handle on it).
    struct Shared(Arc<Recorder>);

    impl WriteKind for Shared {
        type Req = String;
        type Resp = usize;
        type Key = String;

        fn key(req: &String) -> String {
            req.clone()
        }

        async fn run(&self, reqs: &[String]) -> StoreResult<Vec<usize>> {
            self.0.record(reqs).await
        }
    }
}
