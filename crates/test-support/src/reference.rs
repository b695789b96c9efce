//! A reference implementation run beside the project's own: a script of the real thing
//! (transformers' `apply_chat_template`, vLLM's parsers) that reads a JSON list of
//! cases on its standard input and writes a JSON list of answers, one per case.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

/// Runs `python script` with `cases` as JSON on its standard input; returns its answers.
/// Panics, with the script's standard error and `what` it needs, when it cannot run or
/// does not answer with a list as long as `cases`.
pub fn run_json(python: &Path, script: &Path, cases: &[Value], what: &str) -> Vec<Value> {
    let mut child = std::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} ({what}): {e}", python.display()));
    child
        .stdin
        .take()
        .expect("the child's standard input")
        .write_all(serde_json::to_string(cases).expect("JSON").as_bytes())
        .expect("write the cases");
    let out = child.wait_with_output().expect("the reference's output");
    assert!(
        out.status.success(),
        "the reference {} failed ({what}): {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the reference {} did not answer with JSON: {e}",
            script.display()
        )
    });
    assert_eq!(
        answers.len(),
        cases.len(),
        "the reference {} answered {} of {} cases",
        script.display(),
        answers.len(),
        cases.len()
    );
    answers
}

/// The cases where the project's answer (`ours`) and the reference's (`theirs`) part,
/// one message each naming the case's `label`. Two equal answers agree, and so do two
/// refusals (what each refused with is not compared: the messages are each side's own).
pub fn disagreements<T: PartialEq + std::fmt::Debug>(
    cases: impl IntoIterator<Item = (String, Result<T, String>, Result<T, String>)>,
    reference: &str,
) -> Vec<String> {
    cases
        .into_iter()
        .filter(|(_, ours, theirs)| match (ours, theirs) {
            (Ok(a), Ok(b)) => a != b,
            (Err(_), Err(_)) => false,
            _ => true,
        })
        .map(|(label, ours, theirs)| {
            format!("{label}:\n  rollout: {ours:?}\n  {reference}: {theirs:?}")
        })
        .collect()
}
