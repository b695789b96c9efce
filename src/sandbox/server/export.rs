//! The `export`, `baseline` and `apply` tools: what the agent changed in the workspace,
//! and putting those changes into a fresh sandbox.
//!
//! For a git repository an export is a binary-safe `git diff` against the baseline, new
//! untracked (not ignored) files included. It is computed on a copy of the index, so the
//! agent's own staging is left alone. For a plain directory the server snapshots sizes and
//! modification times and returns every added, modified or deleted file with its content.
//!
//! The baseline starts as the state the server saw at start and is moved by `baseline`,
//! which the worker calls once the task's setup commands have run: what setup produced is
//! the task's, not the agent's. An export larger than its cap is an error, never a
//! silently shortened export.
//!
//! `apply` runs in EVAL's fresh sandbox, as the sandbox's own user, before any of the
//! agent's code could run there: it applies an export, then puts back every protected
//! path the export touched (whatever the check's globs name) from the baseline and writes
//! the check's own files, so an episode cannot pass its check by editing the tests.

use crate::sandbox::protocol::{
    ApplyArgs, ApplyResult, BaselineResult, ChangedFile, DEFAULT_MAX_EXPORT_BYTES, ErrorCode,
    ExportArgs, ExportResult, MAX_EXPORT_BYTES, ToolError,
};
use base64::Engine;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A snapshot stops after this many files (a plain directory that big wants git).
const MAX_SNAPSHOT_FILES: usize = 100_000;
/// `git` calls longer than this fail the export.
const GIT_TIMEOUT: Duration = Duration::from_secs(120);

type Snapshot = BTreeMap<PathBuf, (u64, SystemTime)>;

/// What the workspace looked like at the baseline.
#[derive(Clone)]
pub enum Baseline {
    /// A repository: the commit or tree exports are relative to.
    Git(String),
    /// A plain directory with these files.
    Files(Snapshot),
}

/// The tool.
pub struct Exporter {
    workdir: PathBuf,
    ctl_dir: PathBuf,
    baseline: Mutex<Baseline>,
}

fn failed(message: impl Into<String>) -> ToolError {
    ToolError {
        code: ErrorCode::ToolFailed,
        message: message.into(),
    }
}

