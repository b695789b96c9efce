//! The `file` tool: view, create, `str_replace`, insert and undo, with the semantics of
//! the `str_replace_editor` tool that SWE-style agents are trained on.
//!
//! Edits keep a per-file history in memory so `undo_edit` can restore the content from
//! before the last edit (or remove a file the tool created). Errors say exactly what was
//! wrong and where: a `str_replace` whose text occurs several times lists the lines of
//! every occurrence, so the agent can add context instead of guessing.

use super::output::{CappedOutput, DEFAULT_MAX_OUTPUT};
use crate::protocol::{FileArgs, FileResult};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Lines shown around an edit in the confirmation snippet.
const SNIPPET_CONTEXT: usize = 4;
/// The largest file the tool reads or edits; bigger ones are for `bash` (`head`, `sed`).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The tool's state: the undo history of each edited file.
pub struct FileTool {
    workdir: PathBuf,
    history: Mutex<HashMap<PathBuf, Vec<Option<Vec<u8>>>>>,
}

impl FileTool {
    /// A tool resolving relative paths against `workdir`.
    pub fn new(workdir: PathBuf) -> Self {
        FileTool {
            workdir,
            history: Mutex::new(HashMap::new()),
        }
    }

    /// Runs one command; `Err` is a message for the agent.
    pub fn run(&self, args: &FileArgs) -> Result<FileResult, String> {
        let output = match args {
            FileArgs::View { path, view_range } => self.view(&self.resolve(path), *view_range)?,
            FileArgs::Create { path, file_text } => {
                let p = self.resolve(path);
                if p.is_dir() {
                    return Err(format!("{} is a directory; give a file path.", p.display()));
                }
                let before = read_regular(&p).ok();
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                }
                write_regular(&p, file_text.as_bytes())?;
                self.remember(&p, before);
                format!("File created successfully at: {}", p.display())
            }
            FileArgs::StrReplace {
                path,
                old_str,
                new_str,
            } => self.str_replace(&self.resolve(path), old_str, new_str)?,
            FileArgs::Insert {
                path,
                insert_line,
                new_str,
            } => self.insert(&self.resolve(path), *insert_line, new_str)?,
            FileArgs::UndoEdit { path } => self.undo(&self.resolve(path))?,
        };
        Ok(FileResult { output })
    }

    fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workdir.join(p)
        }
    }

    fn remember(&self, path: &Path, before: Option<Vec<u8>>) {
        self.history
            .lock()
            .expect("history lock")
            .entry(path.to_path_buf())
            .or_default()
            .push(before);
    }

    fn view(&self, path: &Path, range: Option<[i64; 2]>) -> Result<String, String> {
        let meta =
            std::fs::metadata(path).map_err(|e| format!("cannot view {}: {e}", path.display()))?;
        if meta.is_dir() {
            if range.is_some() {
                return Err("view_range applies to files, not directories.".into());
            }
            let mut out = CappedOutput::new(DEFAULT_MAX_OUTPUT);
            out.push(
                format!(
                    "Files and directories up to 2 levels deep in {}, excluding hidden items:\n",
                    path.display()
                )
                .as_bytes(),
            );
            list_dir(path, 0, &mut out);
            return Ok(out.finish().0);
        }
        let text = read_text(path)?;
        let lines: Vec<&str> = text.lines().collect();
        let n = i64::try_from(lines.len()).unwrap_or(i64::MAX);
        let (first, last) = match range {
            None => (1, n),
            Some([first, last]) => {
                if first < 1 || first > n.max(1) {
                    return Err(format!(
                        "view_range starts at line {first}, but {} has {n} lines; the first line is 1.",
                        path.display()
                    ));
                }
                let last = if last == -1 { n } else { last };
                if last < first || last > n {
                    return Err(format!(
                        "view_range ends at line {last}, which must be between {first} and {n} (or -1 for the last line)."
                    ));
                }
                (first, last)
            }
        };
        let mut out = CappedOutput::new(DEFAULT_MAX_OUTPUT);
        out.push(format!("Here is {} with line numbers:\n", path.display()).as_bytes());
        for (i, line) in lines
            .iter()
            .enumerate()
            .skip(usize::try_from(first - 1).unwrap_or(0))
            .take(usize::try_from(last - first + 1).unwrap_or(0))
        {
            out.push(format!("{:6}\t{line}\n", i + 1).as_bytes());
        }
        Ok(out.finish().0)
    }

    fn str_replace(&self, path: &Path, old: &str, new: &str) -> Result<String, String> {
        if old.is_empty() {
            return Err("old_str is empty; give the exact text to replace.".into());
        }
        let text = read_text(path)?;
        let at: Vec<usize> = text.match_indices(old).map(|(i, _)| i).collect();
        match at.len() {
            0 => Err(format!(
                "No replacement was made: old_str did not appear verbatim in {}. Check whitespace and indentation, or view the file first.",
                path.display()
            )),
            1 => {
                let updated = format!("{}{new}{}", &text[..at[0]], &text[at[0] + old.len()..]);
                write_regular(path, updated.as_bytes())?;
                self.remember(path, Some(text.clone().into_bytes()));
                let line = line_of(&text, at[0]);
                let shown = new.lines().count().max(1);
                Ok(format!(
                    "The file {} has been edited. Here is the result around the change:\n{}Review the change and edit again if it is not what you wanted.",
                    path.display(),
                    snippet(&updated, line, line + shown - 1)
                ))
            }
            k => {
                let lines: Vec<String> =
                    at.iter().map(|&i| line_of(&text, i).to_string()).collect();
                Err(format!(
                    "No replacement was made: old_str appears {k} times in {}, at lines {}. Include more surrounding lines so it matches exactly once.",
                    path.display(),
                    lines.join(", ")
                ))
            }
        }
    }

    fn insert(&self, path: &Path, after: usize, new: &str) -> Result<String, String> {
        let text = read_text(path)?;
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        if after > lines.len() {
            return Err(format!(
                "insert_line {after} is past the end: {} has {} lines, so insert_line must be between 0 and {}.",
                path.display(),
                lines.len(),
                lines.len()
            ));
        }
        let mut updated = String::with_capacity(text.len() + new.len() + 1);
        for l in &lines[..after] {
            updated.push_str(l);
        }
        if !updated.is_empty() && !updated.ends_with('\n') {
            updated.push('\n');
        }
        updated.push_str(new);
        if !new.ends_with('\n') && after < lines.len() {
            updated.push('\n');
        }
        for l in &lines[after..] {
            updated.push_str(l);
        }
        write_regular(path, updated.as_bytes())?;
        self.remember(path, Some(text.into_bytes()));
        let shown = new.lines().count().max(1);
        Ok(format!(
            "The file {} has been edited. Here is the result around the insertion:\n{}Review the change and edit again if it is not what you wanted.",
            path.display(),
            snippet(&updated, after + 1, after + shown)
        ))
    }

    fn undo(&self, path: &Path) -> Result<String, String> {
        let previous = self
            .history
            .lock()
            .expect("history lock")
            .get_mut(path)
            .and_then(Vec::pop);
        match previous {
            None => Err(format!("No edit to undo for {}.", path.display())),
            Some(None) => {
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                Ok(format!(
                    "Undid the creation of {}: the file is removed.",
                    path.display()
                ))
            }
            Some(Some(content)) => {
                write_regular(path, &content)?;
                Ok(format!(
                    "Last edit to {} undone. Its content is now:\n{}",
                    path.display(),
                    snippet(&String::from_utf8_lossy(&content), 1, usize::MAX)
                ))
            }
        }
    }
}

