//! Jinja2's rule for `{% for %}` over a null value, which minijinja does not have.
//!
//! transformers renders chat templates with Python's Jinja2, where `{% for x in v %}`
//! over `None` raises `TypeError: 'NoneType' object is not iterable`; minijinja
//! iterates `none` as an empty list. A template that fails in transformers (a nested
//! `null` a trainer sent, say) must not render silently here, or the prompt differs
//! from the one the policy will be trained against. minijinja has no hook for
//! iteration, so every `for` tag's iterable is passed through the [`FILTER`] filter,
//! which refuses `none` and passes anything else on unchanged. Undefined values still
//! iterate as empty, as Jinja2's default `Undefined` does.
//!
//! The rewrite is done on the template source, tag by tag: comments, `raw` blocks and
//! string literals are skipped, and only the expression between `in` and a top-level
//! `if` or `recursive` (or the end of the tag) is wrapped. Nothing else moves, and no
//! line is added, so errors still name the template's own lines.

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

/// The filter every `for` tag's iterable goes through.
pub const FILTER: &str = "__rollout_iterable";

/// The filter: `value` unchanged, or Jinja2's error when it is `none`. A string is
/// handed on as the list of its characters: Jinja2 loops over a string's characters
/// with its length known (`loop.last` is true on the last one), where minijinja's
/// string iteration leaves the length unknown.
pub fn iterable(value: Value) -> Result<Value, Error> {
    if value.is_none() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "'NoneType' object is not iterable (the template loops over a null value; \
             transformers' Jinja2 raises here too)",
        ));
    }
    if let Some(s) = value.as_str() {
        return Ok(Value::from(
            s.chars().map(|c| c.to_string()).collect::<Vec<_>>(),
        ));
    }
    Ok(value)
}

/// Jinja2's `is iterable` test: whether Python's `iter()` takes the value. `none`,
/// booleans and numbers are not iterable (minijinja's own test says `none` is, so a
/// template's `tools is iterable` guard passes a missing list of tools on to a loop
/// that then fails); undefined values are, as Jinja2's `Undefined` is.
pub fn is_iterable(value: Value) -> bool {
    use minijinja::value::ValueKind;
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Invalid => false,
        ValueKind::Plain => value.try_iter().is_ok(),
        _ => true,
    }
}

/// `source` with every `for` tag's iterable wrapped in [`FILTER`].
pub fn guard_for_loops(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 64);
    let mut rest = source;
    while let Some(open) = rest.find('{') {
        let (before, from) = rest.split_at(open);
        out.push_str(before);
        let kind = from.as_bytes().get(1).copied();
        let end = match kind {
            Some(b'#') => from.find("#}").map(|i| i + 2),
            Some(b'{') => delimited_end(from, 2, "}}"),
            Some(b'%') => delimited_end(from, 2, "%}"),
            _ => Some(1),
        };
        let Some(end) = end else {
            // An unclosed tag: leave the rest for the parser to report.
            out.push_str(from);
            return out;
        };
        let tag = &from[..end];
        if kind == Some(b'%') {
            let words = tag_words(tag);
            if words.first().map(|w| w.1) == Some("raw") {
                // Everything up to the endraw tag is text.
                let body = &from[end..];
                let close = find_endraw(body).unwrap_or(body.len());
                out.push_str(tag);
                out.push_str(&body[..close]);
                rest = &body[close..];
                continue;
            }
            if words.first().map(|w| w.1) == Some("for") {
                out.push_str(&rewrite_for(tag, &words));
                rest = &from[end..];
                continue;
            }
        }
        out.push_str(tag);
        rest = &from[end..];
    }
    out.push_str(rest);
    out
}

/// The end (exclusive) of a `{{ … }}` or `{% … %}` starting at 0, skipping string
/// literals; `None` when it is not closed.
pub(crate) fn delimited_end(s: &str, start: usize, close: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = start;
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'\'' | b'"') => i = string_end(bytes, i, q)?,
            // Bytes, not `&s[i..]`: `i` may fall inside a multi-byte character.
            _ if bytes[i..].starts_with(close.as_bytes()) => return Some(i + close.len()),
            _ => i += 1,
        }
    }
    None
}

