//! Task files (JSON Lines) as the commands read them: every task keeps the file and
//! line it came from, so a task the gateway refuses is named by its line in the file,
//! not by its 0-based place in a request (`tasks[41]`) the user never wrote.

use std::path::PathBuf;

use anyhow::Context;
use rollout::client::ClientError;
use rollout::domain::Task;

/// Tasks read from one or more files, with where each came from.
#[derive(Debug, Default)]
pub struct TaskFiles {
    /// The tasks, in file order.
    pub tasks: Vec<Task>,
    /// `origins[i]` is the file and 1-based line of `tasks[i]`.
    origins: Vec<(PathBuf, usize)>,
}

impl TaskFiles {
    /// Reads `paths` in order (blank lines and `#` comments skipped); a line that is
    /// not a task is named with its file, line and the field at fault.
    pub fn load(paths: &[PathBuf]) -> anyhow::Result<Self> {
        let mut out = TaskFiles::default();
        for path in paths {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let lines = rollout::client::read_task_lines(&text).map_err(|(line, e)| {
                anyhow::anyhow!("{}:{line}: not a task: {e}", path.display())
            })?;
            anyhow::ensure!(!lines.is_empty(), "{} holds no tasks", path.display());
            for (line, task) in lines {
                out.tasks.push(task);
                out.origins.push((path.clone(), line));
            }
        }
        Ok(out)
    }

    /// Where task `index` came from, as `file:line`.
    fn origin(&self, index: usize) -> Option<String> {
        let (path, line) = self.origins.get(index)?;
        Some(format!("{}:{line}", path.display()))
    }

    /// `err`, from submitting the tasks from `offset` on, as the user should read it: a
    /// refusal naming `tasks[i]…` (or `prompts[i]…`) says the file and line of that task
    /// and the field inside it.
    pub fn explain(&self, offset: usize, err: ClientError) -> anyhow::Error {
        if let ClientError::Api {
            field: Some(field),
            message,
            ..
        } = &err
            && let Some((index, rest)) = task_index(field)
            && let Some(origin) = self.origin(offset + index)
        {
            let at = rest.trim_start_matches('.');
            return if at.is_empty() {
                anyhow::anyhow!("{origin}: the gateway refused this task: {message}")
            } else {
                anyhow::anyhow!("{origin}: the gateway refused this task at `{at}`: {message}")
            };
        }
        anyhow::Error::new(err)
    }
}

/// `tasks[12].spec.x` → `(12, ".spec.x")`; also for `prompts[…]` (a sampling batch).
fn task_index(field: &str) -> Option<(usize, &str)> {
    let rest = field
        .strip_prefix("tasks[")
        .or_else(|| field.strip_prefix("prompts["))?;
    let (index, rest) = rest.split_once(']')?;
    Some((index.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_task_is_named_by_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks.jsonl");
        std::fs::write(
            &path,
            "# two tasks\n{\"kind\":\"synthetic\",\"spec\":{}}\n\n{\"kind\":\"synthetic\",\"spec\":{}}\n",
        )
        .unwrap();
        let files = TaskFiles::load(std::slice::from_ref(&path)).unwrap();
        assert_eq!(files.tasks.len(), 2);
        let err = ClientError::Api {
            status: 400,
            message: "must be at least 0".into(),
            field: Some("tasks[1].spec.run_ms".into()),
        };
        let text = files.explain(0, err).to_string();
        assert_eq!(
            text,
            format!(
                "{}:4: the gateway refused this task at `spec.run_ms`: must be at least 0",
                path.display()
            )
        );
        // A later chunk's index counts from its offset.
        let err = ClientError::Api {
            status: 400,
            message: "bad".into(),
            field: Some("tasks[0]".into()),
        };
        assert!(
            files
                .explain(1, err)
                .to_string()
                .starts_with(&format!("{}:4: ", path.display()))
        );
    }

    #[test]
    fn a_line_that_is_not_a_task_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(
            &path,
            "{\"kind\":\"synthetic\",\"spec\":{}}\n{\"kind\": 3}\n",
        )
        .unwrap();
        let err = TaskFiles::load(std::slice::from_ref(&path))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("{}:2: ", path.display())), "{err}");
    }
}