/// Opens `path` without ever blocking (a FIFO with no writer, a device) and only if it
/// is a regular file of a size the tool handles.
fn open_regular(path: &Path, write: bool) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "{} is not a regular file (a pipe, socket or device); the file tool only handles regular files, use bash for the rest.",
            path.display()
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{} is {} bytes, more than the file tool handles ({MAX_FILE_BYTES}); use bash (head, tail, sed -n, grep) for it.",
            path.display(),
            meta.len()
        ));
    }
    Ok(file)
}

/// The bytes of the regular file at `path` (see [`open_regular`]).
fn read_regular(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut file = open_regular(path, false)?;
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(bytes)
}

/// Replaces the content of the regular file at `path`, or creates it; never opens
/// anything else there (a FIFO would block the tool, a device would swallow the text).
fn write_regular(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?,
        _ => open_regular(path, true)?,
    };
    file.set_len(0)
        .and_then(|_| file.write_all(bytes))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn read_text(path: &Path) -> Result<String, String> {
    let bytes = read_regular(path)?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{} is not UTF-8 text ({} bytes); use the bash tool to inspect it.",
            path.display(),
            e.as_bytes().len()
        )
    })
}

/// The 1-based line number of byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Lines `first..=last` (1-based) with some context, numbered, capped.
fn snippet(text: &str, first: usize, last: usize) -> String {
    let from = first.saturating_sub(SNIPPET_CONTEXT).max(1);
    let to = last.saturating_add(SNIPPET_CONTEXT);
    let mut out = CappedOutput::new(DEFAULT_MAX_OUTPUT / 2);
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if n >= from && n <= to {
            out.push(format!("{n:6}\t{line}\n").as_bytes());
        }
    }
    out.finish().0
}