fn too_large(message: impl Into<String>) -> ToolError {
    ToolError {
        code: ErrorCode::TooLarge,
        message: message.into(),
    }
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
            baseline: Mutex::new(baseline),
        }
    }

    fn current(&self) -> Baseline {
        self.baseline.lock().expect("baseline lock").clone()
    }

    /// Stages the whole working tree (tracked and untracked, not ignored) in a private
    /// copy of the index, so the agent's own staging is left alone, and runs `git args`
    /// against that index; returns its output.
    async fn staged(&self, args: &[&str]) -> Result<Vec<u8>, ToolError> {
        let index = self
            .ctl_dir
            .join(format!("index-{}", uuid::Uuid::new_v4().simple()));
        let env = self.private_index(&index).await?;
        let env = [("GIT_INDEX_FILE", env.as_os_str())];
        let out = match git(&self.workdir, &env, &["add", "-A"]).await {
            Ok(_) => git(&self.workdir, &env, args).await,
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&index);
        out.map_err(failed)
    }

    /// Writes the working tree as a tree object; returns its id.
    async fn write_tree(&self) -> Result<String, ToolError> {
        let tree = self.staged(&["write-tree"]).await?;
        Ok(String::from_utf8_lossy(&tree).trim().to_string())
    }

    /// Copies the repository's index to `index` (so `add -A` there leaves the agent's
    /// staging alone) and returns its path.
    async fn private_index(&self, index: &Path) -> Result<PathBuf, ToolError> {
        let real = git(&self.workdir, &[], &["rev-parse", "--git-path", "index"])
            .await
            .map(|s| self.workdir.join(String::from_utf8_lossy(&s).trim()))
            .map_err(failed)?;
        let _ = std::fs::remove_file(index);
        if real.exists() {
            std::fs::copy(&real, index)
                .map_err(|e| failed(format!("cannot copy the index: {e}")))?;
        }
        Ok(index.to_path_buf())
    }

    /// Makes the workspace as it is now the baseline of later exports and applies.
    pub async fn baseline(&self) -> Result<BaselineResult, ToolError> {
        let current = self.current();
        let (next, result) = match current {
            Baseline::Git(_) => {
                let tree = self.write_tree().await?;
                (
                    Baseline::Git(tree.clone()),
                    BaselineResult {
                        tree: Some(tree),
                        files: None,
                    },
                )
            }
            Baseline::Files(_) => {
                let snap = snapshot(&self.workdir);
                let n = snap.len();
                (
                    Baseline::Files(snap),
                    BaselineResult {
                        tree: None,
                        files: Some(n),
                    },
                )
            }
        };
        *self.baseline.lock().expect("baseline lock") = next;
        Ok(result)
    }

    /// Computes the export.
    pub async fn run(&self, args: &ExportArgs) -> Result<ExportResult, ToolError> {
        let max = args
            .max_bytes
            .unwrap_or(DEFAULT_MAX_EXPORT_BYTES)
            .min(MAX_EXPORT_BYTES);
        match (self.current(), &args.base) {
            (Baseline::Git(head), base) => {
                let base = base.clone().unwrap_or(head);
                let diff = self
                    .staged(&["diff", "--cached", "--binary", &base])
                    .await?;
                if diff.len() > max {
                    return Err(too_large(format!(
                        "the workspace's changes are a {} byte diff, over the export limit of {max} bytes",
                        diff.len()
                    )));
                }
                Ok(ExportResult::GitDiff {
                    base,
                    diff: String::from_utf8_lossy(&diff).into_owned(),
                })
            }
            (Baseline::Files(_), Some(_)) => Err(failed(
                "base applies to git workspaces; this workspace is not a repository.",
            )),
            (Baseline::Files(before), None) => {
                let now = snapshot(&self.workdir);
                let mut files = Vec::new();
                let mut total = 0usize;
                for (path, meta) in &now {
                    let status = match before.get(path) {
                        None => "added",
                        Some(old) if old != meta => "modified",
                        Some(_) => continue,
                    };
                    total = total.saturating_add(usize::try_from(meta.0).unwrap_or(usize::MAX));
                    if total > max {
                        return Err(too_large(format!(
                            "the changed files hold more than the export limit of {max} bytes (at {})",
                            path.display()
                        )));
                    }
                    files.push(self.changed(path, status)?);
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

    fn changed(&self, rel: &Path, status: &str) -> Result<ChangedFile, ToolError> {
        let bytes = std::fs::read(self.workdir.join(rel))
            .map_err(|e| failed(format!("cannot read {}: {e}", rel.display())))?;
        let mut f = ChangedFile {
            path: rel.to_string_lossy().into_owned(),
            status: status.into(),
            text: None,
            base64: None,
        };
        match String::from_utf8(bytes) {
            Ok(t) => f.text = Some(t),
            Err(e) => {
                f.base64 = Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()))
            }
        }
        Ok(f)
    }

    /// Applies `args.changes`, then puts back what is protected (see the module docs).
    pub async fn apply(&self, args: &ApplyArgs) -> Result<ApplyResult, ToolError> {
        let protect = Protect::new(&args.protect, args.files.keys())?;
        let mut result = match (self.current(), &args.changes) {
            (Baseline::Git(base), ExportResult::GitDiff { diff, .. }) => {
                self.apply_diff(&base, diff, &protect).await?
            }
            (_, ExportResult::Files { files }) => self.apply_files(files, &protect)?,
            (Baseline::Files(_), ExportResult::GitDiff { .. }) => {
                return Err(failed(
                    "the changes are a git diff, but this workspace is not a repository (the task's sandbox spec differs between RUN and EVAL?)",
                ));
            }
        };
        for (path, content) in &args.files {
            write_fresh(&self.workdir, path, content.as_bytes())?;
            result.restored.push(path.clone());
        }
        result.restored.sort();
        result.restored.dedup();
        Ok(result)
    }

    async fn apply_diff(
        &self,
        base: &str,
        diff: &str,
        protect: &Protect,
    ) -> Result<ApplyResult, ToolError> {
        let mut result = ApplyResult::default();
        if diff.trim().is_empty() {
            return Ok(result);
        }
        let patch = self.ctl_dir.join("apply.patch");
        std::fs::write(&patch, diff).map_err(|e| failed(format!("cannot write the patch: {e}")))?;
        let applied = git(
            &self.workdir,
            &[],
            &[
                "apply",
                "--binary",
                "--whitespace=nowarn",
                &patch.to_string_lossy(),
            ],
        )
        .await;
        let _ = std::fs::remove_file(&patch);
        applied.map_err(|e| failed(format!("the changes do not apply: {e}")))?;
        // What changed, against the baseline, as git sees the working tree now.
        let names = self
            .staged(&[
                "diff",
                "--cached",
                "--name-only",
                "-z",
                "--no-renames",
                base,
            ])
            .await?;
        result.changed = split_z(&names);
        let in_base: BTreeSet<String> = split_z(
            &git(
                &self.workdir,
                &[],
                &["ls-tree", "-r", "--name-only", "-z", base],
            )
            .await
            .map_err(failed)?,
        )
        .into_iter()
        .collect();
        let guarded: Vec<&String> = in_base.iter().filter(|p| protect.matches(p)).collect();
        let mut back = Vec::new();
        for path in &result.changed {
            let replaced_dir = guarded.iter().any(|g| {
                g.starts_with(path.as_str()) && g.as_bytes().get(path.len()) == Some(&b'/')
            });
            if protect.matches(path) || replaced_dir {
                back.push(path.clone());
            }
        }
        // A protected file may also sit under a directory the changes replaced (by a
        // file or a symlink): that directory's path is what changed, and it goes back too.
        for path in &back {
            remove_any(&inside(&self.workdir, path)?)?;
        }
        let restore: Vec<&String> = back
            .iter()
            .filter(|p| {
                in_base.contains(*p) || in_base.iter().any(|b| b.starts_with(&format!("{p}/")))
            })
            .collect();
        for chunk in restore.chunks(200) {
            let mut a: Vec<String> = vec![
                "restore".into(),
                format!("--source={base}"),
                "--worktree".into(),
                "--".into(),
            ];
            a.extend(chunk.iter().map(|p| format!(":(literal){p}")));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            git(&self.workdir, &[], &a)
                .await
                .map_err(|e| failed(format!("cannot restore protected files: {e}")))?;
        }
        result.restored = back;
        Ok(result)
    }

    fn apply_files(
        &self,
        files: &[ChangedFile],
        protect: &Protect,
    ) -> Result<ApplyResult, ToolError> {
        let mut result = ApplyResult::default();
        for f in files {
            inside(&self.workdir, &f.path)?;
            result.changed.push(f.path.clone());
            if protect.matches(&f.path) {
                result.restored.push(f.path.clone());
                continue;
            }
            if f.status == "deleted" {
                remove_any(&self.workdir.join(&f.path))?;
                continue;
            }
            let bytes = match (&f.text, &f.base64) {
                (Some(t), _) => t.clone().into_bytes(),
                (None, Some(b)) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| failed(format!("bad base64 for {}: {e}", f.path)))?,
                (None, None) => {
                    return Err(failed(format!("{} was exported without content", f.path)));
                }
            };
            write_fresh(&self.workdir, &f.path, &bytes)?;
        }
        result.changed.sort();
        Ok(result)
    }
}

