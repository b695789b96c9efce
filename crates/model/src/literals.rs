//! Jinja2's string literals, which minijinja reads differently.
//!
//! Jinja2 decodes a string literal in a template as Python's `unicode-escape` codec
//! does: a backslash at a line's end joins the lines, `\N{EM DASH}` is the character of
//! that name, `\U0001F600` a code point of eight hex digits, `\a` and `\v` control
//! characters, and an escape Python does not know (`\/`, `\d`) stays as written.
//! minijinja keeps the first three as written and reads `\/` as `/`, so a template that
//! uses them (Mistral-Small-3.1's writes its instructions this way) renders another
//! prompt. Every literal inside a tag is therefore decoded here, as Jinja2 decodes it,
//! and written back as a literal minijinja reads as that same text: double quotes, with
//! only `\` and `"` escaped. A lost line (a joined one) is put back as whitespace after
//! the literal, inside the tag, so errors still name the template's own lines. A literal
//! Jinja2 refuses (`\x4`, an unknown `\N{…}` name, a lone `\` at its end) is refused
//! here, with where it is.

use super::tags::{rewrite_tags, string_end};

/// `source` with every string literal inside a `{{ … }}` or `{% … %}` tag decoded as
/// Jinja2 decodes it and written back for minijinja; text, comments and `raw` blocks
/// unchanged. The error names the literal's line.
pub fn python_literals(source: &str) -> Result<String, String> {
    rewrite_tags(source, |tag, at| {
        rewrite_tag(tag)
            .map_err(|e| format!("line {}: {e}", source[..at].matches('\n').count() + 1))
    })
}

/// One tag with its string literals decoded and written back.
fn rewrite_tag(tag: &str) -> Result<String, String> {
    let bytes = tag.as_bytes();
    let mut out = String::with_capacity(tag.len());
    let mut copied = 0;
    let mut i = 2;
    while i < bytes.len() {
        let q = bytes[i];
        if q != b'\'' && q != b'"' {
            i += 1;
            continue;
        }
        let Some(end) = string_end(bytes, i, q) else {
            break;
        };
        let body = &tag[i + 1..end - 1];
        let (text, joined) = decode(body)?;
        out.push_str(&tag[copied..i]);
        out.push('"');
        for c in text.chars() {
            if c == '\\' || c == '"' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out.extend(std::iter::repeat_n('\n', joined));
        copied = end;
        i = end;
    }
    out.push_str(&tag[copied..]);
    Ok(out)
}

/// A literal's body as Python's `unicode-escape` codec decodes it (after Jinja2 has
/// turned `\r\n` into `\n`), and how many lines it joined.
fn decode(body: &str) -> Result<(String, usize), String> {
    let mut joined = 0;
    let body = body.replace("\r\n", "\n");
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            return Err("a string literal ends with a lone `\\`".into());
        };
        match d {
            '\n' => joined += 1,
            '\\' | '\'' | '"' => out.push(d),
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'f' => out.push('\x0c'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'v' => out.push('\x0b'),
            '0'..='7' => {
                let mut v = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(n) => {
                            v = v * 8 + n;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.push(code_point(v, "octal")?);
            }
            'x' | 'u' | 'U' => {
                let n = match d {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let digits: String = (0..n).filter_map(|_| chars.next()).collect();
                let v = (digits.len() == n)
                    .then(|| u32::from_str_radix(&digits, 16).ok())
                    .flatten()
                    .ok_or_else(|| format!("truncated `\\{d}` escape `\\{d}{digits}`"))?;
                out.push(code_point(v, "hex")?);
            }
            'N' => {
                let name: String = if chars.next_if_eq(&'{').is_some() {
                    chars.by_ref().take_while(|&c| c != '}').collect()
                } else {
                    return Err("malformed `\\N` escape: it needs `{NAME}`".into());
                };
                let c = unicode_names2::character(&name)
                    .ok_or_else(|| format!("unknown Unicode character name `\\N{{{name}}}`"))?;
                out.push(c);
            }
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    Ok((out, joined))
}

/// The character of code point `v`, or why there is none.
fn code_point(v: u32, how: &str) -> Result<char, String> {
    char::from_u32(v).ok_or_else(|| {
        format!("the {how} escape of U+{v:04X} is not a character this renderer can write")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_decoded_as_python_decodes_them() {
        for (body, want) in [
            ("plain", "plain"),
            ("a\\\nb", "ab"),
            ("\\N{BULLET} \\N{EM DASH}", "• —"),
            ("\\x41\\101\\u00e9\\U0001F600", "AAé😀"),
            ("\\a\\v\\0", "\x07\x0b\0"),
            ("\\/\\d\\'\\\"\\\\", "\\/\\d'\"\\"),
            ("é☃", "é☃"),
        ] {
            assert_eq!(decode(body).unwrap().0, want, "{body}");
        }
        for bad in ["\\x4", "\\N{NO SUCH NAME}", "end\\", "\\N", "\\ud800"] {
            assert!(decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_literals_in_tags_change_and_lines_are_kept() {
        let source = "text 'a\\\nb' {{ 'a\\\nb' ~ \"q\\\"\" }}{# 'x\\y' #}{% raw %}{{ '\\N{BULLET}' }}{% endraw %}{% set s = '\\N{BULLET}' %}";
        let out = python_literals(source).unwrap();
        assert_eq!(
            out,
            "text 'a\\\nb' {{ \"ab\"\n ~ \"q\\\"\" }}{# 'x\\y' #}{% raw %}{{ '\\N{BULLET}' }}{% endraw %}{% set s = \"•\" %}"
        );
        assert_eq!(out.matches('\n').count(), source.matches('\n').count());
        let e = python_literals("x\n{{ 'ok' }}\n{{ '\\x4' }}").unwrap_err();
        assert!(e.starts_with("line 3:"), "{e}");
    }
}
