//! Pausing and aborting generation as vLLM 0.32 does it on its dev-mode endpoints (and,
//! on the same machinery, SGLang's `/pause_generation` and `/continue_generation`, see
//! the crate root)
//! (`VLLM_SERVER_DEV_MODE=1`), so that the client, and the service around it, are tested
//! against the real semantics (checked against the real server by `tests/pipeline/real_vllm.rs`):
//!
//! - `POST /pause?mode=abort` (the default) aborts every request in the server, those
//!   generating and those waiting, and holds new ones; `mode=keep` freezes the
//!   generating ones in place (they go on after the resume, with the same tokens);
//!   `mode=wait` holds new ones and answers once the generating ones have ended.
//!   `clear_cache` (default true) empties the prefix cache. Answers
//!   `{"status": "paused"}`.
//! - `POST /resume` lets everything go on: `{"status": "resumed"}`.
//! - `GET /is_paused`: `{"is_paused": bool}`.
//! - `POST /abort_requests` with `{}` aborts everything in the server without pausing:
//!   `{"status": "aborted", "aborted": N}`. (vLLM's `request_ids` name its engine's own
//!   ids; the stand-in keeps none, so a list aborts nothing, and it still answers
//!   `aborted` with the list's length, as vLLM does for ids it does not know.)
//!
//! A request sent while paused in `keep` mode waits inside its HTTP request until the
//! resume; in `abort` or `wait` mode vLLM 0.33 refuses it at once (503, "Generation is
//! paused. Please retry after it resumes."), while vLLM 0.32 and SGLang hold it as in
//! `keep` (the crate root's `pause_holds_new` picks 0.32). An aborted request is answered 200
//! with `finish_reason: "abort"` and the tokens generated before the abort (none for
//! one that was waiting).

use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::sync::watch;

/// How `/pause` treats the requests in the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// Abort them all (vLLM's default).
    #[default]
    Abort,
    /// Let the generating ones finish; the answer comes when they have.
    Wait,
    /// Freeze them where they are until the resume.
    Keep,
}

/// `POST /pause`'s query.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PauseQuery {
    /// See [`PauseMode`].
    #[serde(default)]
    pub mode: PauseMode,
    /// Whether the prefix cache is emptied (vLLM's default: yes).
    #[serde(default = "yes")]
    pub clear_cache: bool,
}

fn yes() -> bool {
    true
}

/// The server's pause state, watched by every request in it. The counts change with
/// every request, so changing them wakes no one ([`watch::Sender::send_if_modified`]
/// returning `false`), except the last generating request's end while a `wait` pause
/// waits for it: a request would otherwise be woken by every other request's arrival
/// and end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct State {
    /// New requests wait.
    paused: bool,
    /// Generating requests stop where they are (`mode=keep`).
    frozen: bool,
    /// Bumped by every abort: a request whose ticket differs was aborted.
    aborts: u64,
    /// Requests waiting to be let in.
    waiting: u64,
    /// Requests let in and not yet answered.
    generating: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Pause {
    state: watch::Sender<State>,
}

impl Default for Pause {
    fn default() -> Self {
        Pause {
            state: watch::Sender::new(State::default()),
        }
    }
}

/// A request's place in the server: its abort ticket, and its count (waiting, then
/// generating) until dropped.
pub struct Ticket<'a> {
    pause: &'a Pause,
    aborts: u64,
    generating: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let generating = self.generating;
        self.pause.state.send_if_modified(|s| {
            if generating {
                s.generating -= 1;
                // A `wait` pause waits for this.
                s.paused && s.generating == 0
            } else {
                s.waiting -= 1;
                false
            }
        });
    }
}

impl Pause {
    /// A request arriving: it counts as waiting until [`Ticket::admitted`].
    pub fn arrive(&self) -> Ticket<'_> {
        let mut aborts = 0;
        self.state.send_if_modified(|s| {
            s.waiting += 1;
            aborts = s.aborts;
            false
        });
        Ticket {
            pause: self,
            aborts,
            generating: false,
        }
    }

    /// `/pause`: holds new requests and treats those in the server as `mode` says;
    /// returns (for `wait`) once none is generating.
    pub async fn pause(&self, mode: PauseMode) {
        self.state.send_modify(|s| {
            s.paused = true;
            s.frozen = mode == PauseMode::Keep;
            if mode == PauseMode::Abort {
                s.aborts += 1;
            }
        });
        if mode == PauseMode::Wait {
            let mut rx = self.state.subscribe();
            let _ = rx.wait_for(|s| s.generating == 0).await;
        }
    }

    /// `/resume`.
    pub fn resume(&self) {
        self.state.send_modify(|s| {
            s.paused = false;
            s.frozen = false;
        });
    }

    /// `/abort_requests {}`: aborts every request in the server; returns how many.
    pub fn abort_all(&self) -> u64 {
        let mut n = 0;
        self.state.send_modify(|s| {
            s.aborts += 1;
            n = s.waiting + s.generating;
        });
        n
    }

    /// Whether a pause in `abort` or `wait` mode is on (vLLM 0.33 refuses new requests
    /// then).
    pub fn refusing(&self) -> bool {
        let s = self.state.borrow();
        s.paused && !s.frozen
    }

    /// The requests waiting to be let in, and those generating.
    pub fn load(&self) -> (u64, u64) {
        let s = self.state.borrow();
        (s.waiting, s.generating)
    }

    /// `/is_paused`.
    pub fn is_paused(&self) -> bool {
        self.state.borrow().paused
    }
}

