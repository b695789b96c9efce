//! Where a node's sandboxes live, settled when a worker starts rather than at its first
//! sandbox: every sandbox's socket is `<root>/<sandbox>/…/sock`, and Unix sockets take
//! paths of at most [`SOCKET_PATH_LIMIT`] bytes. A root set in `sandbox.root` is used as
//! it is, and one too long for the longest socket stops the worker with what to do. The
//! default, `<state_dir>/sb`, is used when it fits; when it does not (a state directory
//! under a long per-job `$TMPDIR`, say), the node uses a short directory of the worker's
//! user instead, `/tmp/rollout-<uid>/<hash of the default>` (or under `/dev/shm`), and
//! says so. The hash keeps it apart from other workers' (another state directory) and
//! the same across restarts of this one (the reaper finds what a crash left).
//!
//! No scheduler's per-job clean-up reaches such a directory, so each holds a note of the
//! default it stands in for ([`DEFAULT_NOTE`]), and a worker settling its own removes
//! those of state directories that are gone (their jobs ended), when nothing is mounted
//! in them.

use std::path::{Path, PathBuf};

use super::node::EVAL_INFIX;
use super::{SOCKET_PATH_LIMIT, SandboxError};
use crate::config::Settings;

/// The longest job id: the gateway's are UUIDs in their 36-byte text form.
const JOB_ID_BYTES: usize = 36;
/// Digits set aside for an EVAL sandbox's generation (the job's count of stage starts,
/// tens at most in practice). A job started a thousand times or more under a root this
/// check only just passed meets [`super::check_socket_path`] at its sandbox's start.
const GENERATION_DIGITS: usize = 3;
/// Where a short root is made when the default is too long, in order.
const SHORT_BASES: &[&str] = &["/tmp", "/dev/shm"];
/// The file in a short root naming the default root it stands in for.
pub const DEFAULT_NOTE: &str = ".default-root";

/// The longest socket path a sandbox under `root` has: an EVAL sandbox's directory
/// (`<job id>-eval-<generation>`) with Apptainer's socket in it.
pub fn longest_socket(root: &Path) -> PathBuf {
    let name = format!(
        "{}{EVAL_INFIX}{}",
        "0".repeat(JOB_ID_BYTES),
        "9".repeat(GENERATION_DIGITS)
    );
    super::label::longest_socket_in(&root.join(name))
}

/// The longest sandbox root whose sockets all fit, in bytes.
pub fn max_root_len() -> usize {
    let longest = longest_socket(Path::new("/")).as_os_str().len();
    // `/` stands for the root; the separator after a root of n bytes is one more.
    SOCKET_PATH_LIMIT.saturating_sub(longest)
}

/// Where the node's sandboxes go, and why there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootChoice {
    /// `sandbox.root` as configured, or the default, which fits.
    AsConfigured(PathBuf),
    /// A short directory instead of the default, which is too long.
    Short {
        /// The short root.
        root: PathBuf,
        /// The default it replaces.
        default: PathBuf,
    },
}

impl RootChoice {
    /// The root chosen.
    pub fn root(&self) -> &Path {
        match self {
            RootChoice::AsConfigured(root) | RootChoice::Short { root, .. } => root,
        }
    }
}

/// Settles where the sandboxes of a worker with `settings` go (see the module's
/// documentation): when the default is too long, makes a short root under `/tmp` or
/// `/dev/shm` and writes it into `settings.sandbox.root`, so everything made from the
/// settings uses it. Fails, saying what to set, when the configured root is too long or
/// no short root could be made.
pub fn settle(settings: &mut Settings) -> Result<RootChoice, SandboxError> {
    let bases: Vec<&Path> = SHORT_BASES.iter().map(Path::new).collect();
    settle_in(settings, &bases)
}

/// [`settle`] with short roots made under the first of `bases` that takes one.
pub fn settle_in(settings: &mut Settings, bases: &[&Path]) -> Result<RootChoice, SandboxError> {
    let choice = choose(settings, bases)?;
    if let RootChoice::Short { root, default } = &choice {
        tracing::warn!(
            root = %root.display(),
            default = %default.display(),
            limit = SOCKET_PATH_LIMIT,
            "the default sandbox root would make sandbox socket paths longer than Unix sockets allow; sandboxes go to a short directory of this user's instead (set sandbox.root to choose one)"
        );
        prepare_short(root, default, &settings.state_dir).map_err(|e| {
            SandboxError::Config(format!(
                "cannot prepare the short sandbox root {}: {e}; set sandbox.root (ROLLOUT__SANDBOX__ROOT) to a directory of at most {} bytes",
                root.display(),
                max_root_len()
            ))
        })?;
        if let Some(holder) = root.parent() {
            sweep(holder, root);
        }
        settings.sandbox.root = root.clone();
    }
    Ok(choice)
}

/// Makes the short `root` with its note of `default`, and the state directory the note
/// is judged by (its being gone is what lets a later worker remove the root).
fn prepare_short(root: &Path, default: &Path, state_dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    super::sandboxes_root(root)?;
    let note = root.join(DEFAULT_NOTE);
    let tmp = root.join(format!("{DEFAULT_NOTE}.{}", std::process::id()));
    std::fs::write(&tmp, default.as_os_str().as_encoded_bytes())?;
    std::fs::rename(&tmp, &note)
}

