//! The NUL character, which Postgres cannot store (not in `text`, not in `jsonb`, and a
//! `json` value holding `\u0000` fails as soon as it is taken apart), while SQLite can.
//!
//! So that every deployment behaves the same whatever its database, input from the API
//! may not contain NUL at all (submit finds it with [`find_in_json`] and names the
//! field; URL parameters are checked the same way), and output the service produces
//! itself (tool output, model text, error messages), where an agent can put anything,
//! has each NUL replaced by U+FFFD, the replacement character, before it is stored
//! ([`scrub_json`], [`scrub`]). Token ids and logprobs, which training uses, are numbers
//! and never affected; only the text shown beside them is.

use std::borrow::Cow;

/// What NUL becomes in stored output.
pub const REPLACEMENT: char = '\u{FFFD}';

/// The path (`a.b[2]`, relative to `v`) of the first string or object key in `v` that
/// holds a NUL character; `None` when there is none.
pub fn find_in_json(v: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match v {
        Value::String(s) => s.contains('\0').then(String::new),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| find_in_json(item).map(|rest| join(&format!("[{i}]"), &rest))),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            if k.contains('\0') {
                return Some(k.replace('\0', "\\u0000"));
            }
            find_in_json(item).map(|rest| join(k, &rest))
        }),
        _ => None,
    }
}

fn join(head: &str, rest: &str) -> String {
    if rest.is_empty() {
        head.to_string()
    } else if rest.starts_with('[') {
        format!("{head}{rest}")
    } else {
        format!("{head}.{rest}")
    }
}

/// `s` with each NUL replaced by [`REPLACEMENT`]; borrowed when there is none.
pub fn scrub(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', &REPLACEMENT.to_string()))
    } else {
        Cow::Borrowed(s)
    }
}

/// Serialized JSON text with each NUL (written `\u0000` by any JSON writer) replaced by
/// [`REPLACEMENT`]. Escapes are read pair by pair, so an escaped backslash followed by
/// `u0000` (the six characters, not a NUL) is left alone.
pub fn scrub_json(text: String) -> String {
    if !text.contains("\\u0000") {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let esc = &rest[at..];
        if let Some(after) = esc.strip_prefix("\\u0000") {
            out.push(REPLACEMENT);
            rest = after;
        } else {
            // A backslash and the character it escapes (both ASCII in valid JSON text).
            let n = esc.chars().nth(1).map_or(1, |c| 1 + c.len_utf8());
            out.push_str(&esc[..n]);
            rest = &esc[n..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_nul_in_values_and_keys_with_their_path() {
        assert_eq!(find_in_json(&json!({"a": [1, {"b": "x"}]})), None);
        assert_eq!(
            find_in_json(&json!({"a": [1, {"b": "x\u{0}y"}]})),
            Some("a[1].b".into())
        );
        assert_eq!(find_in_json(&json!("\u{0}")), Some(String::new()));
        assert_eq!(
            find_in_json(&json!({"ok": 1, "k\u{0}": 2})),
            Some("k\\u0000".into())
        );
        assert_eq!(find_in_json(&json!([[0, "\u{0}"]])), Some("[0][1]".into()));
    }

    #[test]
    fn scrubbed_json_keeps_everything_but_nul() {
        let v = json!({"out": "a\u{0}b", "lit": "\\u0000 stays", "k\u{0}": ["\u{0}"], "e": "é\n"});
        let text = scrub_json(v.to_string());
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["out"], "a\u{FFFD}b");
        assert_eq!(back["lit"], "\\u0000 stays");
        assert_eq!(back["k\u{FFFD}"], json!(["\u{FFFD}"]));
        assert_eq!(back["e"], "é\n");
        let plain = json!({"a": "b"}).to_string();
        assert_eq!(scrub_json(plain.clone()), plain);
        assert_eq!(scrub("x\u{0}"), "x\u{FFFD}");
    }
}
