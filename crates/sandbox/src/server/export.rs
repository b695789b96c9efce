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
//!
//! Compiled Python bytecode (`__pycache__/`, `*.pyc`, `*.pyo`) never travels: Python
//! loads an unchecked-hash `.pyc` without looking at its source, and a sourceless
//! `.pyc` in place of a module, so bytecode would let an episode replace a protected or
//! hidden file's code. Exports leave it out (even if the agent added it to git's
//! index), `apply` refuses to write it, and then removes every bytecode file left in
//! the workspace, so EVAL's Python compiles what it runs from the sources it sees.

use crate::protocol::{
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
/// Git pathspecs of compiled Python bytecode, which never travels (see the module docs).
const BYTECODE_PATHSPECS: [&str; 3] = [
    ":(glob)**/__pycache__/**",
    ":(glob)**/*.pyc",
    ":(glob)**/*.pyo",
];
/// `git apply --exclude` patterns of the same (these match across `/`).
const BYTECODE_EXCLUDES: [&str; 3] = [
    "--exclude=*__pycache__/*",
    "--exclude=*.pyc",
    "--exclude=*.pyo",
];

/// Whether `path` (relative, `/`-separated) is compiled Python bytecode.
pub fn is_bytecode(path: &str) -> bool {
    path.ends_with(".pyc")
        || path.ends_with(".pyo")
        || path.split('/').any(|segment| segment == "__pycache__")
}

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
    /// The `git` program (a test names one that cannot start).
    git: PathBuf,
    workdir: PathBuf,
    ctl_dir: PathBuf,
    /// `Err` when `git` could not be run to tell which kind the workspace is (it could
    /// not start, or hung): exports and applies then fail as the server's own error,
    /// never as a plain-directory export of a repository, which EVAL could not apply
    /// and would score 0.
    baseline: Mutex<Result<Baseline, String>>,
}

fn failed(message: impl Into<String>) -> ToolError {
    ToolError {
        code: ErrorCode::ToolFailed,
        message: message.into(),
    }
}

/// The tool could not do its work for a reason of the machine's, not the agent's
/// (`git` could not start or hung): the caller retries rather than scoring the episode.
fn internal(message: impl Into<String>) -> ToolError {
    ToolError {
        code: ErrorCode::Internal,
        message: message.into(),
    }
}

/// Prefixes an error's message with what was being done, keeping its code.
fn context(what: &str) -> impl FnOnce(ToolError) -> ToolError + '_ {
    move |mut e| {
        e.message = format!("{what}: {}", e.message);
        e
    }
}

fn too_large(message: impl Into<String>) -> ToolError {
    ToolError {
        code: ErrorCode::TooLarge,
        message: message.into(),
    }
}

impl Exporter {
    /// Records the baseline of `workdir`: its `HEAD` if it is a repository with one,
    /// else a snapshot of its files. A `git` that cannot run is tried again a few times
    /// (a machine under load can refuse a fork for a moment), then recorded as
    /// unknown.
    pub async fn start(workdir: PathBuf, ctl_dir: PathBuf) -> Self {
        Self::start_with_git(PathBuf::from("git"), workdir, ctl_dir).await
    }