/// The protected paths of an `apply`: globs plus the task's own files.
struct Protect {
    globs: globset::GlobSet,
    exact: BTreeSet<String>,
}

impl Protect {
    fn new<'a>(
        patterns: &[String],
        exact: impl Iterator<Item = &'a String>,
    ) -> Result<Self, ToolError> {
        let mut b = globset::GlobSetBuilder::new();
        for p in patterns {
            let glob = globset::GlobBuilder::new(p.trim_start_matches("./"))
                .literal_separator(true)
                .build()
                .map_err(|e| failed(format!("protect pattern `{p}`: {e}")))?;
            b.add(glob);
        }
        Ok(Protect {
            globs: b
                .build()
                .map_err(|e| failed(format!("protect patterns: {e}")))?,
            exact: exact.cloned().collect(),
        })
    }

    fn matches(&self, path: &str) -> bool {
        self.exact.contains(path) || self.globs.is_match(path)
    }
}

/// Checks that `pattern` is a protect glob `apply` accepts, so a task can be refused at
/// submit rather than in EVAL.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `rel` under `root`, refusing paths that leave it.
fn inside(root: &Path, rel: &str) -> Result<PathBuf, ToolError> {
    if crate::sandbox::spec::is_relative_inside(rel) {
        Ok(root.join(rel))
    } else {
        Err(failed(format!("path `{rel}` leaves the workspace")))
    }
}

/// Removes whatever is at `path` (file, symlink or directory tree), never following a
/// symlink; quiet if nothing is there.
fn remove_any(path: &Path) -> Result<(), ToolError> {
    let r = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    r.map_err(|e| failed(format!("cannot remove {}: {e}", path.display())))
}

/// Writes `bytes` as a new regular file at `rel` under `root`: whatever was there goes
/// first, and every directory on the way is a real directory (a symlink or file in the
/// way is replaced), so the write lands exactly where the path says.
fn write_fresh(root: &Path, rel: &str, bytes: &[u8]) -> Result<(), ToolError> {
    let target = inside(root, rel)?;
    let mut dir = root.to_path_buf();
    let parts: Vec<_> = Path::new(rel).components().collect();
    for c in &parts[..parts.len().saturating_sub(1)] {
        dir.push(c);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => remove_any(&dir)?,
            Err(_) => {}
        }
        std::fs::create_dir(&dir)
            .map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
    }
    remove_any(&target)?;
    std::fs::write(&target, bytes)
        .map_err(|e| failed(format!("cannot write {}: {e}", target.display())))
}

fn split_z(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
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
            // Not followed: a symlink is neither walked into nor exported.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protect_globs_stay_within_segments_unless_doubled() {
        let p = Protect::new(
            &["tests/**".into(), "*.cfg".into()],
            [String::from("check.py")].iter(),
        )
        .unwrap();
        assert!(p.matches("tests/test_a.py"));
        assert!(p.matches("tests/deep/x.py"));
        assert!(p.matches("setup.cfg"));
        assert!(!p.matches("pkg/setup.cfg"));
        assert!(p.matches("check.py"));
        assert!(!p.matches("src/check.py"));
        assert!(!p.matches("tests"));
    }

    #[test]
    fn fresh_writes_replace_symlinks_on_the_way() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("tests")).unwrap();
        write_fresh(root.path(), "tests/test_a.py", b"assert True\n").unwrap();
        assert!(
            std::fs::symlink_metadata(root.path().join("tests"))
                .unwrap()
                .is_dir()
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert!(inside(root.path(), "../x").is_err());
    }
}
