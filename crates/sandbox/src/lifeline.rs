//! A process's lifeline: how a sandbox knows the worker that started it is gone.
//!
//! A sandbox that must end with its worker ([`super::StartRequest::die_with_parent`])
//! cannot rely on the kernel's parent-death signal alone. bwrap asks for it in the
//! namespace's init only once the sandbox is built, after `--block-fd` returns; a worker
//! killed while bwrap waits there closes the go-ahead pipe, bwrap reads end-of-file as a
//! go-ahead, and the sandbox starts with no parent to die with (seen: a node SIGKILLed
//! mid-start left bwrap, the server and its shell running, their workspace's loop device
//! held). The lifeline closes every such window the same way: the worker holds the
//! write end of one pipe for its whole life and never writes to it; each sandbox server
//! gets a read end (`rollout-sandbox serve --lifeline-fd N`) and stops as soon as a
//! read returns end-of-file, which happens exactly when the last write end is closed,
//! that is when the worker has ended, however it ended. Both ends are close-on-exec in
//! the worker, so no other program it starts holds the write end and keeps a sandbox
//! alive after it.

use std::os::fd::OwnedFd;
use std::sync::OnceLock;

/// The pipe, made on first use and kept until the process ends: (read, write).
static PIPE: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();

/// A read end of this process's lifeline for one sandbox (a descriptor of its own, to
/// pass to the server; close-on-exec until the launcher moves it into place).
pub(crate) fn reader() -> std::io::Result<OwnedFd> {
    let (read, _) = match PIPE.get() {
        Some(p) => p,
        None => {
            let made =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
            // Another thread may have won the race: its pipe is the lifeline, this one
            // is closed when dropped.
            let _ = PIPE.set(made);
            PIPE.get().expect("the lifeline was just set")
        }
    };
    read.try_clone()
}

/// Waits, in the sandbox server, until the worker's lifeline at `fd` breaks (a read
/// returns end-of-file or fails), then returns. The descriptor is made close-on-exec
/// first, so the shell, the interpreter and what they start do not hold it.
///
/// # Safety
///
/// `fd` must be an open descriptor that nothing else in this process owns (the launcher
/// passed it for exactly this use).
pub unsafe fn wait_broken(fd: i32) -> impl std::future::Future<Output = std::io::Result<()>> {
    use std::os::fd::FromRawFd;
    // SAFETY: the caller vouches that `fd` is open and owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    async move {
        nix::fcntl::fcntl(
            &owned,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(std::io::Error::from)?;
        let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(owned)?;
        let mut buf = [0u8; 64];
        loop {
            use tokio::io::AsyncReadExt;
            match pipe.read(&mut buf).await {
                // Nobody writes to it: a byte read is ignored, the end is what counts.
                Ok(n) if n > 0 => continue,
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

pub(crate) use rollout_core::child::die_with;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    #[tokio::test]
    async fn a_lifeline_holds_while_its_write_end_is_open_and_breaks_when_it_closes() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        // SAFETY: the descriptor was just made and is handed over whole.
        let waiting = tokio::spawn(unsafe { wait_broken(read.into_raw_fd()) });
        // A byte written is not the end.
        nix::unistd::write(&write, b"x").unwrap();
        let mut waiting = std::pin::pin!(waiting);
        let early = tokio::time::timeout(std::time::Duration::from_millis(200), &mut waiting);
        assert!(
            early.await.is_err(),
            "the lifeline broke while its write end was open"
        );
        drop(write);
        waiting.await.unwrap().unwrap();
    }

    #[test]
    fn every_reader_shares_the_process_lifeline() {
        let a = reader().unwrap();
        let b = reader().unwrap();
        let ino = |fd: &OwnedFd| nix::sys::stat::fstat(fd).unwrap().st_ino;
        assert_eq!(ino(&a), ino(&b));
        let flags = nix::fcntl::fcntl(&a, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC),
            "a reader must not leak into programs the worker starts"
        );
    }
}
