//! Judging a program's output against a test case's, and reading the program out of a
//! model's answer. The running happens in a sandbox (the task kinds' EVAL); what is
//! here is the part that must be the same wherever it runs: how outputs compare, how a
//! failure is shown, which fenced block is the program.

use serde::{Deserialize, Serialize};

/// How a program's output is compared with the expected output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMatch {
    /// The same whitespace-separated tokens (line breaks and trailing spaces are
    /// layout), as competitive-programming judges compare.
    #[default]
    Tokens,
    /// The same lines, each with its trailing whitespace ignored, and trailing empty
    /// lines ignored.
    Lines,
    /// Byte for byte.
    Exact,
}

/// Whether `actual` is `expected` under `how`.
pub fn output_matches(expected: &str, actual: &str, how: OutputMatch) -> bool {
    match how {
        OutputMatch::Tokens => expected.split_whitespace().eq(actual.split_whitespace()),
        OutputMatch::Lines => lines(expected).eq(lines(actual)),
        OutputMatch::Exact => expected == actual,
    }
}

/// The lines of `s` without trailing whitespace, trailing empty lines dropped.
fn lines(s: &str) -> impl Iterator<Item = &str> {
    s.trim_end().lines().map(str::trim_end)
}

/// The first line where `actual` differs from `expected`, with both lines, for a
/// failing case's `details`. Long lines are cut.
pub fn first_difference(expected: &str, actual: &str) -> String {
    const CUT: usize = 200;
    let cut = |s: &str| -> String {
        if s.chars().count() > CUT {
            format!("{}…", s.chars().take(CUT).collect::<String>())
        } else {
            s.to_string()
        }
    };
    let (e, a): (Vec<&str>, Vec<&str>) = (lines(expected).collect(), lines(actual).collect());
    for i in 0..e.len().max(a.len()) {
        let (el, al) = (e.get(i), a.get(i));
        if el.map(|l| l.split_whitespace().collect::<Vec<_>>())
            != al.map(|l| l.split_whitespace().collect::<Vec<_>>())
        {
            return format!(
                "line {}: expected {}, got {}",
                i + 1,
                el.map_or("end of output".to_string(), |l| format!("{:?}", cut(l))),
                al.map_or("end of output".to_string(), |l| format!("{:?}", cut(l))),
            );
        }
    }
    "the outputs differ only in whitespace".to_string()
}

/// The last fenced code block (```` ```lang … ``` ````) in `text`, preferring one in
/// `language` when given: the program a model wrote in its answer. An unclosed last
/// fence (the model stopped mid-block) is not a program.
pub fn last_code_block(text: &str, language: Option<&str>) -> Option<String> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let Some(line_end) = after.find('\n') else {
            break;
        };
        let lang = after[..line_end].trim().to_lowercase();
        let body = &after[line_end + 1..];
        let Some(close) = body.find("```") else {
            break;
        };
        blocks.push((lang, body[..close].to_string()));
        rest = &body[close + 3..];
    }
    let wanted = language.map(str::to_lowercase);
    let pick = match &wanted {
        Some(l) => blocks
            .iter()
            .rev()
            .find(|(lang, _)| lang == l || (l == "python" && lang == "py"))
            .or_else(|| blocks.iter().rev().find(|(lang, _)| lang.is_empty())),
        None => blocks.last(),
    };
    pick.map(|(_, body)| body.clone())
}

/// How a program run ended, in words for `details`.
pub fn verdict_of_run(
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stderr: &str,
) -> Option<&'static str> {
    if timed_out {
        return Some("time limit exceeded");
    }
    let out_of_memory = [
        "MemoryError",
        "std::bad_alloc",
        "Cannot allocate memory",
        "out of memory",
    ]
    .iter()
    .any(|m| stderr.contains(m));
    if out_of_memory {
        return Some("memory limit exceeded");
    }
    // A shell reports a child killed by signal N as exit status 128 + N.
    let signal = signal.or(exit_code
        .filter(|c| (129..=192).contains(c))
        .map(|c| c - 128));
    match (exit_code, signal) {
        (_, Some(9)) => Some("killed (memory or time limit)"),
        (_, Some(_)) => Some("crashed (signal)"),
        (Some(0), _) => None,
        _ => Some("runtime error (nonzero exit)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_compare_by_tokens_lines_or_bytes() {
        assert!(output_matches("1 2\n3\n", "1  2 3", OutputMatch::Tokens));
        assert!(!output_matches("1 2\n3\n", "1 23", OutputMatch::Tokens));
        assert!(output_matches("a\nb\n", "a  \nb\n\n", OutputMatch::Lines));
        assert!(!output_matches("a b\n", "a  b\n", OutputMatch::Lines));
        assert!(!output_matches("a\n", "a", OutputMatch::Exact));
        assert!(output_matches("", "\n", OutputMatch::Tokens));
    }

    #[test]
    fn the_first_difference_names_the_line() {
        assert_eq!(
            first_difference("1\n2\n3\n", "1\n5\n3\n"),
            "line 2: expected \"2\", got \"5\""
        );
        assert_eq!(
            first_difference("1\n2\n", "1\n"),
            "line 2: expected \"2\", got end of output"
        );
    }

    #[test]
    fn the_last_closed_block_is_the_program() {
        let text = "First:\n```python\nprint(1)\n```\nBetter:\n```python\nprint(2)\n```\n";
        assert_eq!(last_code_block(text, Some("python")).unwrap(), "print(2)\n");
        let unclosed = "```python\nprint(1)\n```\nand then\n```python\nprint(";
        assert_eq!(last_code_block(unclosed, None).unwrap(), "print(1)\n");
        let mixed = "```py\nprint(3)\n```\n```text\noutput\n```";
        assert_eq!(
            last_code_block(mixed, Some("python")).unwrap(),
            "print(3)\n"
        );
        assert_eq!(last_code_block("no code", None), None);
    }
}
