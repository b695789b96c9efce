//! From an answer as a model or a dataset writes it (LaTeX, plain text, Unicode) to
//! tokens: the spellings of one thing become one token (`\dfrac`, `\tfrac` and `\frac`;
//! `−`, `–` and `-`; `\le`, `\leq` and `≤`; `^\circ`, `°` and "degrees"), spacing and
//! sizing commands go, and digit groups split by thin spaces (`1\,000`, `1{,}000`,
//! `1,\!000`, U+2009) join. A comma stays a comma: whether `1,000` is a thousand or a
//! pair depends on the other side of the comparison, which the comparison knows and the
//! lexer does not ([`separators`]).
//!
//! Every command is one the lexer knows: a spelling of a token, a name, a function, a
//! wrapper of text or a group, or a command that only spaces, sizes or styles (dropped).
//! Any other becomes [`Tok::Unknown`], which makes the answer unreadable: dropping
//! `\neg` from `\neg 5` or `\binom` from `\binom{10}{2}` would read an answer that
//! was never written.

use super::separators;

/// One token of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// Digits with at most one `.`, as written (`012`, `3.50`, `.5`).
    Num(String),
    /// A repeating decimal's repeated digits, right after the number they repeat in
    /// (`0.\overline{3}`, `0.(3)` in plain text is left to the parser).
    Repeat(String),
    /// A name: a variable (`x`, `\alpha`), a constant (`\pi`, `e`) or a function
    /// (`\sin`, `log`), without its backslash.
    Name(String),
    /// `+`.
    Plus,
    /// `-`.
    Minus,
    /// `±`.
    PlusMinus,
    /// `*`, `\times`, `\cdot`, `×`, `·`.
    Times,
    /// `/`, `\div`, `÷`.
    Slash,
    /// `^`.
    Caret,
    /// `!`.
    Bang,
    /// `_` (a subscript: `\log_2`).
    Underscore,
    /// A relation: `=`, `<`, `>`, `≤`, `≥`, `≠`.
    Rel(Rel),
    /// `(`, `[`, `\{` (a literal brace), `\langle`; and as `⌊`, `⌈` and `|` the
    /// openings of a floor (`\lfloor`), a ceiling (`\lceil`) and an absolute value that
    /// says it opens one (`\left|`, `\lvert`).
    Open(char),
    /// `)`, `]`, `\}`, `\rangle`; `⌋` (`\rfloor`), `⌉` (`\rceil`), and `|` (`\right|`,
    /// `\rvert`).
    Close(char),
    /// `{`: a LaTeX group.
    GroupOpen,
    /// `}`.
    GroupClose,
    /// `,`.
    Comma,
    /// `;`.
    Semicolon,
    /// `|`.
    Bar,
    /// `\frac` (and `\dfrac`, `\tfrac`, `\cfrac`).
    Frac,
    /// `\sqrt` (`√`).
    Sqrt,
    /// `\binom` (and `\dbinom`, `\tbinom`).
    Binom,
    /// `\choose`: TeX's infix binomial coefficient, `{n \choose k}`.
    Choose,
    /// `\over`: TeX's infix fraction, `{a \over b}`.
    Over,
    /// `%`, `\%`, "percent".
    Percent,
    /// `^\circ`, `°`, "degrees".
    Degree,
    /// `\infty`, `∞`, "infinity".
    Infinity,
    /// `\cup`, `∪`, "U" between intervals is left to the parser.
    Cup,
    /// `\cap`.
    Cap,
    /// `&` (a matrix column).
    Amp,
    /// `\\` (a matrix row).
    RowSep,
    /// `\begin{…matrix}` (and `array`).
    BeginMatrix,
    /// `\end{…matrix}`.
    EndMatrix,
    /// A word of text (`\text{cm}`, "or", "and"), kept so the parser can tell units and
    /// trailing words from answers that are words.
    Word(String),
    /// A command the grader does not read (`\neg`, `\mathbb`, `\foo`), without its
    /// backslash. Unlike a word it is never dropped: what it does to the answer is
    /// unknown, so the answer cannot be read.
    Unknown(String),
    /// Arguments nested past what the lexer reads (`\text{\text{…}}` thousands deep).
    TooDeep,
}