/// Removes the short roots in `holder` (but `keep`) whose default's state directory is
/// gone and under which nothing is mounted: what the workers of ended jobs left there.
/// One without a note is left alone.
fn sweep(holder: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(holder) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if dir == keep || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(note) = std::fs::read(dir.join(DEFAULT_NOTE)) else {
            continue;
        };
        let default = PathBuf::from(String::from_utf8_lossy(&note).into_owned());
        let Some(state_dir) = default.parent() else {
            continue;
        };
        if state_dir.exists() || super::quota::mounted_under(&dir) {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(
                root = %dir.display(),
                default = %default.display(),
                "removed the short sandbox root of a state directory that is gone"
            ),
            Err(e) => tracing::warn!(
                root = %dir.display(),
                error = %e,
                "cannot remove the short sandbox root of a state directory that is gone"
            ),
        }
    }
}

/// [`settle`]'s decision, with a short root made under the first of `bases` that takes
/// one.
pub fn choose(settings: &Settings, bases: &[&Path]) -> Result<RootChoice, SandboxError> {
    let root = settings.sandbox_root();
    let longest = longest_socket(&root);
    let len = longest.as_os_str().len();
    if len <= SOCKET_PATH_LIMIT {
        return Ok(RootChoice::AsConfigured(root));
    }
    let max = max_root_len();
    if !settings.sandbox.root.as_os_str().is_empty() {
        return Err(SandboxError::Config(format!(
            "sandbox.root {} is {} bytes long: a sandbox's socket under it would be {len} bytes, over the {SOCKET_PATH_LIMIT}-byte limit of Unix sockets; set sandbox.root (ROLLOUT__SANDBOX__ROOT) to a directory of at most {max} bytes, or unset it to have a short one chosen",
            root.display(),
            root.as_os_str().len()
        )));
    }
    let name = short_name(&root);
    let uid = nix::unistd::geteuid().as_raw();
    let mut tried = Vec::new();
    for base in bases {
        let holder = base.join(format!("rollout-{uid}"));
        let short = holder.join(&name);
        if short.as_os_str().len() > max {
            tried.push(format!("{} (too long)", short.display()));
            continue;
        }
        match super::owned_dir(&holder) {
            Ok(()) => {
                return Ok(RootChoice::Short {
                    root: short,
                    default: root,
                });
            }
            Err(e) => tried.push(format!("{}: {e}", holder.display())),
        }
    }
    Err(SandboxError::Config(format!(
        "the default sandbox root {} (under state_dir) is {} bytes long: a sandbox's socket under it would be {len} bytes, over the {SOCKET_PATH_LIMIT}-byte limit of Unix sockets, and no short directory could be made instead ({}); set sandbox.root (ROLLOUT__SANDBOX__ROOT) to a directory of at most {max} bytes, or a shorter state_dir",
        root.display(),
        root.as_os_str().len(),
        tried.join("; ")
    )))
}

