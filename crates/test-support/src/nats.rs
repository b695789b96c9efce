//! One nats-server for all the tests of a process, each test on streams of its own.
//!
//! A test needs JetStream, not a server to itself: every stream, consumer and subject
//! the service makes starts with its `nats.prefix`, so tests that each take a fresh
//! [`unique_prefix`] never see one another's messages. Starting a server costs a
//! process, a store directory and a wait for its port; paying that once per process
//! instead of once per test is what this module is for.
//!
//! [`shared_url`] is the server the variable `ROLLOUT_TEST_NATS_URL` names when it is
//! set (the test command starts one for its whole run, so test runners that start a
//! process per test share it too), else one started on first use and kept until the
//! process exits. A test that takes servers away (a cluster losing a member) or must
//! listen where a network namespace can reach starts its own instead.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rollout_core::natsd::NatsServer;

/// The variable that names a running server the tests share.
pub const URL_VARIABLE: &str = "ROLLOUT_TEST_NATS_URL";

/// The client URL of the nats-server this process's tests share (see the module).
/// Panics, saying why, when none can be started: every test that asks needs one.
pub fn shared_url() -> String {
    if let Ok(url) = std::env::var(URL_VARIABLE)
        && !url.is_empty()
    {
        return url;
    }
    static SHARED: OnceLock<Result<String, String>> = OnceLock::new();
    match SHARED.get_or_init(start_for_this_process) {
        Ok(url) => url.clone(),
        Err(why) => panic!("{why}"),
    }
}

/// A stream and subject prefix no other test uses: letters and digits only, short,
/// and starting with a letter, as `nats.prefix` must.
pub fn unique_prefix() -> String {
    format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// Starts this process's server on a thread that lives until the process exits: the
/// server is asked to die with the thread that started it (a killed test process must
/// not leave it running), and a test's own thread ends with the test.
fn start_for_this_process() -> Result<String, String> {
    let dir = store_dir();
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("shared-nats-server".into())
        .spawn(move || {
            match NatsServer::start(&dir, "127.0.0.1:0".parse().expect("an address")) {
                Ok(server) => {
                    let _ = tx.send(Ok(server.url()));
                    // Holding `server` here keeps it (and this thread) for the process.
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(format!(
                        "cannot start the tests' nats-server in {}: {e}",
                        dir.display()
                    )));
                }
            }
        });
    if let Err(e) = spawned {
        return Err(format!(
            "cannot start a thread for the tests' nats-server: {e}"
        ));
    }
    rx.recv()
        .map_err(|_| "the tests' nats-server thread ended without an answer".to_string())?
}

/// The server's store: a directory named for this process under the temporary root,
/// after removing those of processes that are gone (a server's store is not removed
/// when its process exits, since nothing runs then).
fn store_dir() -> PathBuf {
    let root = std::env::temp_dir();
    remove_stale_stores(&root);
    root.join(format!("rollout-test-nats-{}", std::process::id()))
}

/// Removes the `rollout-test-nats-PID` directories under `root` whose process has
/// ended. Best effort: what cannot be removed is left.
fn remove_stale_stores(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("rollout-test-nats-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_differ_and_are_letters_and_digits() {
        let (a, b) = (unique_prefix(), unique_prefix());
        assert_ne!(a, b);
        for p in [a, b] {
            assert!(p.starts_with('t') && p.chars().all(|c| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn stores_of_ended_processes_are_removed_and_live_ones_kept() {
        let root = tempfile::tempdir().unwrap();
        let live = root
            .path()
            .join(format!("rollout-test-nats-{}", std::process::id()));
        // No process has this id: Linux's pid_max is at most 2^22.
        let gone = root.path().join("rollout-test-nats-99999999");
        let other = root.path().join("rollout-test-nats-x");
        for d in [&live, &gone, &other] {
            std::fs::create_dir(d).unwrap();
        }
        remove_stale_stores(root.path());
        assert!(live.exists() && other.exists());
        assert!(!gone.exists());
    }
}