/// A relation between two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rel {
    /// `=`.
    Eq,
    /// `≠`.
    Ne,
    /// `<`.
    Lt,
    /// `≤`.
    Le,
    /// `>`.
    Gt,
    /// `≥`.
    Ge,
}

/// Commands that only size, space or style what they stand before: dropped (their
/// argument, if any, stays a group).
const DROPPED: &[&str] = &[
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "biggl",
    "biggr",
    "Biggl",
    "Biggr",
    "bigm",
    "Bigm",
    "displaystyle",
    "textstyle",
    "scriptstyle",
    "scriptscriptstyle",
    "limits",
    "nolimits",
    "quad",
    "qquad",
    "thinspace",
    "medspace",
    "thickspace",
    "enspace",
    "negthinspace",
    "negmedspace",
    "negthickspace",
    "hfill",
    "nonumber",
    "notag",
    "hline",
    "ensuremath",
    "underline",
    "bm",
    "pmb",
    "mathnormal",
    "space",
    "nobreakspace",
    // Currency signs, dropped as `\$` is: units do not change the number.
    "textdollar",
    "pounds",
    "textsterling",
    "euro",
    "texteuro",
    "yen",
    "textyen",
    "mathrm",
    "mathbf",
    "mathit",
    "boldsymbol",
    "bf",
    "rm",
    "it",
    "mathsf",
    "mathtt",
    "hbox",
];

/// Commands whose argument is not part of the answer (spacing, invisible boxes, a
/// colour): dropped with it.
const DROPPED_WITH_ARG: &[&str] = &[
    "hspace", "vspace", "phantom", "hphantom", "vphantom", "color",
];

/// Commands of functions that fold several arguments into one value.
const FOLDS: &[&str] = &["min", "max", "gcd", "lcm"];

/// Commands that name things (kept as [`Tok::Name`]).
const NAMES: &[&str] = &[
    "pi",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Pi",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
    "Upsilon",
    "varpi",
    "varrho",
    "varsigma",
    "ell",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "log",
    "ln",
    "lg",
    "exp",
];

/// Splits `text` into tokens. Never fails: what it does not know becomes a
/// [`Tok::Word`], which the parser refuses or skips.
pub fn lex(text: &str) -> Vec<Tok> {
    lex_nested(text, 0)
}

/// How deeply arguments lexed on their own (`\text{\text{…}}`, `\abs{\abs{…}}`) may
/// nest: each level is a call deeper, and a policy can nest a hundred thousand.
const MAX_NESTED: usize = 16;

/// [`lex`] inside `depth` arguments lexed on their own.
fn lex_nested(text: &str, depth: usize) -> Vec<Tok> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            c if c.is_whitespace() || c == '~' || c == '$' => {}
            '0'..='9' | '.' if c != '.' || chars.get(i).is_some_and(char::is_ascii_digit) => {
                let mut num = String::from(c);
                loop {
                    match chars.get(i) {
                        Some(d) if d.is_ascii_digit() => num.push(*d),
                        Some('.')
                            if !num.contains('.')
                                && chars.get(i + 1).is_some_and(char::is_ascii_digit) =>
                        {
                            num.push('.');
                        }
                        // `0.` before `\overline`: the dot belongs to the number.
                        Some('.') if !num.contains('.') && starts_repeat(&chars, i + 1) => {
                            num.push('.');
                        }
                        // Calculator notation: `6.02e23`, `2.5E-4` (an `e` right after
                        // digits and before an exponent, not Euler's number).
                        Some('e' | 'E') if !num.contains('e') => match exponent(&chars, i + 1) {
                            Some(exp) => {
                                num.push('e');
                                num.push_str(&exp.0);
                                i = exp.1;
                                continue;
                            }
                            None => break,
                        },
                        _ => {
                            // A thin space (or `{,}`) between digit groups joins them.
                            if let Some(skip) = thin_group(&chars, i) {
                                i += skip;
                                continue;
                            }
                            break;
                        }
                    }
                    i += 1;
                }
                out.push(Tok::Num(num));
            }
            '\\' => i = command(&chars, i, &mut out, depth),
            '{' => {
                // `{,}` is a LaTeX way to write a thousands comma.
                if chars.get(i) == Some(&',') && chars.get(i + 1) == Some(&'}') {
                    i += 2;
                    out.push(Tok::Comma);
                } else {
                    out.push(Tok::GroupOpen);
                }
            }
            '}' => out.push(Tok::GroupClose),
            '^' => {
                // `^\circ`, `^{\circ}`, `^o` are degrees.
                if let Some(skip) = degree_after_caret(&chars, i) {
                    i += skip;
                    out.push(Tok::Degree);
                } else {
                    out.push(Tok::Caret);
                }
            }
            '<' => {
                if chars.get(i) == Some(&'=') {
                    i += 1;
                    out.push(Tok::Rel(Rel::Le));
                } else {
                    out.push(Tok::Rel(Rel::Lt));
                }
            }
            '>' => {
                if chars.get(i) == Some(&'=') {
                    i += 1;
                    out.push(Tok::Rel(Rel::Ge));
                } else {
                    out.push(Tok::Rel(Rel::Gt));
                }
            }
            'π' => out.push(Tok::Name("pi".into())),
            c if c.is_alphabetic() => {
                let mut word = String::from(c);
                while let Some(d) = chars.get(i).filter(|d| d.is_alphabetic()) {
                    word.push(*d);
                    i += 1;
                }
                out.push(word_token(word));
            }
            c => out.push(symbol(c).unwrap_or_else(|| Tok::Word(c.to_string()))),
        }
    }
    out
}

