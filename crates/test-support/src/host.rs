//! Small facts about the test machine that tests starting real programs need: a free
//! port, where a program is installed, and a temporary directory sandboxes can reach.

use std::path::PathBuf;

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local address")
        .port()
}

/// Where `program` is installed: on PATH, or in the sbin directories a non-login PATH
/// may lack (daemons such as `slurmd` and `munged` live there).
pub fn which(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A temporary directory others may enter (mode 755; `tempdir` makes it 700): sandboxes
/// run as their own user and must reach their workspaces below it.
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("make the temp dir reachable");
    dir
}
