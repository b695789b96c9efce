//! `TCP_NODELAY` on the Postgres pool's connections, which the driver no longer sets.
//!
//! sqlx 0.9.0 stopped disabling Nagle's algorithm on its TCP sockets (sqlx issue
//! #4335; the fix is merged upstream but not in a release). With Nagle on, a statement
//! the kernel sends as several segments (on a real network, anything over about 1.4 kB;
//! on loopback, over 64 kB) can leave its last, partial segment waiting for the
//! server's acknowledgement of the ones before it, and the server, holding part of a
//! message it cannot answer yet, delays that acknowledgement by up to 40 ms. Batched
//! statements (a group of job ends or claims, a page of submitted jobs) are exactly the
//! large ones, and the job ends stall while holding the result-ordering lock, so every
//! process's ends wait with them. Measured here (BENCHMARKS.md): zero-work throughput
//! over TCP was 1,700–1,900 jobs/s without the option, 3,000 over a Unix socket (which
//! has no Nagle) and 2,800 over TCP with it.
//!
//! sqlx gives no handle on its sockets, so the pool's `after_connect` hook looks for
//! them: every TCP socket of this process whose peer port is the database's gets the
//! option. Setting it on a socket that is not the new connection's (an older pool
//! connection, another client of a server on the same port) is harmless, and a
//! descriptor closed and reused meanwhile is at worst not a socket (the call fails and
//! is ignored) or a socket that gains the same option. Remove this module when the
//! driver sets the option again.

use std::os::fd::{BorrowedFd, RawFd};

use nix::sys::socket::{SockaddrStorage, getpeername, setsockopt, sockopt};

/// Sets `TCP_NODELAY` on every TCP socket of this process connected to `port`; returns
/// how many it found. Errors (a descriptor that went away, one that is not a socket)
/// skip that descriptor: the option is an optimisation, never a reason to fail a
/// connection.
pub(crate) fn on_sockets_to(port: u16) -> usize {
    open_fds()
        .filter(|fd| inet_port(getpeername(*fd)) == Some(port))
        .filter(|fd| {
            // SAFETY: `fd` was open when listed and is only borrowed for this one call;
            // if it was closed and reused since, the call fails or sets the option on
            // another socket, neither of which touches memory (see the module's
            // documentation).
            let borrowed = unsafe { BorrowedFd::borrow_raw(*fd) };
            setsockopt(&borrowed, sockopt::TcpNoDelay, &true).is_ok()
        })
        .count()
}

/// This process's open file descriptors, as listed a moment ago (none if the list
/// cannot be read).
fn open_fds() -> impl Iterator<Item = RawFd> {
    std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<RawFd>().ok())
}

/// The port of a socket address if it is an IPv4 or IPv6 one (`getpeername` or
/// `getsockname` of a descriptor; an error, or another family, is `None`).
fn inet_port(addr: nix::Result<SockaddrStorage>) -> Option<u16> {
    let addr = addr.ok()?;
    addr.as_sockaddr_in()
        .map(|a| a.port())
        .or_else(|| addr.as_sockaddr_in6().map(|a| a.port()))
}

/// Whether this process's TCP socket bound to local `port` has `TCP_NODELAY`; `None`
/// if there is no such socket. For tests that check a connection the server names by
/// its client port.
#[cfg(test)]
pub(super) fn nodelay_of_local_port(port: u16) -> Option<bool> {
    nodelay_where(nix::sys::socket::getsockname, port)
}

/// Whether this process's TCP socket whose peer is on `port` has `TCP_NODELAY`; `None`
/// if there is no such socket. For tests of a server in this process: its side of a
/// connection is the socket whose peer port is the client's local port (the gateway's
/// tests check its accepted connections so; public for them).
pub fn nodelay_of_peer_port(port: u16) -> Option<bool> {
    nodelay_where(getpeername, port)
}

/// `TCP_NODELAY` of the first socket whose address, as `name` reads it, is on `port`.
fn nodelay_where(name: fn(RawFd) -> nix::Result<SockaddrStorage>, port: u16) -> Option<bool> {
    let fd = open_fds().find(|fd| inet_port(name(*fd)) == Some(port))?;
    // SAFETY: as in `on_sockets_to`.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    nix::sys::socket::getsockopt(&borrowed, sockopt::TcpNoDelay).ok()
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    use super::*;

    fn nodelay(s: &TcpStream) -> bool {
        nix::sys::socket::getsockopt(&s.as_fd(), sockopt::TcpNoDelay).unwrap()
    }

    #[test]
    fn sockets_to_the_port_get_the_option_and_others_keep_theirs() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        let to_server = TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let to_other = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        assert!(!nodelay(&to_server), "a new socket starts with Nagle on");

        assert!(on_sockets_to(port) >= 1);

        assert!(nodelay(&to_server));
        assert!(
            !nodelay(&to_other),
            "a socket to another port is left alone"
        );
        // The listening socket has no peer and is not touched.
        drop(server);
    }
}