/// The token a one-character symbol stands for, if it is one.
fn symbol(c: char) -> Option<Tok> {
    Some(match c {
        '(' | '[' | '⟨' => Tok::Open(if c == '⟨' { '<' } else { c }),
        ')' | ']' | '⟩' => Tok::Close(if c == '⟩' { '>' } else { c }),
        '+' => Tok::Plus,
        '-' | '−' | '–' | '‐' | '‑' => Tok::Minus,
        '±' => Tok::PlusMinus,
        '*' | '×' | '·' | '⋅' => Tok::Times,
        '/' | '÷' => Tok::Slash,
        '!' => Tok::Bang,
        '_' => Tok::Underscore,
        '=' => Tok::Rel(Rel::Eq),
        '≤' | '⩽' => Tok::Rel(Rel::Le),
        '≥' | '⩾' => Tok::Rel(Rel::Ge),
        '≠' => Tok::Rel(Rel::Ne),
        ',' => Tok::Comma,
        ';' => Tok::Semicolon,
        '|' => Tok::Bar,
        '⌊' => Tok::Open('⌊'),
        '⌋' => Tok::Close('⌋'),
        '⌈' => Tok::Open('⌈'),
        '⌉' => Tok::Close('⌉'),
        '&' => Tok::Amp,
        '%' => Tok::Percent,
        '°' | 'º' => Tok::Degree,
        '√' => Tok::Sqrt,
        '∞' => Tok::Infinity,
        '∪' => Tok::Cup,
        '∩' => Tok::Cap,
        _ => return None,
    })
}

/// A plain-text word: a function or constant name, one of the words that mean a token,
/// or a word of text. Single letters are variables (or choice letters).
fn word_token(word: String) -> Tok {
    match word.as_str() {
        "infinity" | "inf" | "infty" => Tok::Infinity,
        "percent" => Tok::Percent,
        "degrees" | "degree" | "deg" => Tok::Degree,
        "sqrt" => Tok::Sqrt,
        w if w.chars().count() == 1 || NAMES.contains(&w) => Tok::Name(word),
        _ => Tok::Word(word),
    }
}

/// At `chars[i]` (just after a digit): the length of a separator that is only ever
/// written inside a number (a thin space, `{,}`, `,\!`) followed by exactly three
/// digits, if that is what is there.
fn thin_group(chars: &[char], i: usize) -> Option<usize> {
    let (len, kind) = separators::at(chars, i)?;
    (kind == separators::Kind::Sure && separators::digits_from(chars, i + len) == 3).then_some(len)
}

