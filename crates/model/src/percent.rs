//! Jinja2's `format` filter: Python's `%` operator on the template's text.
//!
//! Jinja2's `"%s, %d"|format(a, b)` is Python's `"%s, %d" % (a, b)` (and with keyword
//! arguments, `"%(name)s" % {"name": …}`). minijinja's own filter writes values its own
//! way (a float in a list as `1e16` where Python writes `1e+16`) and refuses `%r`, so a
//! template that formats a tool's arguments renders another prompt, or fails. This is
//! Python's formatting: the conversions `s r a d i u f F e E g G x X o c %`, the flags
//! `# 0 - + space`, widths and precisions (`*` too), each value printed as Python prints
//! it ([`super::pyrepr`]).

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::pyrepr::{python_repr, python_str};

/// The `format` filter: `value % args`, or `value % kwargs`, as Python computes it.
pub fn format(value: String, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let named: Vec<&str> = kwargs.args().collect();
    if !args.is_empty() && !named.is_empty() {
        return Err(bad(
            "can't handle positional and keyword arguments at the same time",
        ));
    }
    let mapping = (!named.is_empty()).then_some(&kwargs);
    let mut next = args.iter();
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = Spec::default();
        if chars.next_if_eq(&'(').is_some() {
            let key: String = chars.by_ref().take_while(|&c| c != ')').collect();
            let Some(map) = mapping else {
                return Err(bad("format requires a mapping"));
            };
            spec.keyed = Some(
                map.get::<Value>(&key)
                    .map_err(|_| bad(&format!("'{key}'")))?,
            );
        }
        while let Some(f) = chars.next_if(|c| "#0- +".contains(*c)) {
            match f {
                '#' => spec.alt = true,
                '0' => spec.zero = true,
                '-' => spec.left = true,
                '+' => spec.plus = true,
                _ => spec.space = true,
            }
        }
        spec.width = number(&mut chars, &mut next)?;
        if chars.next_if_eq(&'.').is_some() {
            spec.precision = Some(number(&mut chars, &mut next)?.unwrap_or(0));
        }
        while chars.next_if(|c| "hlL".contains(*c)).is_some() {}
        let Some(conv) = chars.next() else {
            return Err(bad("incomplete format"));
        };
        if conv == '%' {
            out.push('%');
            continue;
        }
        let arg = match spec.keyed.take() {
            Some(v) => v,
            None => next
                .next()
                .cloned()
                .ok_or_else(|| bad("not enough arguments for format string"))?,
        };
        out.push_str(&spec.apply(conv, &arg)?);
    }
    if mapping.is_none() && next.next().is_some() {
        return Err(bad("not all arguments converted during string formatting"));
    }
    Ok(out)
}