    /// [`Exporter::start`] with `git` as the git program.
    pub async fn start_with_git(git_program: PathBuf, workdir: PathBuf, ctl_dir: PathBuf) -> Self {
        if !could_be_repository(&workdir) {
            // What git would say after a process start: not a repository.
            let files = snapshot(&workdir);
            return Exporter {
                git: git_program,
                workdir,
                ctl_dir,
                baseline: Mutex::new(Ok(Baseline::Files(files))),
            };
        }
        let mut head = Err(internal("not tried"));
        for attempt in 0..4u64 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            head = git(
                &git_program,
                &workdir,
                &[],
                &["rev-parse", "--verify", "HEAD"],
            )
            .await;
            if !matches!(&head, Err(e) if e.code == ErrorCode::Internal) {
                break;
            }
        }
        let baseline = match head {
            Ok(h) if !String::from_utf8_lossy(&h).trim().is_empty() => Ok(Baseline::Git(
                String::from_utf8_lossy(&h).trim().to_string(),
            )),
            Err(e) if e.code == ErrorCode::Internal => Err(e.message),
            _ => Ok(Baseline::Files(snapshot(&workdir))),
        };
        Exporter {
            git: git_program,
            workdir,
            ctl_dir,
            baseline: Mutex::new(baseline),
        }
    }

    /// The baseline, or the server's error when it could not be told.
    fn current(&self) -> Result<Baseline, ToolError> {
        self.baseline
            .lock()
            .expect("baseline lock")
            .clone()
            .map_err(|why| {
                internal(format!(
                    "whether the workspace is a repository could not be told when the sandbox started: {why}"
                ))
            })
    }

    /// Stages the whole working tree (tracked and untracked, not ignored) in a private
    /// copy of the index, so the agent's own staging is left alone, with bytecode as
    /// the baseline has it, and runs `git args` against that index; returns its output.
    async fn staged(&self, args: &[&str]) -> Result<Vec<u8>, ToolError> {
        let base = match self.current()? {
            Baseline::Git(base) => base,
            Baseline::Files(_) => String::new(),
        };
        let index = self
            .ctl_dir
            .join(format!("index-{}", uuid::Uuid::new_v4().simple()));
        let env = self.private_index(&index).await?;
        let env = [("GIT_INDEX_FILE", env.as_os_str())];
        let mut reset = vec!["reset", "-q", base.as_str(), "--"];
        reset.extend(BYTECODE_PATHSPECS);
        let out = match git(&self.git, &self.workdir, &env, &["add", "-A"]).await {
            Ok(_) if base.is_empty() => git(&self.git, &self.workdir, &env, args).await,
            Ok(_) => match git(&self.git, &self.workdir, &env, &reset).await {
                Ok(_) => git(&self.git, &self.workdir, &env, args).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&index);
        out
    }

    /// Writes the working tree as a tree object; returns its id.
    async fn write_tree(&self) -> Result<String, ToolError> {
        let tree = self.staged(&["write-tree"]).await?;
        Ok(String::from_utf8_lossy(&tree).trim().to_string())
    }

    /// Copies the repository's index to `index` (so `add -A` there leaves the agent's
    /// staging alone) and returns its path.
    async fn private_index(&self, index: &Path) -> Result<PathBuf, ToolError> {
        let real = git(
            &self.git,
            &self.workdir,
            &[],
            &["rev-parse", "--git-path", "index"],
        )
        .await
        .map(|s| self.workdir.join(String::from_utf8_lossy(&s).trim()))?;
        let _ = std::fs::remove_file(index);
        if real.exists() {
            std::fs::copy(&real, index)
                .map_err(|e| internal(format!("cannot copy the index: {e}")))?;
        }
        Ok(index.to_path_buf())
    }

    /// Makes the workspace as it is now the baseline of later exports and applies.
    pub async fn baseline(&self) -> Result<BaselineResult, ToolError> {
        let (next, result) = match self.current()? {
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
        *self.baseline.lock().expect("baseline lock") = Ok(next);
        Ok(result)
    }

    /// Computes the export.
    pub async fn run(&self, args: &ExportArgs) -> Result<ExportResult, ToolError> {
        let max = args
            .max_bytes
            .unwrap_or(DEFAULT_MAX_EXPORT_BYTES)
            .min(MAX_EXPORT_BYTES);
        match (self.current()?, &args.base) {
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
                    if is_bytecode(&path.to_string_lossy()) {
                        continue;
                    }
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
                let gone = before
                    .keys()
                    .filter(|p| !now.contains_key(*p) && !is_bytecode(&p.to_string_lossy()));
                for path in gone {
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
        let mut result = match (self.current()?, &args.changes) {
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
        result.removed_bytecode = remove_bytecode(&self.workdir);
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
        std::fs::write(&patch, diff)
            .map_err(|e| internal(format!("cannot write the patch: {e}")))?;
        let patch_arg = patch.to_string_lossy();
        let mut apply = vec!["apply", "--binary", "--whitespace=nowarn"];
        apply.extend(BYTECODE_EXCLUDES);
        apply.push(&patch_arg);
        let applied = git(&self.git, &self.workdir, &[], &apply).await;
        let _ = std::fs::remove_file(&patch);
        applied.map_err(context("the changes do not apply"))?;
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
                &self.git,
                &self.workdir,
                &[],
                &["ls-tree", "-r", "--name-only", "-z", base],
            )
            .await?,
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
            git(&self.git, &self.workdir, &[], &a)
                .await
                .map_err(context("cannot restore protected files"))?;
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
        for f in files.iter().filter(|f| !is_bytecode(&f.path)) {
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
    if crate::spec::is_relative_inside(rel) {
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

/// Removes every compiled-bytecode file and `__pycache__` directory under `root`
/// (`.git` aside), never following symlinks; returns how many it removed.
fn remove_bytecode(root: &Path) -> usize {
    let mut removed = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let Ok(kind) = e.file_type() else { continue };
            let path = e.path();
            if kind.is_dir() && name == "__pycache__" {
                removed += usize::from(std::fs::remove_dir_all(&path).is_ok());
            } else if kind.is_dir() && !(dir == root && name == ".git") {
                stack.push(path);
            } else if !kind.is_dir() && is_bytecode(&name) {
                removed += usize::from(std::fs::remove_file(&path).is_ok());
            }
        }
    }
    removed
}

fn split_z(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// Runs `git -C dir args`, returning stdout. A `git` that exits non-zero is the tool
/// refusing ([`ErrorCode::ToolFailed`], with its stderr); one that cannot start or hangs
/// is the machine's problem ([`ErrorCode::Internal`]), which callers retry instead of
/// blaming the agent's changes.
async fn git(
    program: &Path,
    dir: &Path,
    env: &[(&str, &std::ffi::OsStr)],
    args: &[&str],
) -> Result<Vec<u8>, ToolError> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg("-C").arg(dir).args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(GIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| {
            internal(format!(
                "git {} took longer than {GIT_TIMEOUT:?}",
                args.join(" ")
            ))
        })?
        .map_err(|e| internal(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(failed(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

/// Whether git could take `workdir` for (part of) a repository: a `.git` (directory or
/// file) or a `HEAD` (a bare repository) in it or in a directory above it, or a `GIT_*`
/// variable in the environment (`GIT_DIR` and the like) that points git elsewhere.
/// Where none is, asking git (a process, at every sandbox's start) can only answer
/// "not a repository".
fn could_be_repository(workdir: &Path) -> bool {
    if !workdir.is_absolute()
        || std::env::vars_os().any(|(k, _)| k.as_encoded_bytes().starts_with(b"GIT_"))
    {
        return true;
    }
    // Anything but "no such file" (a directory that cannot be searched, say) counts as
    // a maybe.
    let maybe = |p: PathBuf| !matches!(p.symlink_metadata(), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    workdir
        .ancestors()
        .any(|d| maybe(d.join(".git")) || maybe(d.join("HEAD")))
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

    /// A repository with one commit of `a.txt`, and a control directory.
    fn repo() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let ctl = dir.path().join("ctl");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&ctl).unwrap();
        std::fs::write(ws.join("a.txt"), "one\n").unwrap();
        for args in [
            &["init", "-q"][..],
            &["add", "-A"],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "a",
            ],
        ] {
            let ok = std::process::Command::new("git")
                .arg("-C")
                .arg(&ws)
                .args(args)
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        }
        (dir, ws, ctl)
    }

    /// When git cannot start (a fork refused under load), the repository is not
    /// mistaken for a plain directory: export, baseline and apply fail as the
    /// machine's error, which the worker retries, never as the agent's.
    #[tokio::test]
    async fn a_git_that_cannot_start_is_the_machines_error_not_a_plain_directory() {
        let (_dir, ws, ctl) = repo();
        let broken = Exporter::start_with_git("/nonexistent/git".into(), ws.clone(), ctl).await;
        std::fs::write(ws.join("a.txt"), "two\n").unwrap();
        let e = broken.run(&ExportArgs::default()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal, "{}", e.message);
        assert!(e.message.contains("cannot run git"), "{}", e.message);
        assert_eq!(
            broken.baseline().await.unwrap_err().code,
            ErrorCode::Internal
        );
        let apply = ApplyArgs {
            changes: ExportResult::Files { files: Vec::new() },
            protect: Vec::new(),
            files: BTreeMap::new(),
        };
        assert_eq!(
            broken.apply(&apply).await.unwrap_err().code,
            ErrorCode::Internal
        );
    }

    /// Bytecode never travels: not in an export (even added to the agent's index), not
    /// written by an apply, and whatever bytecode the workspace held is gone after it.
    #[tokio::test]
    async fn bytecode_is_neither_exported_nor_applied_nor_left_behind() {
        let (_dir, ws, ctl) = repo();
        let ex = Exporter::start(ws.clone(), ctl).await;
        std::fs::create_dir_all(ws.join("pkg/__pycache__")).unwrap();
        std::fs::write(ws.join("pkg/__pycache__/m.cpython-311.pyc"), b"\x00forged").unwrap();
        std::fs::write(ws.join("sourceless.pyc"), b"\x00forged").unwrap();
        std::fs::write(ws.join("a.txt"), "two\n").unwrap();
        let added = std::process::Command::new("git")
            .arg("-C")
            .arg(&ws)
            .args(["add", "-f", "-A"])
            .status()
            .unwrap();
        assert!(added.success());
        let ExportResult::GitDiff { diff, .. } = ex.run(&ExportArgs::default()).await.unwrap()
        else {
            panic!("a repository exports a diff")
        };
        assert!(diff.contains("a.txt"), "{diff}");
        assert!(!diff.contains("pyc"), "{diff}");

        // A diff made elsewhere that carries bytecode: applied without it.
        let (_dir2, ws2, ctl2) = repo();
        std::fs::write(ws2.join("stale.pyc"), b"old").unwrap();
        let fresh = Exporter::start(ws2.clone(), ctl2).await;
        let mut with_pyc = diff.clone();
        with_pyc.push_str("diff --git a/evil.pyc b/evil.pyc\nnew file mode 100644\n--- /dev/null\n+++ b/evil.pyc\n@@ -0,0 +1 @@\n+x\n");
        let files = ExportResult::Files {
            files: vec![ChangedFile {
                path: "x/__pycache__/y.pyc".into(),
                status: "added".into(),
                text: Some("x".into()),
                base64: None,
            }],
        };
        let r = fresh
            .apply(&ApplyArgs {
                changes: ExportResult::GitDiff {
                    base: "HEAD".into(),
                    diff: with_pyc,
                },
                protect: Vec::new(),
                files: BTreeMap::new(),
            })
            .await
            .unwrap();
        assert_eq!(r.changed, ["a.txt"]);
        assert_eq!(r.removed_bytecode, 1, "the stale .pyc");
        assert!(!ws2.join("evil.pyc").exists() && !ws2.join("stale.pyc").exists());
        assert_eq!(std::fs::read_to_string(ws2.join("a.txt")).unwrap(), "two\n");
        let (_dir3, ws3, ctl3) = repo();
        let r = Exporter::start(ws3.clone(), ctl3)
            .await
            .apply(&ApplyArgs {
                changes: files,
                protect: Vec::new(),
                files: BTreeMap::new(),
            })
            .await
            .unwrap();
        assert!(r.changed.is_empty() && !ws3.join("x").exists(), "{r:?}");
    }

    /// A git that runs and refuses (a diff that does not apply) is the tool failing.
    #[tokio::test]
    async fn a_diff_that_does_not_apply_is_the_tool_failing() {
        let (_dir, ws, ctl) = repo();
        let ex = Exporter::start(ws, ctl).await;
        let apply = ApplyArgs {
            changes: ExportResult::GitDiff {
                base: "HEAD".into(),
                diff: "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-zero\n+two\n".into(),
            },
            protect: Vec::new(),
            files: BTreeMap::new(),
        };
        let e = ex.apply(&apply).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ToolFailed, "{}", e.message);
        assert!(
            e.message.starts_with("the changes do not apply: git apply"),
            "{}",
            e.message
        );
    }
}