/// After the `e` of calculator notation at `chars[i - 1]`: the exponent (signed
/// digits, not followed by a letter) and the index after it.
fn exponent(chars: &[char], i: usize) -> Option<(String, usize)> {
    let mut j = i;
    let mut exp = String::new();
    if let Some(sign @ ('+' | '-' | '−')) = chars.get(j) {
        if *sign != '+' {
            exp.push('-');
        }
        j += 1;
    }
    let start = j;
    while chars.get(j).is_some_and(char::is_ascii_digit) {
        exp.push(chars[j]);
        j += 1;
    }
    let is_exp = j > start && !chars.get(j).is_some_and(|c| c.is_alphabetic());
    is_exp.then_some((exp, j))
}

/// Whether a repeating-decimal command starts at `chars[i]`.
fn starts_repeat(chars: &[char], i: usize) -> bool {
    let rest: String = chars[i..].iter().take(9).collect();
    rest.starts_with("\\overline") || rest.starts_with("\\dot") || rest.starts_with("\\bar")
}

/// After `^`: the length of a degree sign (`\circ`, `{\circ}`, `o`), if one is there.
fn degree_after_caret(chars: &[char], i: usize) -> Option<usize> {
    let rest: String = chars[i..].iter().take(8).collect();
    if rest.starts_with("\\circ") {
        Some(5)
    } else if rest.starts_with("{\\circ}") {
        Some(7)
    } else if rest.starts_with("{o}") {
        Some(3)
    } else if rest.starts_with('o') && !chars.get(i + 1).is_some_and(|c| c.is_alphabetic()) {
        Some(1)
    } else {
        None
    }
}

