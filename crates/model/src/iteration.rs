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
//! The rewrite is done on the template source, tag by tag (the `tags` module): comments,
//! `raw` blocks and string literals are skipped, and only the expression between `in`
//! and a top-level `if` or `recursive` (or the end of the tag) is wrapped. Nothing else
//! moves, and no line is added, so errors still name the template's own lines.

use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

use super::tags::{rewrite_tags, tag_words};

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
    let rewritten = rewrite_tags(source, |tag, _| {
        let words = tag_words(tag);
        Ok::<_, std::convert::Infallible>(
            if tag.starts_with("{%") && words.first().map(|w| w.1) == Some("for") {
                rewrite_for(tag, &words)
            } else {
                tag.to_string()
            },
        )
    });
    match rewritten {
        Ok(s) => s,
        Err(never) => match never {},
    }
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
