//! The `/etc` a bwrap sandbox sees: the entries programs commonly need, copied once into
//! a directory of the node's and bound as the sandbox's whole `/etc` in one mount.
//!
//! Binding each entry on its own cost a mount apiece: 23 `--ro-bind-try`s made bare
//! bwrap take 24 ms instead of 16 ms on a loaded 2-core machine, the largest part of a
//! sandbox's start left after the launcher pool. One read-only bind of a prepared
//! directory costs what one mount costs, and the sandbox sees the same entries with the
//! same contents and modes (an entry the worker cannot read, such as a private key
//! directory, is left out rather than copied where others could read it).
//!
//! The copy is a snapshot. Its directory is named by a hash of what it holds
//! (`<root>/.etc-<hash>`), so workers that see the same `/etc` share one, and a worker
//! started after `/etc` changed makes a new one; a change to `/etc` reaches sandboxes
//! when their worker restarts. Older copies are left in place: another worker may
//! still be binding its own.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

/// `/etc` entries programs commonly need; secrets such as `shadow` are not among them.
pub const ETC: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
    "protocols",
    "services",
    "gitconfig",
    "bash.bashrc",
    "profile",
    "inputrc",
    "python3",
    "python3.11",
    "pip.conf",
];

/// The views made by this process, by sandbox root (`None`: it could not be made, and
/// sandboxes bind the entries one by one).
static VIEWS: LazyLock<Mutex<HashMap<PathBuf, Option<PathBuf>>>> = LazyLock::new(Default::default);

/// One entry of the view.
enum Entry {
    Dir(u32),
    File(u32, Vec<u8>),
    Link(PathBuf),
}

/// The view of `source` (the host's `/etc`) under `root`, made on first use; `None`
/// when it cannot be made (the reason is logged once), so the caller binds the entries
/// one by one as before.
pub fn view(root: &Path, source: &Path) -> Option<PathBuf> {
    let mut views = VIEWS.lock().expect("etc views lock");
    if let Some(v) = views.get(root) {
        return v.clone();
    }
    let made = make(root, source)
        .inspect_err(|e| {
            tracing::warn!(root = %root.display(), error = %e, "cannot prepare the sandboxes' /etc; binding its entries one by one")
        })
        .ok();
    views.insert(root.to_path_buf(), made.clone());
    made
}

/// Reads the entries, then writes them under `root` unless a view of the same
/// contents is there already.
fn make(root: &Path, source: &Path) -> std::io::Result<PathBuf> {
    let mut entries: Vec<(PathBuf, Entry)> = Vec::new();
    for name in ETC {
        collect(source, Path::new(name), &mut entries);
    }
    // A networked sandbox's own `resolv.conf` is bound over this one: the read-only
    // view must already hold the mount point.
    if !entries.iter().any(|(p, _)| p == Path::new("resolv.conf")) {
        entries.push(("resolv.conf".into(), Entry::File(0o644, Vec::new())));
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for (rel, e) in &entries {
        rel.hash(&mut hasher);
        match e {
            Entry::Dir(mode) => (0u8, mode).hash(&mut hasher),
            Entry::File(mode, data) => (1u8, mode, data).hash(&mut hasher),
            Entry::Link(target) => (2u8, target).hash(&mut hasher),
        }
    }
    let dir = root.join(format!(".etc-{:016x}", hasher.finish()));
    if dir.is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(root)?;
    let tmp = root.join(format!(".etc-tmp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    let written = write(&tmp, &entries);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another worker made the same view first.
        if !dir.is_dir() {
            return Err(e);
        }
    }
    Ok(dir)
}

/// Adds `source/rel` (and, for a directory, everything in it) to `entries`; what the
/// worker cannot read is left out.
fn collect(source: &Path, rel: &Path, entries: &mut Vec<(PathBuf, Entry)>) {
    let path = source.join(rel);
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return;
    };
    let mode = meta.permissions().mode() & 0o7777;
    if meta.file_type().is_symlink() {
        if let Ok(target) = std::fs::read_link(&path) {
            entries.push((rel.to_path_buf(), Entry::Link(target)));
        }
    } else if meta.is_dir() {
        let Ok(read) = std::fs::read_dir(&path) else {
            return;
        };
        entries.push((rel.to_path_buf(), Entry::Dir(mode)));
        let mut names: Vec<_> = read.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            collect(source, &rel.join(name), entries);
        }
    } else if meta.is_file()
        && let Ok(data) = std::fs::read(&path)
    {
        entries.push((rel.to_path_buf(), Entry::File(mode, data)));
    }
}

/// Writes `entries` under `dir`, each with its mode (directories last, so a read-only
/// one is filled first).
fn write(dir: &Path, entries: &[(PathBuf, Entry)]) -> std::io::Result<()> {
    for (rel, e) in entries {
        let path = dir.join(rel);
        match e {
            Entry::Dir(_) => std::fs::create_dir_all(&path)?,
            Entry::File(mode, data) => {
                std::fs::write(&path, data)?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
            }
            Entry::Link(target) => std::os::unix::fs::symlink(target, &path)?,
        }
    }
    for (rel, e) in entries.iter().rev() {
        if let Entry::Dir(mode) = e {
            std::fs::set_permissions(dir.join(rel), std::fs::Permissions::from_mode(*mode))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_holds_the_listed_entries_as_they_are_and_nothing_else() {
        let src = tempfile::tempdir().unwrap();
        let s = src.path();
        std::fs::write(s.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::write(s.join("shadow"), "secret").unwrap();
        std::fs::create_dir_all(s.join("ssl/certs")).unwrap();
        std::fs::write(s.join("ssl/certs/a.pem"), "cert").unwrap();
        std::os::unix::fs::symlink("/usr/share/zoneinfo/UTC", s.join("localtime")).unwrap();
        std::fs::set_permissions(s.join("passwd"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let root = tempfile::tempdir().unwrap();
        let v = make(root.path(), s).unwrap();
        assert_eq!(
            std::fs::read_to_string(v.join("passwd")).unwrap(),
            "root:x:0:0::/root:/bin/sh\n"
        );
        assert_eq!(
            std::fs::metadata(v.join("passwd"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o644
        );
        assert_eq!(
            std::fs::read_to_string(v.join("ssl/certs/a.pem")).unwrap(),
            "cert"
        );
        assert_eq!(
            std::fs::read_link(v.join("localtime")).unwrap(),
            Path::new("/usr/share/zoneinfo/UTC")
        );
        assert!(!v.join("shadow").exists(), "only the listed entries");
        // The same contents give the same view; changed ones a new one.
        assert_eq!(make(root.path(), s).unwrap(), v);
        std::fs::write(s.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        let w = make(root.path(), s).unwrap();
        assert_ne!(w, v);
        assert!(w.join("hosts").exists());
    }
}