impl Ticket<'_> {
    /// Waits while the server is paused; `false` when the request was aborted meanwhile.
    /// Once let in, it counts as generating.
    pub async fn admitted(&mut self) -> bool {
        let mut rx = self.pause.state.subscribe();
        let aborts = self.aborts;
        let Ok(st) = rx.wait_for(|s| s.aborts != aborts || !s.paused).await else {
            return false;
        };
        if st.aborts != aborts {
            return false;
        }
        drop(st);
        self.pause.state.send_if_modified(|s| {
            s.waiting -= 1;
            s.generating += 1;
            false
        });
        self.generating = true;
        true
    }

    /// Spends `wait` generating, a clock that stops while the server is frozen
    /// (`mode=keep`). `Err` with the time spent generating when the request was aborted
    /// (all of `wait` for an answer that was ready: one ready while frozen is held until
    /// the resume).
    pub async fn generate(&self, wait: Duration) -> Result<(), Duration> {
        self.generate_with(wait, |_| {}).await
    }

    /// [`Self::generate`], calling `running(done)` each time the clock (re)starts, with
    /// the time generated so far: at the start and after each freeze, which is where a
    /// server's weights can have changed under the request.
    pub async fn generate_with(
        &self,
        wait: Duration,
        mut running: impl FnMut(Duration),
    ) -> Result<(), Duration> {
        let mut rx = self.pause.state.subscribe();
        let aborts = self.aborts;
        let mut left = wait;
        let done = |left: Duration| wait - left;
        loop {
            let st = match rx.wait_for(|s| s.aborts != aborts || !s.frozen).await {
                Ok(st) => *st,
                Err(_) => return Ok(()),
            };
            if st.aborts != aborts {
                return Err(done(left));
            }
            if left.is_zero() {
                return Ok(());
            }
            running(done(left));
            let t0 = Instant::now();
            tokio::select! {
                () = tokio::time::sleep(left) => left = Duration::ZERO,
                changed = rx.changed() => {
                    left = left.saturating_sub(t0.elapsed());
                    if changed.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waits_out_a_pause_and_an_abort_ends_it_with_nothing() {
        let p = Pause::default();
        p.pause(PauseMode::Keep).await;
        assert!(p.is_paused());
        let mut t = p.arrive();
        let held = tokio::time::timeout(Duration::from_millis(50), t.admitted()).await;
        assert!(held.is_err(), "a paused server holds new requests");
        p.resume();
        assert!(t.admitted().await);
        drop(t);
        p.pause(PauseMode::Keep).await;
        let mut t = p.arrive();
        let (admitted, n) = tokio::join!(t.admitted(), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            p.abort_all()
        });
        assert!(!admitted, "aborted while it waited");
        assert_eq!(n, 1);
    }

    #[tokio::test]
    async fn keep_freezes_a_generation_and_abort_cuts_it_where_it_is() {
        let p = Pause::default();
        let mut t = p.arrive();
        assert!(t.admitted().await);
        let (r, ()) = tokio::join!(t.generate(Duration::from_millis(400)), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            p.pause(PauseMode::Keep).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            p.pause(PauseMode::Abort).await;
        });
        let done = r.expect_err("aborted");
        assert!(
            done > Duration::ZERO && done < Duration::from_millis(400),
            "cut where it was: {done:?}"
        );
        p.resume();
        // A generation the resume lets go on ends normally.
        let mut t = p.arrive();
        assert!(t.admitted().await);
        let (r, ()) = tokio::join!(t.generate(Duration::from_millis(100)), async {
            p.pause(PauseMode::Keep).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            p.resume();
        });
        assert_eq!(r, Ok(()));
    }

    #[tokio::test]
    async fn wait_answers_once_the_generating_requests_have_ended() {
        let p = Pause::default();
        let mut t = p.arrive();
        assert!(t.admitted().await);
        let (r, ()) = tokio::join!(
            async {
                let r = t.generate(Duration::from_millis(100)).await;
                drop(t);
                r
            },
            p.pause(PauseMode::Wait)
        );
        assert_eq!(r, Ok(()), "wait lets a generation finish");
        assert!(p.is_paused());
        assert_eq!(p.abort_all(), 0);
    }
}
