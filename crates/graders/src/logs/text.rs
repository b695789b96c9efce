//! Text helpers shared by the log parsers: Python's idea of whitespace (SWE-bench's
//! parsers are Python, and a status map must come out the same from the same bytes),
//! ANSI colour codes, and pytest's `id - message` lines.

/// Whether Python's `str.isspace()` holds for `c`: Unicode whitespace plus the four
/// ASCII separators `\x1c`–`\x1f`, which `str.split()` also splits on.
pub(super) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// Python's `s.split()`: the words between runs of whitespace.
pub(super) fn py_split(s: &str) -> Vec<&str> {
    s.split(is_py_space).filter(|w| !w.is_empty()).collect()
}

/// Python's `s.strip()`.
pub(super) fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// The log's lines as Python's `log.split("\n")` gives them: a `\r` stays on its line.
pub(super) fn lines(log: &str) -> Vec<&str> {
    log.split('\n').collect()
}

/// `s` without ANSI escape sequences (`ESC [ … letter`, and any other `ESC x` pair):
/// what a reader sees on a terminal. Used for this crate's own checks; SWE-bench's
/// `pytest_v2` cleaning is [`v2_clean`].
pub(super) fn strip_ansi(s: &str) -> String {
    if !s.contains('\x1b') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        // `ESC [`: parameters and intermediates, then one final byte in `@`..=`~`; any
        // other escape is two characters.
        if chars.next() == Some('[') {
            for n in chars.by_ref() {
                if ('@'..='~').contains(&n) {
                    break;
                }
            }
        }
    }
    out
}

/// SWE-bench's `pytest_v2` cleaning of a line: every `[` digits `m` removed (the ANSI
/// colour codes' bodies, and anything else of that shape, ids included), then every
/// control character from `\x01` to `\x1f` (the codes' `ESC`, but also tabs and `\r`).
pub(super) fn v2_clean(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find('[') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && after[digits..].starts_with('m') {
            rest = &after[digits + 1..];
        } else {
            out.push('[');
            rest = after;
        }
    }
    out.push_str(rest);
    out.retain(|c| !('\x01'..='\x1f').contains(&c));
    out
}

/// pytest's `id - message` with the message cut off at the first ` - ` outside
/// brackets (a parametrized id may hold ` - ` in its `[…]`), trimmed.
pub(super) fn cut_message(rest: &str) -> &str {
    let mut depth = 0i64;
    for (i, c) in rest.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ' ' if depth <= 0 && rest[i..].starts_with(" - ") => return rest[..i].trim(),
            _ => {}
        }
    }
    rest.trim()
}

/// Whether `s` is `[` digits `]`: the count pytest's `SKIPPED [N] path:line: reason`
/// summary lines carry instead of a test id.
pub(super) fn is_skip_count(s: &str) -> bool {
    s.strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The leading unsigned integer of `s` (`"12 passed"` → 12), if any.
pub(super) fn leading_number(s: &str) -> Option<(u64, &str)> {
    let s = s.trim_start();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n = s[..end].parse().ok()?;
    Some((n, s[end..].trim_start()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_and_splitting() {
        assert_eq!(py_split(" a\tb\x1cc  \r"), ["a", "b", "c"]);
        assert_eq!(py_strip("\x1f x \u{a0}"), "x");
        assert_eq!(lines("a\r\nb"), ["a\r", "b"]);
    }

    #[test]
    fn ansi_codes_come_out() {
        let s = "\x1b[32mPASSED\x1b[0m t.py::\x1b[1mtest_x\x1b[0m";
        assert_eq!(strip_ansi(s), "PASSED t.py::test_x");
        assert_eq!(v2_clean(s), "PASSED t.py::test_x");
        // SWE-bench's cleaning also eats `[3m` inside an id, and tabs.
        assert_eq!(v2_clean("t.py::t[3m]\tPASSED"), "t.py::t]PASSED");
        assert_eq!(v2_clean("a[b] [12"), "a[b] [12");
        assert_eq!(strip_ansi("x\x1b"), "x");
    }

    #[test]
    fn messages_are_cut_outside_brackets() {
        assert_eq!(cut_message("t.py::x - boom - more"), "t.py::x");
        assert_eq!(cut_message("t.py::x[a - b] - boom"), "t.py::x[a - b]");
        assert_eq!(cut_message(" t.py::x "), "t.py::x");
        assert!(is_skip_count("[12]") && !is_skip_count("[]") && !is_skip_count("[1a]"));
        assert_eq!(leading_number(" 12 passed"), Some((12, "passed")));
        assert_eq!(leading_number("x"), None);
        assert_eq!(leading_number("99999999999999999999999 passed"), None);
    }
}
