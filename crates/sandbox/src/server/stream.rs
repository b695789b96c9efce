//! Non-blocking file descriptors (a pty master, a pipe) read towards an end marker.
//!
//! Both persistent processes, the shell and the Python interpreter, report the end of a
//! call by printing `\x1e<session token>:<sequence>:<payload>\x1e` into their output. A
//! [`MarkedStream`] reads that output, passes everything else to a [`CappedOutput`], and
//! returns the payload of the first marker whose sequence number is the awaited one or
//! later. Markers of earlier calls (which can arrive late after a timeout) are dropped;
//! bytes after a marker (a background job's output) are kept for the next call.

use super::output::{CappedOutput, MarkerScanner, Scan};
use futures::FutureExt;
use std::io;
use std::os::fd::OwnedFd;
use std::time::Instant;
use tokio::io::unix::AsyncFd;
use tokio::time::timeout_at;

/// How a read towards a marker ended.
#[derive(Debug)]
pub enum Until {
    /// The marker arrived; this is its payload after the sequence number.
    Marker(String),
    /// The other side closed (the process exited).
    Eof,
    /// The deadline passed first.
    Deadline,
}

/// Output of a persistent process, scanned for its end markers.
pub struct MarkedStream {
    fd: std::sync::Arc<AsyncFd<OwnedFd>>,
    scanner: MarkerScanner,
    carry: Vec<u8>,
    /// Bytes of between-calls output dropped from `carry` to bound it.
    dropped: u64,
    buf: Vec<u8>,
}

impl MarkedStream {
    /// Wraps `fd` (made non-blocking here) for markers carrying `token`.
    pub fn new(fd: OwnedFd, token: &str, max_payload: usize) -> io::Result<Self> {
        Ok(MarkedStream {
            fd: std::sync::Arc::new(nonblocking(fd)?),
            dropped: 0,
            scanner: MarkerScanner::new(token).with_max_payload(max_payload),
            carry: Vec::new(),
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// The descriptor, for writes and terminal queries.
    pub fn fd(&self) -> &AsyncFd<OwnedFd> {
        &self.fd
    }

    /// A shared handle on the descriptor, to wait for output without holding the stream.
    pub fn shared_fd(&self) -> std::sync::Arc<AsyncFd<OwnedFd>> {
        self.fd.clone()
    }

    /// Reads whatever output is waiting, between calls, into the carry-over for the next
    /// call, keeping at most `keep` bytes (the newest) and counting what it drops. This
    /// keeps a chatty background job from blocking on a full terminal while no call is
    /// reading. Returns false when the other side is gone.
    pub fn drain_available(&mut self, keep: usize) -> io::Result<bool> {
        loop {
            match nix::unistd::read(self.fd.get_ref(), &mut self.buf) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.carry.extend_from_slice(&self.buf[..n]);
                    if self.carry.len() > keep {
                        let cut = self.carry.len() - keep;
                        self.carry.drain(..cut);
                        self.dropped += cut as u64;
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => {
                    // Tell tokio the descriptor is drained, or it stays "ready".
                    if let Some(mut g) = self.fd.readable().now_or_never().and_then(Result::ok) {
                        g.clear_ready();
                    }
                    return Ok(true);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EIO) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads until a marker numbered `seq` or later, end of stream, or `deadline`.
    pub async fn read_until(
        &mut self,
        out: &mut CappedOutput,
        seq: u64,
        deadline: Instant,
    ) -> io::Result<Until> {
        if self.dropped > 0 {
            out.skip(std::mem::take(&mut self.dropped));
        }
        let carry = std::mem::take(&mut self.carry);
        if let Some(found) = self.feed(&carry, out, seq) {
            return Ok(found);
        }
        loop {
            let n = match timeout_at(deadline.into(), read(&self.fd, &mut self.buf)).await {
                Err(_) => return Ok(Until::Deadline),
                Ok(r) => r?,
            };
            if n == 0 {
                self.scanner.flush(out);
                return Ok(Until::Eof);
            }
            let chunk = self.buf[..n].to_vec();
            if let Some(found) = self.feed(&chunk, out, seq) {
                return Ok(found);
            }
        }
    }

    /// Like [`read_until`](Self::read_until), but also watches the process writing the
    /// stream: a child it started may hold the stream open after it died, so end of
    /// stream alone would not tell. On its exit, takes what it printed before it went
    /// (for up to 100 ms) and reports end of stream unless the marker came.
    pub async fn read_until_exit(
        &mut self,
        child: &mut tokio::process::Child,
        out: &mut CappedOutput,
        seq: u64,
        deadline: Instant,
    ) -> io::Result<Until> {
        tokio::select! {
            r = self.read_until(out, seq, deadline) => r,
            _ = child.wait() => {
                let drain = (Instant::now() + std::time::Duration::from_millis(100)).min(deadline);
                match self.read_until(out, seq, drain).await? {
                    Until::Marker(payload) => Ok(Until::Marker(payload)),
                    _ => Ok(Until::Eof),
                }
            }
        }
    }

    /// Ends a call that got no marker: bytes held back as a possible marker start are
    /// output after all.
    pub fn flush(&mut self, out: &mut CappedOutput) {
        self.scanner.flush(out);
    }

    fn feed(&mut self, bytes: &[u8], out: &mut CappedOutput, seq: u64) -> Option<Until> {
        let mut bytes = bytes.to_vec();
        loop {
            match self.scanner.feed(&bytes, out) {
                Scan::Pending => return None,
                Scan::Found { payload, rest } => {
                    let (got, payload) = payload.split_once(':').unwrap_or((&payload, ""));
                    if got.parse::<u64>().is_ok_and(|got| got >= seq) {
                        self.carry = rest;
                        return Some(Until::Marker(payload.to_string()));
                    }
                    bytes = rest;
                }
            }
        }
    }
}

/// Sets `O_NONBLOCK` and registers the descriptor with tokio.
pub fn nonblocking(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(&fd, FcntlArg::F_GETFL).map_err(io::Error::from)?);
    fcntl(&fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map_err(io::Error::from)?;
    // SAFETY: the descriptor is owned, so it cannot be closed while registered.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into())
}

/// Reads what is available; 0 means the other side is gone.
pub async fn read(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(io::Error::from)) {
            Ok(Ok(n)) => return Ok(n),
            // Linux reports a pty whose other side closed as EIO, not end of file.
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
}

/// Writes all of `bytes`.
pub async fn write_all(fd: &AsyncFd<OwnedFd>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        let mut guard = fd.writable().await?;
        match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), bytes).map_err(io::Error::from)) {
            Ok(Ok(n)) => bytes = &bytes[n..],
            Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {}
        }
    }
    Ok(())
}

/// Restores default dispositions of the signals a tool relies on; runs between fork and
/// exec of the shell and the interpreter, which would otherwise inherit an ignored SIGINT
/// from whoever started the server (a background job of a script, say) and could then
/// never be interrupted.
pub fn reset_signals() -> io::Result<()> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGPIPE,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
        Signal::SIGHUP,
    ] {
        // SAFETY: setting SIG_DFL installs no handler code.
        unsafe { signal(sig, SigHandler::SigDfl) }.map_err(io::Error::from)?;
    }
    Ok(())
}
