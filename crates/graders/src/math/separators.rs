//! Thousands separators: the spellings that split a number's digits into groups of
//! three (`1,000,000`, `1{,}000`, `1,\!000`, `12\,345`, `12 345`, `1'000`, thin and
//! non-breaking spaces), and joining them back into one number.
//!
//! Two of the spellings are ambiguous. A plain comma or space between digit groups can
//! also separate the items of a list (`1,250` may be the pair 1 and 250), so the lexer
//! keeps them and the comparison decides, led by whichever side reads as one number.
//! The others (`{,}`, `,\!`, `\,`, thin spaces, …) only ever appear inside a number, so
//! the lexer joins them itself.

/// How sure a separator is to be one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A LaTeX or Unicode spelling that is only written inside a number.
    Sure,
    /// A plain `,` or space: inside a number or between the items of a list.
    Ambiguous,
}

/// Spellings written only between digit groups, longest first so that `,\!` is not read
/// as a comma.
const SURE: &[&str] = &[
    "\\thinspace",
    "{,}",
    ",\\!",
    "\\,",
    "\\ ",
    "\\!",
    "\\;",
    "\\:",
    "~",
    "'",
    "\u{2009}", // thin space
    "\u{202f}", // narrow no-break space
    "\u{00a0}", // no-break space
    "\u{2006}", // six-per-em space
    "\u{2008}", // punctuation space
];

/// The separator starting at `chars[i]`, if one does: its length in chars and kind.
pub fn at(chars: &[char], i: usize) -> Option<(usize, Kind)> {
    let rest = chars.get(i..)?;
    for s in SURE {
        let len = s.chars().count();
        if rest.len() >= len && rest.iter().zip(s.chars()).all(|(a, b)| *a == b) {
            return Some((len, Kind::Sure));
        }
    }
    matches!(rest.first(), Some(',' | ' ')).then_some((1, Kind::Ambiguous))
}

/// The number of ASCII digits from `chars[i]` on.
pub fn digits_from(chars: &[char], i: usize) -> usize {
    chars
        .get(i..)
        .unwrap_or_default()
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count()
}

/// `text` with its thousands separators taken out (`1,000,000` and `1,\!000` become
/// `1000000` and `1000`), of any spelling and mixed, when it has digit groups of three
/// after a first group of one to three digits; `None` when it has none. Digits after a
/// decimal point are never grouped (`0.123 456` stays two numbers).
pub fn join(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    // Digits since the number began or since its last joined separator, and whether
    // this number has had one joined (then every group must be exactly three long).
    let (mut run, mut grouped) = (0usize, false);
    let mut after_dot = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        out.push(c);
        i += 1;
        if !c.is_ascii_digit() {
            after_dot = c == '.' && run > 0;
            (run, grouped) = (0, false);
            continue;
        }
        run += 1;
        if after_dot {
            continue;
        }
        let Some((len, _)) = at(&chars, i) else {
            continue;
        };
        let first_ok = if grouped { run == 3 } else { run <= 3 };
        if first_ok && digits_from(&chars, i + len) == 3 {
            i += len; // drop the separator
            (run, grouped, changed) = (0, true, true);
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::join;

    #[test]
    fn digit_groups_join_only_in_threes() {
        assert_eq!(join("1,000,000").as_deref(), Some("1000000"));
        assert_eq!(join("12 345.5").as_deref(), Some("12345.5"));
        assert_eq!(join("2 500 000").as_deref(), Some("2500000"));
        assert_eq!(join("1234,567"), None);
        assert_eq!(join("1,23"), None);
        assert_eq!(join("0.123 456"), None);
    }

    #[test]
    fn every_spelling_joins_and_spellings_mix() {
        for text in [
            "1{,}000{,}000",
            "1,\\!000,\\!000",
            "1\\,000\\,000",
            "1\\ 000\\ 000",
            "1\\thinspace000\\thinspace000",
            "1\u{2009}000\u{202f}000",
            "1'000'000",
            "1,000\\,000",
            "1{,}000 000",
        ] {
            assert_eq!(join(text).as_deref(), Some("1000000"), "{text:?}");
        }
        assert_eq!(join("x = 12\\,345").as_deref(), Some("x = 12345"));
    }

    #[test]
    fn lists_and_tuples_stay_apart() {
        assert_eq!(join("(1,2)"), None);
        assert_eq!(join("1, 2, 3"), None);
        assert_eq!(join("1, 250"), None);
        assert_eq!(join("10, 200"), None);
        assert_eq!(join("1,0000"), None);
    }
}
