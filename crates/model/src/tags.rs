//! A chat template's source walked tag by tag, for the rewrites done to it before
//! minijinja parses it ([`super::iteration`]'s loops, `literals`' strings):
//! text, `{# … #}` comments and `{% raw %}` blocks pass as they are, and each
//! `{{ … }}` and `{% … %}` tag goes through the caller's rewrite. An unclosed tag ends
//! the walk, left for the parser to report.

/// `source` with each `{{ … }}` and `{% … %}` tag replaced by `rewrite(tag, offset)`
/// (`offset`: where the tag starts in `source`); the first error stops the walk.
pub(crate) fn rewrite_tags<E>(
    source: &str,
    mut rewrite: impl FnMut(&str, usize) -> Result<String, E>,
) -> Result<String, E> {
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
            // An unclosed tag: left for the parser to report.
            out.push_str(from);
            return Ok(out);
        };
        let tag = &from[..end];
        rest = &from[end..];
        if kind == Some(b'%') && tag_words(tag).first().map(|w| w.1) == Some("raw") {
            // Everything up to the endraw tag is text.
            let close = find_endraw(rest).unwrap_or(rest.len());
            out.push_str(tag);
            out.push_str(&rest[..close]);
            rest = &rest[close..];
        } else if matches!(kind, Some(b'{' | b'%')) {
            out.push_str(&rewrite(tag, source.len() - from.len())?);
        } else {
            out.push_str(tag);
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The end (exclusive) of a `{{ … }}` or `{% … %}` starting at 0, skipping string
/// literals; `None` when it is not closed.
fn delimited_end(s: &str, start: usize, close: &str) -> Option<usize> {
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

/// Where the `{% endraw %}` tag starts in `body`.
fn find_endraw(body: &str) -> Option<usize> {
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
