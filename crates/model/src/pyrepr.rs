//! Python's `str()` of template values, as Jinja2 prints them.
//!
//! transformers renders chat templates with Jinja2, which prints a value with Python's
//! `str()`: a float as its shortest round-trip digits in Python's layout (`1e-07`,
//! `1e+16`, `0.1`, `3.0`), a list or dict as Python's `repr` of it (`[1e+16, 'a',
//! None]`, `{'k': True}`). minijinja prints its own way (`0.0000001`,
//! `10000000000000000.0`, `[1e16, "a", none]`), and templates do print raw values:
//! Seed-OSS writes non-string tool arguments with `{{ value }}`, so a float argument
//! rendered differently from the prompt the policy was trained on. The template's
//! formatter (`{{ … }}`), its `string` filter and its `join` filter use [`python_str`].
//! (Concatenation with `~` still uses minijinja's own text of a number.)

use minijinja::value::{Value, ValueKind};

/// `str(value)` as Python prints it: strings as they are, everything else as
/// [`python_repr`] (which is what `str` gives for numbers, containers, `None` and
/// booleans); an undefined value prints as nothing, as in Jinja2.
pub fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => {
            let mut out = String::new();
            python_repr(value, &mut out);
            out
        }
    }
}

/// `repr(value)` as Python writes it, appended to `out`.
pub fn python_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if value.is_integer() {
                out.push_str(&value.to_string());
            } else {
                match f64::try_from(value.clone()) {
                    Ok(f) => out.push_str(&float_repr(f)),
                    Err(_) => out.push_str(&value.to_string()),
                }
            }
        }
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    python_repr(&key, out);
                    out.push_str(": ");
                    let item = value.get_item(&key).unwrap_or_default();
                    python_repr(&item, out);
                }
            }
            out.push('}');
        }
        // Bytes, iterators and plain objects (a loop, a namespace): minijinja's text.
        _ => out.push_str(&value.to_string()),
    }
}

/// `repr(f)` for a Python float: the shortest digits that read back as `f`, written
/// positionally when the decimal exponent is in -4..16 (with `.0` for a whole number)
/// and in scientific notation otherwise, with a signed exponent of at least two digits.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits, as `d.ddde<exp>`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes an integer exponent");
    if (-4..16).contains(&exp) {
        let mut fixed = format!("{f}");
        if !fixed.contains('.') {
            fixed.push_str(".0");
        }
        fixed
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

/// `repr(s)` for a Python string: single quotes unless the text holds a single quote
/// and no double one; backslashes, the quote, tabs, newlines, carriage returns and the
/// other control characters escaped as Python escapes them.
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            // Python's non-printable Latin-1 characters; it also escapes a few other
            // non-printable code points (separators, unassigned) that templates do not
            // meet in practice.
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) || c == '\u{ad}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_prints_them() {
        // Each pair is (value, Python's repr of it).
        for (f, want) in [
            (1e-7, "1e-07"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.1, "0.1"),
            (3.0, "3.0"),
            (-2.5, "-2.5"),
            (1e100, "1e+100"),
            (-1e-300, "-1e-300"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
            (123456.789, "123456.789"),
            (2.0f64.powi(60), "1.152921504606847e+18"),
        ] {
            assert_eq!(float_repr(f), want, "{f:?}");
        }
    }

    #[test]
    fn containers_and_scalars_print_as_python_str() {
        let v = Value::from(minijinja::value::Serde(serde_json::json!({
            "lr": 1e-7, "n": 3, "on": true, "off": null, "s": "it's", "q": "a\"b'c",
            "l": [1e16, "a", null, [0.5]], "d": {"k": "v\n"}
        })));
        assert_eq!(
            python_str(&v),
            "{'lr': 1e-07, 'n': 3, 'on': True, 'off': None, 's': \"it's\", 'q': 'a\"b\\'c', \
             'l': [1e+16, 'a', None, [0.5]], 'd': {'k': 'v\\n'}}"
        );
        assert_eq!(python_str(&Value::from("plain")), "plain");
        assert_eq!(python_str(&Value::UNDEFINED), "");
        assert_eq!(python_str(&Value::from(())), "None");
    }
}