/// The index after the string literal opened by quote `q` at `at`.
pub(crate) fn string_end(bytes: &[u8], at: usize, q: u8) -> Option<usize> {
    let mut i = at + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            c if c == q => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The words of a tag at bracket depth 0, outside strings, with their byte offsets.
pub(crate) fn tag_words(tag: &str) -> Vec<(usize, &str)> {
    let bytes = tag.as_bytes();
    let mut words = Vec::new();
    let mut depth = 0usize;
    let mut i = 2;
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\'' | b'"' => {
                i = string_end(bytes, i, c).unwrap_or(bytes.len());
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                // A word preceded by `.` is an attribute (`x.if`), not a keyword.
                let attribute = start > 0 && bytes[start - 1] == b'.';
                if depth == 0 && !attribute {
                    words.push((start, &tag[start..i]));
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    words
}

/// The `for` tag with its iterable wrapped; unchanged if it has no `in`.
fn rewrite_for(tag: &str, words: &[(usize, &str)]) -> String {
    let Some(in_at) = words.iter().position(|w| w.1 == "in") else {
        return tag.to_string();
    };
    let start = words[in_at].0 + 2;
    let close = tag.len() - 2 - usize::from(tag[..tag.len() - 2].ends_with(['-', '+']));
    let end = words[in_at + 1..]
        .iter()
        .find(|w| w.1 == "if" || w.1 == "recursive")
        .map_or(close, |w| w.0);
    let raw = &tag[start..end];
    let lead = raw.len() - raw.trim_start().len();
    let expr = raw.trim();
    let trailing = &raw[lead + expr.len()..];
    format!(
        "{}{}({expr})|{FILTER}{trailing}{}",
        &tag[..start],
        &raw[..lead],
        &tag[end..]
    )
}

/// Where the `{% endraw %}` tag starts in `body`.
pub(crate) fn find_endraw(body: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = body[from..].find("{%") {
        let at = from + i;
        let end = delimited_end(&body[at..], 2, "%}")?;
        if tag_words(&body[at..at + end]).first().map(|w| w.1) == Some("endraw") {
            return Some(at);
        }
        from = at + 2;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_tags_get_the_filter_and_nothing_else_changes() {
        let cases = [
            (
                "{% for m in messages %}x{% endfor %}",
                "{% for m in (messages)|__rollout_iterable %}x{% endfor %}",
            ),
            (
                "{%- for k, v in m.items() | list if v recursive -%}",
                "{%- for k, v in (m.items() | list)|__rollout_iterable if v recursive -%}",
            ),
            (
                "{%+ for c in m['tool calls in'] or [] +%}",
                "{%+ for c in (m['tool calls in'] or [])|__rollout_iterable +%}",
            ),
            (
                "{# {% for x in y %} #}{% raw %}{% for a in b %}{% endraw %}{{ '{% for q in r %}' }}",
                "{# {% for x in y %} #}{% raw %}{% for a in b %}{% endraw %}{{ '{% for q in r %}' }}",
            ),
            (
                "{% for x in a.if_ if x.recursive %}",
                "{% for x in (a.if_)|__rollout_iterable if x.recursive %}",
            ),
            ("{% if x in y %}{% for %}", "{% if x in y %}{% for %}"),
            ("{{ unclosed", "{{ unclosed"),
            // A multi-byte character after an unclosed tag: left for the parser.
            ("{{ x é", "{{ x é"),
            ("{% for x in é", "{% for x in é"),
            (
                "{% if 'é' %}{% for c in 'ü' %}",
                "{% if 'é' %}{% for c in ('ü')|__rollout_iterable %}",
            ),
        ];
        for (source, want) in cases {
            assert_eq!(guard_for_loops(source), want, "{source}");
        }
    }
}
