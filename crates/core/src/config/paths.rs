//! What the settings leave to discovery: the sandbox directory and server binary, the
//! database URL's default, and URLs made fit for logs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Settings;

impl Settings {
    /// Where sandbox directories live, resolved to an absolute path.
    pub fn sandbox_root(&self) -> PathBuf {
        let root = if self.sandbox.root.as_os_str().is_empty() {
            self.state_dir.join("sb")
        } else {
            self.sandbox.root.clone()
        };
        std::path::absolute(&root).unwrap_or(root)
    }

    /// The sandbox server binary, resolved: the configured one, or `rollout-sandbox`
    /// beside the running executable.
    pub fn sandbox_server_bin(&self) -> PathBuf {
        if !self.sandbox.server_bin.as_os_str().is_empty() {
            return std::path::absolute(&self.sandbox.server_bin)
                .unwrap_or_else(|_| self.sandbox.server_bin.clone());
        }
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        // Test and bench executables live one level down, in `deps/`.
        for d in [
            dir.clone(),
            dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        ] {
            let candidate = d.join("rollout-sandbox");
            if candidate.is_file() {
                return candidate;
            }
        }
        dir.join("rollout-sandbox")
    }

    /// The database URL, with the empty default resolved to a SQLite file under the
    /// state directory.
    pub fn database_url(&self) -> String {
        if self.database.url.is_empty() {
            format!("sqlite://{}", self.state_dir.join("rollout.db").display())
        } else {
            self.database.url.clone()
        }
    }

    /// The ack-wait as a [`Duration`].
    pub fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.queue.ack_wait_ms)
    }
}

/// Hides the password of a URL (a database's, NATS's) for logs and errors. A list of
/// URLs separated by commas (a NATS cluster's) has each one's password hidden.
pub fn redact_url(url: &str) -> String {
    if url.contains(',') {
        return url.split(',').map(redact_one).collect::<Vec<_>>().join(",");
    }
    redact_one(url)
}

/// [`redact_url`] of a single URL.
fn redact_one(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}://{}:***{}", &url[..s], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}