fn list_dir(dir: &Path, depth: usize, out: &mut CappedOutput) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        out.push(format!("{}{}\n", path.display(), if is_dir { "/" } else { "" }).as_bytes());
        if is_dir && depth < 1 {
            list_dir(&path, depth + 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool() -> (tempfile::TempDir, FileTool) {
        let dir = tempfile::tempdir().unwrap();
        let t = FileTool::new(dir.path().to_path_buf());
        (dir, t)
    }

    fn run(t: &FileTool, v: serde_json::Value) -> Result<String, String> {
        t.run(&serde_json::from_value(v).unwrap()).map(|r| r.output)
    }

    #[test]
    fn create_replace_insert_undo() {
        let (dir, t) = tool();
        run(&t, serde_json::json!({"command": "create", "path": "a/b.py", "file_text": "x = 1\ny = 2\n"})).unwrap();
        let out = run(&t, serde_json::json!({"command": "str_replace", "path": "a/b.py", "old_str": "y = 2", "new_str": "y = 3"})).unwrap();
        assert!(out.contains("     2\ty = 3"), "{out}");
        run(&t, serde_json::json!({"command": "insert", "path": "a/b.py", "insert_line": 1, "new_str": "z = 0"})).unwrap();
        let path = dir.path().join("a/b.py");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "x = 1\nz = 0\ny = 3\n"
        );
        run(
            &t,
            serde_json::json!({"command": "undo_edit", "path": "a/b.py"}),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x = 1\ny = 3\n");
        run(
            &t,
            serde_json::json!({"command": "undo_edit", "path": "a/b.py"}),
        )
        .unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x = 1\ny = 2\n");
        run(
            &t,
            serde_json::json!({"command": "undo_edit", "path": "a/b.py"}),
        )
        .unwrap();
        assert!(!path.exists());
        let err = run(
            &t,
            serde_json::json!({"command": "undo_edit", "path": "a/b.py"}),
        )
        .unwrap_err();
        assert!(err.starts_with("No edit to undo"), "{err}");
    }

    #[test]
    fn replace_needs_exactly_one_match() {
        let (_dir, t) = tool();
        run(
            &t,
            serde_json::json!({"command": "create", "path": "f", "file_text": "a\nb\na\n"}),
        )
        .unwrap();
        let err = run(&t, serde_json::json!({"command": "str_replace", "path": "f", "old_str": "a", "new_str": "c"})).unwrap_err();
        assert!(
            err.contains("appears 2 times") && err.contains("lines 1, 3"),
            "{err}"
        );
        let err = run(&t, serde_json::json!({"command": "str_replace", "path": "f", "old_str": "zz", "new_str": "c"})).unwrap_err();
        assert!(err.contains("did not appear verbatim"), "{err}");
    }

    #[test]
    fn pipes_and_devices_are_refused_without_blocking() {
        let (dir, t) = tool();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for v in [
            serde_json::json!({"command": "view", "path": "fifo"}),
            serde_json::json!({"command": "create", "path": "fifo", "file_text": "x"}),
            serde_json::json!({"command": "str_replace", "path": "fifo", "old_str": "a", "new_str": "b"}),
            serde_json::json!({"command": "insert", "path": "fifo", "insert_line": 0, "new_str": "b"}),
            serde_json::json!({"command": "view", "path": "/dev/zero"}),
        ] {
            let err = run(&t, v.clone()).unwrap_err();
            assert!(
                err.contains("not a regular file") || err.contains("cannot open"),
                "{v}: {err}"
            );
        }
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let err = run(&t, serde_json::json!({"command": "view", "path": "big"})).unwrap_err();
        assert!(err.contains("more than the file tool handles"), "{err}");
    }

    #[test]
    fn view_ranges_and_directories() {
        let (_dir, t) = tool();
        run(
            &t,
            serde_json::json!({"command": "create", "path": "d/e/f.txt", "file_text": "1\n2\n3\n"}),
        )
        .unwrap();
        run(
            &t,
            serde_json::json!({"command": "create", "path": "d/e/g/deep.txt", "file_text": ""}),
        )
        .unwrap();
        let out = run(
            &t,
            serde_json::json!({"command": "view", "path": "d/e/f.txt", "view_range": [2, -1]}),
        )
        .unwrap();
        assert!(
            out.contains("     2\t2\n     3\t3\n") && !out.contains("     1\t"),
            "{out}"
        );
        let err = run(
            &t,
            serde_json::json!({"command": "view", "path": "d/e/f.txt", "view_range": [2, 9]}),
        )
        .unwrap_err();
        assert!(err.contains("between 2 and 3"), "{err}");
        let out = run(&t, serde_json::json!({"command": "view", "path": "d"})).unwrap();
        assert!(
            out.contains("/d/e/\n") && out.contains("/d/e/f.txt\n") && !out.contains("deep.txt"),
            "{out}"
        );
    }
}
