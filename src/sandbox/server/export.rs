//! The `export` tool: what the agent changed in the workspace.
//!
//! For a git repository the answer is a binary-safe `git diff` against the commit the
//! server saw at start, new untracked (not ignored) files included. It is computed on a
//! copy of the index, so the agent's own staging is left alone. For a plain directory the
//! server snapshots sizes and modification times at start and returns every added,
//! modified or deleted file with its content.

use crate::sandbox::protocol::{ChangedFile, ExportArgs, ExportResult};
use base64::Engine;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Files larger than this are listed without content.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// A snapshot stops after this many files (a plain directory that big wants git).
const MAX_SNAPSHOT_FILES: usize = 100_000;
/// `git` calls longer than this fail the export.
const GIT_TIMEOUT: Duration = Duration::from_secs(120);

type Snapshot = BTreeMap<PathBuf, (u64, SystemTime)>;

/// What the workspace looked like when the server started.
pub enum Baseline {
    /// A repository at this commit.
    Git(String),
    /// A plain directory with these files.
    Files(Snapshot),
}

/// The tool.
pub struct Exporter {
    workdir: PathBuf,
    ctl_dir: PathBuf,
    baseline: Baseline,
}

impl Exporter {
    /// Records the baseline of `workdir`.
    pub async fn start(workdir: PathBuf, ctl_dir: PathBuf) -> Self {
        let head = git(&workdir, &[], &["rev-parse", "--verify", "HEAD"])
            .await
            .ok()
            .map(|s| String::from_utf8_lossy(&s).trim().to_string());
        let baseline = match head {
            Some(h) if !h.is_empty() => Baseline::Git(h),
            _ => Baseline::Files(snapshot(&workdir)),
        };
        Exporter {
            workdir,
            ctl_dir,
            baseline,
        }
    }

    /// Computes the export; `Err` is a message for the caller.
    pub async fn run(&self, args: &ExportArgs) -> Result<ExportResult, String> {
        match (&self.baseline, &args.base) {
            (Baseline::Git(head), base) => {
                let base = base.clone().unwrap_or_else(|| head.clone());
                let index = self.ctl_dir.join("export-index");
                let real = git(&self.workdir, &[], &["rev-parse", "--git-path", "index"])
                    .await
                    .map(|s| self.workdir.join(String::from_utf8_lossy(&s).trim()))?;
                let _ = std::fs::remove_file(&index);
                if real.exists() {
                    std::fs::copy(&real, &index)
                        .map_err(|e| format!("cannot copy the index: {e}"))?;
                }
                let env = [("GIT_INDEX_FILE", index.as_os_str())];
                git(&self.workdir, &env, &["add", "-A"]).await?;
                let diff = git(
                    &self.workdir,
                    &env,
                    &["diff", "--cached", "--binary", &base],
                )
                .await?;
                let _ = std::fs::remove_file(&index);
                Ok(ExportResult::GitDiff {
                    base,
                    diff: String::from_utf8_lossy(&diff).into_owned(),
                })
            }
            (Baseline::Files(_), Some(_)) => {
                Err("base applies to git workspaces; this workspace is not a repository.".into())
            }
            (Baseline::Files(before), None) => {
                let now = snapshot(&self.workdir);
                let mut files = Vec::new();
                for (path, meta) in &now {
                    let status = match before.get(path) {
                        None => "added",
                        Some(old) if old != meta => "modified",
                        Some(_) => continue,
                    };
                    files.push(self.changed(path, status, meta.0));
                }
                for path in before.keys().filter(|p| !now.contains_key(*p)) {
                    files.push(ChangedFile {
                        path: path.to_string_lossy().into_owned(),
                        status: "deleted".into(),
                        text: None,
                        base64: None,
                    });
                }
                files.sort_by(|a, b| a.path.cmp(&b.path));
                Ok(ExportResult::Files { files })
            }
        }
    }

    fn changed(&self, rel: &Path, status: &str, size: u64) -> ChangedFile {
        let mut f = ChangedFile {
            path: rel.to_string_lossy().into_owned(),
            status: status.into(),
            text: None,
            base64: None,
        };
        if size <= MAX_FILE_BYTES
            && let Ok(bytes) = std::fs::read(self.workdir.join(rel))
        {
            match String::from_utf8(bytes) {
                Ok(t) => f.text = Some(t),
                Err(e) => {
                    f.base64 = Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()))
                }
            }
        }
        f
    }
}

/// Runs `git -C dir args`, returning stdout or a message with its stderr.
async fn git(
    dir: &Path,
    env: &[(&str, &std::ffi::OsStr)],
    args: &[&str],
) -> Result<Vec<u8>, String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("-C").arg(dir).args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(GIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("git {} took longer than {GIT_TIMEOUT:?}", args.join(" ")))?
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

fn snapshot(root: &Path) -> Snapshot {
    let mut files = Snapshot::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                if files.len() >= MAX_SNAPSHOT_FILES {
                    return files;
                }
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap_or(&e.path())
                    .to_path_buf();
                files.insert(
                    rel,
                    (
                        meta.len(),
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    ),
                );
            }
        }
    }
    files
}