/// The name of the short root standing in for `default`: 12 hex digits of its FNV-1a
/// hash, the same for the same default (a worker restarted on the same state directory
/// finds its sandboxes again) and apart for another.
fn short_name(default: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in default.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")[..12].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short directory to stand in for `/tmp` (the test machine's `$TMPDIR` may be
    /// long, the very case under test).
    fn short_base() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("r")
            .rand_bytes(5)
            .tempdir_in("/tmp")
            .unwrap()
    }

    /// A state directory as the worker script makes it under a long per-job `$TMPDIR`
    /// below `base`.
    fn long_state_dir(base: &Path) -> PathBuf {
        base.join("slurm-job-tmpdir-".repeat(4))
            .join("rollout-node042-1234567_12")
    }

    fn with_state_dir(state_dir: PathBuf) -> Settings {
        Settings {
            state_dir,
            ..Settings::default()
        }
    }

    fn holder(base: &Path) -> PathBuf {
        base.join(format!("rollout-{}", nix::unistd::geteuid().as_raw()))
    }

    #[test]
    fn a_default_root_that_fits_is_used_as_it_is() {
        let base = short_base();
        let mut s = with_state_dir(base.path().join("st"));
        let choice = settle_in(&mut s, &[base.path()]).unwrap();
        assert_eq!(choice, RootChoice::AsConfigured(base.path().join("st/sb")));
        assert!(
            s.sandbox.root.as_os_str().is_empty(),
            "the settings are left alone"
        );
        assert!(
            !holder(base.path()).exists(),
            "nothing made for a short root"
        );
        assert!(longest_socket(choice.root()).as_os_str().len() <= SOCKET_PATH_LIMIT);
        assert_eq!(
            max_root_len(),
            45,
            "the README and rollout.example.toml say 45"
        );
    }

    /// A state directory under a long per-job `$TMPDIR`: the default root would put
    /// sockets over the limit, so a short root of this user's is made and written into
    /// the settings; the same one again for the same state directory, another for
    /// another.
    #[test]
    fn a_long_default_root_gives_way_to_a_short_one() {
        let (base, scratch) = (short_base(), tempfile::tempdir().unwrap());
        let mut s = with_state_dir(long_state_dir(scratch.path()));
        assert!(longest_socket(&s.sandbox_root()).as_os_str().len() > SOCKET_PATH_LIMIT);
        let choice = settle_in(&mut s, &[base.path()]).unwrap();
        let RootChoice::Short { root, default } = &choice else {
            panic!("{choice:?}");
        };
        assert_eq!(default, &s.state_dir.join("sb"));
        assert_eq!(root.parent(), Some(holder(base.path()).as_path()));
        assert!(longest_socket(root).as_os_str().len() <= SOCKET_PATH_LIMIT);
        // The holder and the root are this user's and private (0711 for root, whose
        // sandboxes' users pass through).
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        for dir in [holder(base.path()), root.clone()] {
            let meta = std::fs::symlink_metadata(&dir).unwrap();
            assert!(meta.is_dir(), "{}", dir.display());
            assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
            assert_eq!(meta.permissions().mode() & 0o066, 0, "{}", dir.display());
        }
        assert_eq!(
            std::fs::read(root.join(DEFAULT_NOTE)).unwrap(),
            default.as_os_str().as_encoded_bytes()
        );
        // Written into the settings: everything made from them uses it.
        assert_eq!(&s.sandbox_root(), root);
        // The same state directory, the same root (a restarted worker finds its
        // sandboxes); another, another.
        let mut again = with_state_dir(s.state_dir.clone());
        assert_eq!(settle_in(&mut again, &[base.path()]).unwrap(), choice);
        let other = with_state_dir(long_state_dir(&scratch.path().join("other")));
        assert_ne!(choose(&other, &[base.path()]).unwrap().root(), root);
    }

    /// A `sandbox.root` set too long is the operator's to fix: refused with the
    /// setting, the lengths and the limit, and nothing made.
    #[test]
    fn a_configured_root_too_long_is_refused_naming_the_setting() {
        let base = short_base();
        let mut s = Settings::default();
        s.sandbox.root = long_state_dir(Path::new("/scratch")).join("sb");
        let e = settle_in(&mut s, &[base.path()]).unwrap_err().to_string();
        for word in [
            "sandbox.root",
            "ROLLOUT__SANDBOX__ROOT",
            "100-byte limit",
            &format!("at most {} bytes", max_root_len()),
            &format!("{} bytes long", s.sandbox.root.as_os_str().len()),
        ] {
            assert!(e.contains(word), "`{word}` missing from: {e}");
        }
        assert!(!holder(base.path()).exists());
        // One that fits is used as it is.
        s.sandbox.root = base.path().join("sb");
        assert_eq!(
            settle_in(&mut s, &[base.path()]).unwrap(),
            RootChoice::AsConfigured(base.path().join("sb"))
        );
    }

    /// Someone else's link where the short root's holder goes is not followed: the next
    /// place is tried, and with none left the worker refuses to start, saying why.
    #[test]
    fn a_planted_link_is_passed_over_and_no_place_left_is_an_error() {
        let (planted, good, elsewhere) = (short_base(), short_base(), short_base());
        std::os::unix::fs::symlink(elsewhere.path(), holder(planted.path())).unwrap();
        let s = with_state_dir(long_state_dir(Path::new("/scratch")));
        let choice = choose(&s, &[planted.path(), good.path()]).unwrap();
        assert!(choice.root().starts_with(good.path()), "{choice:?}");
        let e = choose(&s, &[planted.path()]).unwrap_err().to_string();
        assert!(
            e.contains("not a directory") && e.contains("sandbox.root"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    /// What the workers of ended jobs left (their state directories gone) is removed
    /// when a worker settles its own short root; a live one's, and one without a note,
    /// stay.
    #[test]
    fn short_roots_of_state_directories_that_are_gone_are_removed() {
        let (base, scratch) = (short_base(), tempfile::tempdir().unwrap());
        let mut ended = with_state_dir(long_state_dir(&scratch.path().join("ended")));
        let ended_root = settle_in(&mut ended, &[base.path()]).unwrap();
        std::fs::create_dir_all(ended_root.root().join(".tools")).unwrap();
        let mut live = with_state_dir(long_state_dir(&scratch.path().join("live")));
        let live_root = settle_in(&mut live, &[base.path()]).unwrap();
        let unknown = holder(base.path()).join("0123456789ab");
        std::fs::create_dir(&unknown).unwrap();
        // The ended job's scratch goes (Slurm removes a per-job $TMPDIR).
        std::fs::remove_dir_all(scratch.path().join("ended")).unwrap();

        let mut next = with_state_dir(long_state_dir(&scratch.path().join("next")));
        settle_in(&mut next, &[base.path()]).unwrap();
        assert!(
            !ended_root.root().exists(),
            "the ended job's root is removed"
        );
        assert!(live_root.root().is_dir(), "a live worker's root stays");
        assert!(unknown.is_dir(), "a root without a note stays");
    }
}