/// The `{…}` argument starting at `chars[i]` (spaces before it skipped): its text and
/// the index after it. Braces inside balance.
pub fn group_arg(chars: &[char], mut i: usize) -> Option<(String, usize)> {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if chars.get(i) != Some(&'{') {
        return None;
    }
    let mut depth = 0usize;
    let start = i + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((chars[start..i].iter().collect(), i + 1));
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The token a command that only names one stands for (`\sqrt`, `\le`, `\cup`, …).
fn named_token(name: &str) -> Option<Tok> {
    Some(match name {
        "sqrt" => Tok::Sqrt,
        "times" | "cdot" | "ast" => Tok::Times,
        "div" => Tok::Slash,
        "pm" => Tok::PlusMinus,
        "le" | "leq" | "leqslant" | "leqq" => Tok::Rel(Rel::Le),
        "ge" | "geq" | "geqslant" | "geqq" => Tok::Rel(Rel::Ge),
        "lt" => Tok::Rel(Rel::Lt),
        "gt" => Tok::Rel(Rel::Gt),
        "ne" | "neq" => Tok::Rel(Rel::Ne),
        "infty" | "infin" => Tok::Infinity,
        "cup" => Tok::Cup,
        "cap" => Tok::Cap,
        "circ" | "degree" | "textdegree" => Tok::Degree,
        "langle" => Tok::Open('<'),
        "rangle" => Tok::Close('>'),
        "lbrace" => Tok::Open('{'),
        "rbrace" => Tok::Close('}'),
        "lbrack" => Tok::Open('['),
        "rbrack" => Tok::Close(']'),
        "lparen" => Tok::Open('('),
        "rparen" => Tok::Close(')'),
        "lfloor" => Tok::Open('⌊'),
        "rfloor" => Tok::Close('⌋'),
        "lceil" => Tok::Open('⌈'),
        "rceil" => Tok::Close('⌉'),
        "lvert" => Tok::Open('|'),
        "rvert" => Tok::Close('|'),
        "vert" | "mid" => Tok::Bar,
        "choose" => Tok::Choose,
        "over" => Tok::Over,
        _ => return None,
    })
}

/// A command after `\` at `chars[i]`: pushes its tokens, returns the index after it.
fn command(chars: &[char], i: usize, out: &mut Vec<Tok>, depth: usize) -> usize {
    let Some(&first) = chars.get(i) else {
        return i;
    };
    if !first.is_ascii_alphabetic() {
        out.extend(one_char_command(first));
        return i + 1;
    }
    let mut j = i;
    while chars.get(j).is_some_and(char::is_ascii_alphabetic) {
        j += 1;
    }
    let name: String = chars[i..j].iter().collect();
    match name.as_str() {
        "frac" | "dfrac" | "tfrac" | "cfrac" | "nicefrac" | "sfrac" | "binom" | "dbinom"
        | "tbinom" => {
            out.push(if name.ends_with("binom") {
                Tok::Binom
            } else {
                Tok::Frac
            });
            return digit_args(chars, j, out);
        }
        "overline" | "bar" | "dot" => {
            // A repeating decimal's period: `0.\overline{3}`, `0.\dot{3}`.
            if let Some((arg, after)) = group_arg(chars, j) {
                out.push(Tok::Repeat(
                    arg.chars().filter(char::is_ascii_digit).collect(),
                ));
                return after;
            }
            // `\bar x`: a mean or a conjugate, not x.
            out.push(Tok::Unknown(name.clone()));
        }
        "operatorname" | "abs" | "textcolor" => {
            return argument_command(&name, chars, j, out, depth);
        }
        n if DROPPED_WITH_ARG.contains(&n) => return argument_command(n, chars, j, out, depth),
        "text" | "textbf" | "textit" | "textnormal" | "textrm" | "textsf" | "texttt" | "textup"
        | "emph" | "mbox" | "mathrm" | "mathbf" | "mathit" => {
            if let Some((arg, after)) = group_arg(chars, j) {
                // `\mathrm{e}` and `\operatorname{sin}` are names; a word of text stays
                // a word (a unit, "or", "and", a choice letter).
                for tok in lex_argument(&arg, depth) {
                    out.push(match tok {
                        Tok::Name(n) if n.chars().count() > 1 && !NAMES.contains(&n.as_str()) => {
                            Tok::Word(n)
                        }
                        t => t,
                    });
                }
                return after;
            }
        }
        "begin" | "end" => {
            if let Some((env, after)) = group_arg(chars, j) {
                if env.ends_with("matrix") || env == "array" {
                    out.push(if name == "begin" {
                        Tok::BeginMatrix
                    } else {
                        Tok::EndMatrix
                    });
                }
                let mut after = after;
                // `\begin{array}{cc}`: the column spec goes.
                if env == "array"
                    && name == "begin"
                    && let Some((_, next)) = group_arg(chars, after)
                {
                    after = next;
                }
                return after;
            }
        }
        "left" | "right" | "bigl" | "bigr" | "Bigl" | "Bigr" | "biggl" | "biggr" | "Biggl"
        | "Biggr" => {
            // `\left|` and `\right|` say which side of an absolute value they are, which
            // a bare `|` does not.
            if let Some(after) = bar_after(chars, j) {
                let opens = name == "left" || name.ends_with('l');
                out.push(if opens {
                    Tok::Open('|')
                } else {
                    Tok::Close('|')
                });
                return after;
            }
        }
        "boxed" | "fbox" => {} // the box's group stays a group
        n if DROPPED.contains(&n) => {}
        n if named_token(n).is_some() => out.extend(named_token(n)),
        n if NAMES.contains(&n) || FOLDS.contains(&n) => out.push(Tok::Name(name.clone())),
        _ => out.push(Tok::Unknown(name.clone())),
    }
    j
}

/// The token of a one-character command (`\{`, `\%`, `\,`), if it stands for one.
fn one_char_command(c: char) -> Option<Tok> {
    Some(match c {
        '{' => Tok::Open('{'),
        '}' => Tok::Close('}'),
        '%' => Tok::Percent,
        '\\' => Tok::RowSep,
        '|' => Tok::Bar,
        // `\$`; the math delimiters `\(` `\)` `\[` `\]`; spacing (`\,` `\;` `\:` `\!`
        // `\>`, `\ `) and the italic correction `\/`.
        '$' | '(' | ')' | '[' | ']' | ',' | ';' | ':' | '!' | '>' | '/' => return None,
        c if c.is_whitespace() => return None,
        // `\#`, `\&`, `\_`, accents: not read.
        c => Tok::Unknown(c.to_string()),
    })
}

/// After `\frac` or `\binom` at `chars[j]`: LaTeX's shorthand of one digit per argument
/// (`\frac12`, `\binom 5 2`) split into its digits; the index after what was taken.
fn digit_args(chars: &[char], j: usize, out: &mut Vec<Tok>) -> usize {
    let mut k = j;
    for _ in 0..2 {
        while chars.get(k).is_some_and(|c| *c == ' ') {
            k += 1;
        }
        match chars.get(k) {
            Some(d) if d.is_ascii_digit() => {
                out.push(Tok::Num(d.to_string()));
                k += 1;
            }
            _ => return if k == j { j } else { k },
        }
    }
    k
}

/// A command read through its `{…}` argument (`chars[j]` on, after a `*` that
/// `\operatorname*` and `\hspace*` may have): pushes its tokens and returns the index
/// after the argument; without one it is unknown.
fn argument_command(
    name: &str,
    chars: &[char],
    j: usize,
    out: &mut Vec<Tok>,
    depth: usize,
) -> usize {
    let star = usize::from(chars.get(j) == Some(&'*') && name != "abs" && name != "textcolor");
    let Some((arg, after)) = group_arg(chars, j + star) else {
        out.push(Tok::Unknown(name.to_string()));
        return j;
    };
    match name {
        // `\operatorname*{max}` is the same operator, its limits placed otherwise.
        "operatorname" => out.push(operator(&arg)),
        // `\abs{x}` (the physics package's).
        "abs" => {
            out.push(Tok::Open('|'));
            out.extend(lex_argument(&arg, depth));
            out.push(Tok::Close('|'));
        }
        // `\textcolor{red}{5}`: the colour goes, the coloured group stays; the other
        // commands here go with their argument.
        _ => {}
    }
    after
}

/// The tokens of a command's argument lexed on its own, one level deeper than `depth`;
/// past [`MAX_NESTED`], [`Tok::TooDeep`].
fn lex_argument(arg: &str, depth: usize) -> Vec<Tok> {
    if depth >= MAX_NESTED {
        return vec![Tok::TooDeep];
    }
    lex_nested(arg, depth + 1)
}

/// The token of `\operatorname{name}`: a function the grader evaluates, or unknown
/// (`\operatorname{sgn}` dropped would leave its argument as the answer).
fn operator(name: &str) -> Tok {
    let name = name.trim();
    let known =
        NAMES.contains(&name) || FOLDS.contains(&name) || ["floor", "ceil", "abs"].contains(&name);
    if known {
        Tok::Name(name.to_string())
    } else if name.len() <= 16 && name.chars().all(|c| c.is_ascii_alphabetic()) {
        Tok::Unknown(format!("operatorname{{{name}}}"))
    } else {
        // Not an operator's name at all; not repeated in the verdict either.
        Tok::Unknown("operatorname".into())
    }
}

/// After `\left` (or `\bigl`, …) at `chars[i]`: the index after a bar there (`|`,
/// `\vert`, `\lvert`, `\rvert`), if one is.
fn bar_after(chars: &[char], mut i: usize) -> Option<usize> {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    if chars.get(i) == Some(&'|') {
        return Some(i + 1);
    }
    let rest: String = chars.get(i..)?.iter().take(7).collect();
    ["\\vert", "\\lvert", "\\rvert"].iter().find_map(|cmd| {
        let end = i + cmd.len();
        (rest.starts_with(cmd) && !chars.get(end).is_some_and(char::is_ascii_alphabetic))
            .then_some(end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Tok {
        Tok::Num(s.into())
    }

    #[test]
    fn spellings_of_one_thing_are_one_token() {
        assert_eq!(lex("\\dfrac{1}{2}"), lex("\\frac{1}{2}"));
        assert_eq!(lex("−3"), vec![Tok::Minus, num("3")]);
        assert_eq!(lex("x \\leq 3"), lex("x ≤ 3"));
        assert_eq!(lex("30^\\circ"), vec![num("30"), Tok::Degree]);
        assert_eq!(lex("30^{\\circ}"), lex("30°"));
        assert_eq!(lex("\\left( 1, 2 \\right)"), lex("(1,2)"));
    }

    #[test]
    fn thin_spaces_join_digit_groups_and_commas_stay() {
        assert_eq!(lex("1\\,000\\,000"), vec![num("1000000")]);
        assert_eq!(lex("12\u{2009}345"), vec![num("12345")]);
        assert_eq!(lex("1{,}000"), vec![num("1000")]);
        assert_eq!(lex("1,\\!000,\\!000"), vec![num("1000000")]);
        assert_eq!(lex("1~000"), vec![num("1000")]);
        // A comma with a negative space before anything but a digit group is a comma.
        assert_eq!(lex("1,\\!00"), vec![num("1"), Tok::Comma, num("00")]);
        assert_eq!(lex("6.02e23"), vec![num("6.02e23")]);
        assert_eq!(lex("2.5E−4"), vec![num("2.5e-4")]);
        // `2e` and `2e^x` keep Euler's number.
        assert_eq!(lex("2e"), vec![num("2"), Tok::Name("e".into())]);
        assert_eq!(lex("1,000"), vec![num("1"), Tok::Comma, num("000")]);
        // Not three digits after the space: two numbers.
        assert_eq!(lex("1\\,00"), vec![num("1"), num("00")]);
    }

    #[test]
    fn unknown_commands_are_kept_as_unknown_and_known_ones_are_tokens() {
        let unknown = |s: &str| Tok::Unknown(s.into());
        assert_eq!(lex("\\neg 5"), vec![unknown("neg"), num("5")]);
        assert_eq!(
            lex("\\foo{3}"),
            vec![unknown("foo"), Tok::GroupOpen, num("3"), Tok::GroupClose]
        );
        assert_eq!(lex("\\bar x"), vec![unknown("bar"), Tok::Name("x".into())]);
        assert_eq!(lex("\\#1"), vec![unknown("#"), num("1")]);
        assert_eq!(
            lex("\\operatorname{sgn}(x)")[0],
            unknown("operatorname{sgn}")
        );
        assert_eq!(lex("\\operatorname*{max}")[0], Tok::Name("max".into()));
        assert_eq!(lex("\\gcd")[0], Tok::Name("gcd".into()));
        assert_eq!(lex("\\dbinom{5}{2}"), lex("\\binom{5}{2}"));
        assert_eq!(lex("\\binom52"), vec![Tok::Binom, num("5"), num("2")]);
        assert_eq!(
            lex("\\left\\lfloor x \\right\\rfloor"),
            vec![Tok::Open('⌊'), Tok::Name("x".into()), Tok::Close('⌋')]
        );
        assert_eq!(lex("\\lceil x\\rceil"), lex("⌈x⌉"));
        let abs = vec![Tok::Open('|'), Tok::Name("x".into()), Tok::Close('|')];
        assert_eq!(lex("\\left| x \\right|"), abs);
        assert_eq!(lex("\\left\\vert x \\right\\vert"), abs);
        assert_eq!(lex("\\lvert x \\rvert"), abs);
        assert_eq!(lex("\\abs{x}"), abs);
        assert_eq!(lex("|x|"), vec![Tok::Bar, Tok::Name("x".into()), Tok::Bar]);
        // Spacing, invisible and colour commands go, with their arguments.
        assert_eq!(lex("\\hspace*{1em}7\\phantom{0}"), vec![num("7")]);
        assert_eq!(lex("\\textcolor{red}{7}"), lex("{7}"));
        assert_eq!(lex("\\left. 7 \\right."), lex(". 7 ."));
    }

    #[test]
    fn repeating_decimals_keep_their_period() {
        assert_eq!(
            lex("0.\\overline{3}"),
            vec![num("0."), Tok::Repeat("3".into())]
        );
        assert_eq!(
            lex("0.1\\overline{36}"),
            vec![num("0.1"), Tok::Repeat("36".into())]
        );
    }

    #[test]
    fn text_becomes_words_and_names_stay_names() {
        assert_eq!(lex("5\\text{ cm}"), vec![num("5"), Tok::Word("cm".into())]);
        assert_eq!(
            lex("\\text{(B)}"),
            vec![Tok::Open('('), Tok::Name("B".into()), Tok::Close(')')]
        );
        assert_eq!(
            lex("\\sin x"),
            vec![Tok::Name("sin".into()), Tok::Name("x".into())]
        );
        assert_eq!(
            lex("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
            vec![
                Tok::BeginMatrix,
                num("1"),
                Tok::Amp,
                num("2"),
                Tok::RowSep,
                num("3"),
                Tok::Amp,
                num("4"),
                Tok::EndMatrix
            ]
        );
    }
}