/// Python's error for a format it cannot apply.
fn bad(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

/// A width or precision: digits, or `*` (the next argument).
fn number(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    next: &mut std::slice::Iter<'_, Value>,
) -> Result<Option<usize>, Error> {
    if chars.next_if_eq(&'*').is_some() {
        let v = next
            .next()
            .and_then(Value::as_i64)
            .ok_or_else(|| bad("* wants int"))?;
        return Ok(Some(usize::try_from(v).unwrap_or(0)));
    }
    let mut n: Option<usize> = None;
    while let Some(d) = chars.next_if(char::is_ascii_digit) {
        n = Some(n.unwrap_or(0) * 10 + d.to_digit(10).unwrap_or(0) as usize);
    }
    Ok(n)
}

/// One conversion's flags, width and precision.
#[derive(Debug, Default)]
struct Spec {
    keyed: Option<Value>,
    alt: bool,
    zero: bool,
    left: bool,
    plus: bool,
    space: bool,
    width: Option<usize>,
    precision: Option<usize>,
}

impl Spec {
    /// `arg` converted by `conv`, padded to the width.
    fn apply(&self, conv: char, arg: &Value) -> Result<String, Error> {
        let (sign, body, numeric) = match conv {
            's' | 'r' | 'a' => {
                let mut text = match conv {
                    's' => python_str(arg),
                    _ => {
                        let mut r = String::new();
                        python_repr(arg, &mut r);
                        if conv == 'a' { ascii(&r) } else { r }
                    }
                };
                if let Some(p) = self.precision {
                    text = text.chars().take(p).collect();
                }
                (String::new(), text, false)
            }
            'd' | 'i' | 'u' | 'x' | 'X' | 'o' => {
                let n = integer(arg, conv)?;
                let digits = match conv {
                    'x' => format!("{:x}", n.unsigned_abs()),
                    'X' => format!("{:X}", n.unsigned_abs()),
                    'o' => format!("{:o}", n.unsigned_abs()),
                    _ => n.unsigned_abs().to_string(),
                };
                let prefix = match (self.alt, conv) {
                    (true, 'x') => "0x",
                    (true, 'X') => "0X",
                    (true, 'o') => "0o",
                    _ => "",
                };
                let digits = match self.precision {
                    Some(p) if digits.len() < p => {
                        format!("{}{digits}", "0".repeat(p - digits.len()))
                    }
                    _ => digits,
                };
                (self.sign(n < 0), format!("{prefix}{digits}"), true)
            }
            'f' | 'F' | 'e' | 'E' | 'g' | 'G' => {
                let x = float(arg, conv)?;
                let p = self.precision.unwrap_or(6);
                let body = if x.is_finite() {
                    match conv {
                        'f' | 'F' => format!("{:.*}", p, x.abs()),
                        'e' | 'E' => exponent(x.abs(), p),
                        _ => general(x.abs(), p, self.alt),
                    }
                } else if x.is_nan() {
                    "nan".into()
                } else {
                    "inf".into()
                };
                let body = if conv.is_ascii_uppercase() {
                    body.to_ascii_uppercase()
                } else {
                    body
                };
                (
                    self.sign(x.is_sign_negative() && !x.is_nan()),
                    body,
                    x.is_finite(),
                )
            }
            'c' => {
                let c = match arg.as_str() {
                    Some(s) if s.chars().count() == 1 => s.to_string(),
                    Some(_) => return Err(bad("%c requires int or char")),
                    None => u32::try_from(integer(arg, 'c')?)
                        .ok()
                        .and_then(char::from_u32)
                        .map(String::from)
                        .ok_or_else(|| bad("%c arg not in range(0x110000)"))?,
                };
                (String::new(), c, false)
            }
            other => {
                return Err(bad(&format!(
                    "unsupported format character '{other}' (0x{:x})",
                    other as u32
                )));
            }
        };
        let len = sign.chars().count() + body.chars().count();
        let pad = self.width.unwrap_or(0).saturating_sub(len);
        Ok(if self.left {
            format!("{sign}{body}{}", " ".repeat(pad))
        } else if self.zero && numeric {
            format!("{sign}{}{body}", "0".repeat(pad))
        } else {
            format!("{}{sign}{body}", " ".repeat(pad))
        })
    }

    /// The sign a number is written with.
    fn sign(&self, negative: bool) -> String {
        if negative {
            "-".into()
        } else if self.plus {
            "+".into()
        } else if self.space {
            " ".into()
        } else {
            String::new()
        }
    }
}

/// The whole number `%d` and its kin take: an integer or a boolean as it is, a float
/// cut toward zero; anything else is Python's `TypeError`.
fn integer(arg: &Value, conv: char) -> Result<i128, Error> {
    match arg.kind() {
        ValueKind::Bool => Ok(i128::from(arg.is_true())),
        ValueKind::Number => match arg.as_i64() {
            Some(n) => Ok(i128::from(n)),
            None => {
                let x = f64::try_from(arg.clone()).map_err(|_| bad("a number is required"))?;
                if matches!(conv, 'x' | 'X' | 'o' | 'c') {
                    return Err(bad(&format!(
                        "%{conv} format: an integer is required, not float"
                    )));
                }
                if x.is_finite() {
                    // Within i128 for any float a template meets; saturates beyond.
                    #[allow(clippy::cast_possible_truncation)]
                    Ok(x.trunc() as i128)
                } else {
                    Err(bad("cannot convert float infinity or NaN to integer"))
                }
            }
        },
        _ => Err(bad(&format!(
            "%{conv} format: a real number is required, not {}",
            arg.kind()
        ))),
    }
}

/// The float `%f` and its kin take.
fn float(arg: &Value, conv: char) -> Result<f64, Error> {
    match arg.kind() {
        ValueKind::Bool => Ok(if arg.is_true() { 1.0 } else { 0.0 }),
        ValueKind::Number => f64::try_from(arg.clone()).map_err(|_| bad("must be real number")),
        _ => Err(bad(&format!(
            "%{conv} format: must be real number, not {}",
            arg.kind()
        ))),
    }
}

/// `x` (finite, not negative) as `%.{p}e` writes it: `1.500000e+16`.
fn exponent(x: f64, p: usize) -> String {
    let s = format!("{:.*e}", p, x);
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    format!(
        "{mantissa}e{}{:02}",
        if exp < 0 { '-' } else { '+' },
        exp.abs()
    )
}

/// `x` (finite, not negative) as `%.{p}g` writes it: fixed or exponent notation by
/// the exponent, trailing zeros dropped unless `alt`.
fn general(x: f64, p: usize, alt: bool) -> String {
    let p = p.max(1);
    let sci = format!("{:.*e}", p - 1, x);
    let exp: i32 = sci
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    let trim = |s: String| {
        if alt || !s.contains('.') {
            s
        } else {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
    };
    if x == 0.0 || (-4..i32::try_from(p).unwrap_or(i32::MAX)).contains(&exp) {
        let decimals = usize::try_from(i32::try_from(p).unwrap_or(0) - 1 - exp).unwrap_or(0);
        trim(format!("{:.*}", decimals, x))
    } else {
        let (mantissa, _) = sci.split_once('e').unwrap_or((&sci, ""));
        format!(
            "{}e{}{:02}",
            trim(mantissa.to_string()),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// Python's `ascii()` of a `repr`: what is not ASCII escaped.
fn ascii(repr: &str) -> String {
    let mut out = String::with_capacity(repr.len());
    for c in repr.chars() {
        match c as u32 {
            0..=0x7f => out.push(c),
            n @ 0x80..=0xff => out.push_str(&format!("\\x{n:02x}")),
            n @ 0x100..=0xffff => out.push_str(&format!("\\u{n:04x}")),
            n => out.push_str(&format!("\\U{n:08x}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(template: &str, ctx: minijinja::Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("format", format);
        env.render_str(template, ctx).unwrap()
    }

    #[test]
    fn formats_as_python_percent_does() {
        let ctx = minijinja::context! {};
        for (template, python) in [
            ("{{ '%s|%r|%a'|format('é', 'é', 'é') }}", "é|'é'|'\\xe9'"),
            (
                "{{ '%s'|format([1e16, 0.5, none, true]) }}",
                "[1e+16, 0.5, None, True]",
            ),
            (
                "{{ '%d|%5d|%-5d|%05d|%+d|% d'|format(3, 42, 42, -42, 7, 7) }}",
                "3|   42|42   |-0042|+7| 7",
            ),
            ("{{ '%d|%i'|format(2.9, -2.9) }}", "2|-2"),
            (
                "{{ '%x|%#X|%o|%#o'|format(255, 255, 8, 8) }}",
                "ff|0XFF|10|0o10",
            ),
            (
                "{{ '%.2f|%f|%8.3f|%e|%.2E'|format(2.5, 1, 3.14159, 12345.678, 0.00012) }}",
                "2.50|1.000000|   3.142|1.234568e+04|1.20E-04",
            ),
            (
                "{{ '%g|%g|%g|%g|%.3g|%#g'|format(100000, 1000000, 0.0001, 0.00001, 3.14159, 2) }}",
                "100000|1e+06|0.0001|1e-05|3.14|2.00000",
            ),
            (
                "{{ '%c%c|%.2s|%%|%*d'|format(72, 'i', 'abc', 4, 9) }}",
                "Hi|ab|%|   9",
            ),
            ("{{ '%(a)s-%(b)d'|format(a='x', b=2) }}", "x-2"),
        ] {
            assert_eq!(fmt(template, ctx.clone()), python, "{template}");
        }
        let mut env = minijinja::Environment::new();
        env.add_filter("format", format);
        for bad in [
            "{{ '%s %s'|format(1) }}",
            "{{ '%s'|format(1, 2) }}",
            "{{ '%d'|format('x') }}",
            "{{ '%y'|format(1) }}",
        ] {
            assert!(
                env.render_str(bad, minijinja::context! {}).is_err(),
                "{bad}"
            );
        }
    }
}
