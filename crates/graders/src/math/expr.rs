//! What an answer means: expressions, and the shapes answers come in (tuples, sets,
//! intervals, relations, matrices, choice letters), parsed from [`lex`](super::lex)
//! tokens.
//!
//! Numbers are exact rationals as written (`0.1` is 1/10, `6.02e23` is 602·10²¹,
//! `0.\overline{3}` is 1/3), so a rounded decimal is never mistaken for the exact value
//! it approximates. Juxtaposition multiplies (`2x`, `2\pi`, `x(y+1)`), except that a
//! whole number right before a fraction of whole numbers is a mixed number (`3\frac12`
//! and `3 1/2` are 7/2), as a reader takes them. So does a function written without
//! parentheses: it applies to the product that follows it (`\sin 2x` is sin(2x), not
//! sin(2)·x; `\sin x \cos x` is sin(x)·cos(x)).
//!
//! Beyond arithmetic, roots, powers and the elementary functions, an answer may use
//! binomial coefficients (`\binom`, `{n \choose k}`), floors and ceilings, `\min`,
//! `\max`, `\gcd` and `lcm`, factorials and absolute values; a factorial or binomial
//! coefficient of constants too large to compute makes the answer unreadable
//! ([`integer`](super::integer)).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Zero};

use super::lex::{Rel, Tok};
use super::value;

pub use super::tree::{Expr, Fold};

/// The shape of a whole answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// One expression.
    Expr(Expr),
    /// `a op b op c …`: an equation (`x = 3`, `y = 2x + 1`) or an inequality chain
    /// (`1 < x \le 3`).
    Relation(Vec<Expr>, Vec<Rel>),
    /// A bracketed list: `(1, 2)`, `[0, 1)`, `\{1, 2\}`, `\langle 1, 2 \rangle`.
    Bracketed {
        /// The opening bracket.
        open: char,
        /// The closing bracket.
        close: char,
        /// The items.
        items: Vec<Answer>,
    },
    /// A bare list `1, 2, 3` (or with "and" / ";"), or `a \pm b`.
    List(Vec<Answer>),
    /// Intervals (or sets) joined by `\cup`.
    Union(Vec<Answer>),
    /// A matrix, row by row.
    Matrix(Vec<Vec<Expr>>),
    /// A multiple-choice letter.
    Letter(char),
}

/// Why an answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the answer: {0}")]
pub struct ParseError(pub String);

type Result<T> = std::result::Result<T, ParseError>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(ParseError(msg.into()))
}

/// The exact value of a decimal written as `digits[.digits][e±digits]`.
pub fn decimal(text: &str) -> Option<BigRational> {
    let (mantissa, exp) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    // Past this, `1e999999` would be a million-digit number to build: no answer is.
    if exp.unsigned_abs() > 4096 {
        return None;
    }
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits: BigInt = format!("{int}{frac}").parse().ok()?;
    let scale = i32::try_from(frac.len()).ok()? - exp;
    let ten = BigInt::from(10);
    Some(if scale >= 0 {
        BigRational::new(digits, ten.pow(scale.unsigned_abs()))
    } else {
        BigRational::from_integer(digits * ten.pow(scale.unsigned_abs()))
    })
}

/// `whole` followed by the period `repeat`, as in 0.1\overline{36}: the exact fraction.
fn repeating(whole: &str, repeat: &str) -> Option<BigRational> {
    if repeat.is_empty() {
        return decimal(whole.trim_end_matches('.'));
    }
    let base = decimal(whole.trim_end_matches('.'))?;
    let frac_len = whole.split_once('.').map_or(0, |(_, f)| f.len());
    let ten = BigInt::from(10);
    let period: BigInt = repeat.parse().ok()?;
    let n = u32::try_from(repeat.len()).ok()?;
    let shift = u32::try_from(frac_len).ok()?;
    // 0.d₁…dₖ(p) = base + p / ((10ⁿ − 1) · 10ᵏ)
    let denom = (ten.pow(n) - BigInt::one()) * ten.pow(shift);
    Some(base + BigRational::new(period, denom))
}

/// A parser over one answer's tokens.
struct Parser<'a> {
    toks: &'a [Tok],
    pos: usize,
    /// How deeply nested the parse is now: bounded by [`MAX_DEPTH`].
    depth: usize,
    /// How many `|…|` are open here: inside one, a `|` closes it rather than starting
    /// a juxtaposed `|…|` (`2|x|` is 2·|x|, but `|x|` is not x·|…).
    bars: usize,
}

/// The deepest nesting of brackets and groups read. A policy can write `((((…))))` a
/// million deep; the grader answers "too deep" instead of running out of stack.
const MAX_DEPTH: usize = 48;

/// The most tokens an answer may have: final answers are short, and long ones would
/// only cost time (and, as a chain `1+1+…`, a deep expression tree).
pub const MAX_TOKENS: usize = 400;

/// Parses a whole answer.
pub fn parse(toks: &[Tok]) -> Result<Answer> {
    let toks: Vec<Tok> = strip_words(toks);
    if toks.is_empty() {
        return err("nothing to read");
    }
    // A command the grader does not know may mean anything (`\neg 5` is not -5): the
    // answer is unreadable rather than read without it.
    match toks
        .iter()
        .find(|t| matches!(t, Tok::Unknown(_) | Tok::TooDeep))
    {
        Some(Tok::Unknown(command)) => {
            return err(format!(
                "the command \\{command} is not one the grader reads"
            ));
        }
        Some(_) => return err("commands nested too deep"),
        None => {}
    }
    if toks.len() > MAX_TOKENS {
        return err(format!(
            "{} tokens is too long for a final answer (at most {MAX_TOKENS})",
            toks.len()
        ));
    }
    if let Some(letter) = choice_letter(&toks) {
        return Ok(Answer::Letter(letter));
    }
    // `(D) 12`: a choice's label before its value; the value is the answer.
    if let [Tok::Open('('), Tok::Name(n), Tok::Close(')'), rest @ ..] = toks.as_slice()
        && !rest.is_empty()
        && n.len() == 1
        && n.chars().all(|c| ('A'..='J').contains(&c))
    {
        return parse(rest);
    }
    let mut p = Parser {
        toks: &toks,
        pos: 0,
        depth: 0,
        bars: 0,
    };
    let a = p.answer()?;
    if p.pos < toks.len() {
        return err(format!("unexpected {:?}", toks[p.pos]));
    }
    Ok(a)
}

/// Words of functions that are applied when a bracket follows them (`max(3, 5)`,
/// `\text{lcm}(4, 6)`, `\operatorname{floor}(x)`); without one they are words ("5 min").
const APPLIED_WORDS: &[&str] = &["min", "max", "gcd", "lcm", "floor", "ceil", "abs"];

/// Words of functions the grader does not evaluate: applied (`\mathrm{sgn}(x)`), they
/// make the answer unreadable instead of dropping out and leaving their argument.
const UNREAD_WORDS: &[&str] = &["sgn", "sign", "det", "tr", "arg", "erf", "Re", "Im"];

/// Drops words that are units or filler at the end or between a number and what
/// follows; keeps "and"/"or" as list separators (a comma), and a function's word
/// before its bracket as the function.
fn strip_words(toks: &[Tok]) -> Vec<Tok> {
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let bracket_next = matches!(toks.get(i + 1), Some(Tok::Open('(' | '{')));
        match &toks[i] {
            Tok::Word(w) if w == "and" || w == "or" => out.push(Tok::Comma),
            Tok::Word(w) if bracket_next && APPLIED_WORDS.contains(&w.as_str()) => {
                out.push(Tok::Name(w.clone()));
            }
            Tok::Word(w) if bracket_next && UNREAD_WORDS.contains(&w.as_str()) => {
                out.push(Tok::Unknown(w.clone()));
            }
            Tok::Word(_) => {
                // A unit's power goes with it: `\text{cm}^2`, `\text{m}^{3}`.
                if toks.get(i + 1) == Some(&Tok::Caret) {
                    match (toks.get(i + 2), toks.get(i + 3), toks.get(i + 4)) {
                        (Some(Tok::Num(_)), _, _) => i += 2,
                        (Some(Tok::GroupOpen), Some(Tok::Num(_)), Some(Tok::GroupClose)) => i += 4,
                        _ => {}
                    }
                }
            }
            t => out.push(t.clone()),
        }
        i += 1;
    }
    out
}

/// `B`, `(B)`, `B)`, `[B]`: a lone capital letter A–J.
fn choice_letter(toks: &[Tok]) -> Option<char> {
    let inner: Vec<&Tok> = toks
        .iter()
        .filter(|t| {
            !matches!(
                t,
                Tok::Open('(' | '[' | '{' | '<')
                    | Tok::Close(')' | ']' | '}' | '>')
                    | Tok::GroupOpen
                    | Tok::GroupClose
            )
        })
        .collect();
    match inner.as_slice() {
        [Tok::Name(n)] => {
            let c = n.chars().next()?;
            (n.len() == 1 && ('A'..='J').contains(&c)).then_some(c)
        }
        _ => None,
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_at(&self, k: usize) -> Option<&Tok> {
        self.toks.get(self.pos + k)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, t: &Tok) -> Result<()> {
        if self.eat(t) {
            Ok(())
        } else {
            err(format!("expected {t:?}, found {:?}", self.peek()))
        }
    }

    /// answer := union (`,` union)*
    fn answer(&mut self) -> Result<Answer> {
        let first = self.union()?;
        if !matches!(self.peek(), Some(Tok::Comma | Tok::Semicolon)) {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat(&Tok::Comma) || self.eat(&Tok::Semicolon) {
            if self.peek().is_none() {
                break;
            }
            items.push(self.union()?);
        }
        Ok(Answer::List(items))
    }

    /// union := relation (`\cup` relation)*
    fn union(&mut self) -> Result<Answer> {
        let first = self.relation()?;
        if self.peek() != Some(&Tok::Cup) {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat(&Tok::Cup) {
            parts.push(self.relation()?);
        }
        Ok(Answer::Union(parts))
    }

    /// relation := item (rel item)*
    fn relation(&mut self) -> Result<Answer> {
        let first = self.item()?;
        if !matches!(self.peek(), Some(Tok::Rel(_))) {
            return Ok(first);
        }
        let first = match first {
            Answer::Expr(e) => e,
            // `(a, b) = (3, 5)`: the names of a tuple bound to its values; the right side
            // is the answer.
            Answer::Bracketed { .. } if self.eat(&Tok::Rel(Rel::Eq)) => return self.item(),
            _ => return err("a relation between lists"),
        };
        let (mut sides, mut rels) = (vec![first], Vec::new());
        while let Some(Tok::Rel(r)) = self.peek().cloned() {
            self.pos += 1;
            rels.push(r);
            match self.item()? {
                Answer::Expr(e) => sides.push(e),
                // `x = 1, 2`-style and `(x, y) = (1, 2)` answers: the right side is the
                // answer.
                other if sides.len() == 1 && rels == [Rel::Eq] => return Ok(other),
                _ => return err("a relation between lists"),
            }
        }
        Ok(Answer::Relation(sides, rels))
    }

    /// item := bracketed list | matrix | `a \pm b` | expression
    fn item(&mut self) -> Result<Answer> {
        self.nested(Self::item_inner)
    }

    /// Runs `f` one level deeper, refusing past [`MAX_DEPTH`].
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if self.depth >= MAX_DEPTH {
            return err(format!("nested more than {MAX_DEPTH} deep"));
        }
        self.depth += 1;
        let out = f(self);
        self.depth -= 1;
        out
    }

    fn item_inner(&mut self) -> Result<Answer> {
        match self.peek() {
            Some(Tok::BeginMatrix) => return self.matrix(),
            Some(Tok::Open(c @ ('(' | '[' | '{' | '<'))) if self.is_list_ahead() => {
                let open = *c;
                self.pos += 1;
                let mut items = vec![self.union()?];
                while self.eat(&Tok::Comma) || self.eat(&Tok::Semicolon) {
                    items.push(self.union()?);
                }
                let Some(Tok::Close(close)) = self.next() else {
                    return err("an unclosed list");
                };
                return Ok(Answer::Bracketed { open, close, items });
            }
            Some(Tok::GroupOpen) if self.is_list_ahead() => {
                // `{1, 2}` written without escaping the braces: a set.
                self.pos += 1;
                let mut items = vec![self.union()?];
                while self.eat(&Tok::Comma) {
                    items.push(self.union()?);
                }
                self.expect(&Tok::GroupClose)?;
                return Ok(Answer::Bracketed {
                    open: '{',
                    close: '}',
                    items,
                });
            }
            // `\pm 2`: both signs.
            Some(Tok::PlusMinus) => {
                self.pos += 1;
                let d = self.expr()?;
                return Ok(Answer::List(vec![
                    Answer::Expr(d.clone()),
                    Answer::Expr(Expr::Neg(Box::new(d))),
                ]));
            }
            _ => {}
        }
        // `10 \choose 2` boxed: TeX's `\choose` and `\over` take the whole group.
        let e = self.expr()?;
        let e = self.infix_group_op(e)?;
        if self.eat(&Tok::PlusMinus) {
            let d = self.expr()?;
            return Ok(Answer::List(vec![
                Answer::Expr(Expr::Add(Box::new(e.clone()), Box::new(d.clone()))),
                Answer::Expr(Expr::Add(Box::new(e), Box::new(Expr::Neg(Box::new(d))))),
            ]));
        }
        Ok(Answer::Expr(e))
    }

    /// Whether the bracket at `pos` holds a top-level comma before it closes (a list,
    /// not a parenthesised expression). A bracket of another kind may close it
    /// (`[0, 1)`).
    fn is_list_ahead(&self) -> bool {
        let mut depth = 0i32;
        for t in &self.toks[self.pos..] {
            match t {
                Tok::Open(_) | Tok::GroupOpen => depth += 1,
                Tok::Close(_) | Tok::GroupClose => {
                    depth -= 1;
                    if depth == 0 {
                        return false;
                    }
                }
                Tok::Comma | Tok::Semicolon if depth == 1 => return true,
                _ => {}
            }
        }
        false
    }

    fn matrix(&mut self) -> Result<Answer> {
        self.expect(&Tok::BeginMatrix)?;
        let mut rows = vec![Vec::new()];
        loop {
            match self.peek() {
                Some(Tok::EndMatrix) => {
                    self.pos += 1;
                    break;
                }
                Some(Tok::Amp) => self.pos += 1,
                Some(Tok::RowSep) => {
                    self.pos += 1;
                    rows.push(Vec::new());
                }
                None => return err("an unclosed matrix"),
                _ => {
                    let e = self.expr()?;
                    rows.last_mut().expect("a row").push(e);
                }
            }
        }
        rows.retain(|r| !r.is_empty());
        Ok(Answer::Matrix(rows))
    }

    /// expr := term ((`+`|`-`) term)*
    fn expr(&mut self) -> Result<Expr> {
        self.nested(Self::expr_inner)
    }

    fn expr_inner(&mut self) -> Result<Expr> {
        let mut e = match self.peek() {
            Some(Tok::Minus) => {
                self.pos += 1;
                Expr::Neg(Box::new(self.term()?))
            }
            Some(Tok::Plus) => {
                self.pos += 1;
                self.term()?
            }
            _ => self.term()?,
        };
        loop {
            match self.peek() {
                Some(Tok::Plus) => {
                    self.pos += 1;
                    e = Expr::Add(Box::new(e), Box::new(self.term()?));
                }
                Some(Tok::Minus) => {
                    self.pos += 1;
                    let t = self.term()?;
                    e = Expr::Add(Box::new(e), Box::new(Expr::Neg(Box::new(t))));
                }
                _ => return Ok(e),
            }
        }
    }

    /// term := factor ((`*`|`/`| juxtaposition) factor)*
    fn term(&mut self) -> Result<Expr> {
        let mut e = self.unary()?;
        loop {
            match self.peek() {
                Some(Tok::Times) => {
                    self.pos += 1;
                    e = Expr::Mul(Box::new(e), Box::new(self.unary()?));
                }
                Some(Tok::Slash) => {
                    self.pos += 1;
                    e = Expr::Div(Box::new(e), Box::new(self.unary()?));
                }
                Some(t) if starts_factor(t) || (*t == Tok::Bar && self.bars == 0) => {
                    let number_next = matches!(t, Tok::Num(_));
                    if let Some(mixed) = self.mixed_number(&e)? {
                        e = mixed;
                        continue;
                    }
                    if number_next {
                        // `12 345` or `2 3`: digit groups or two numbers, never a product.
                        return err("two numbers side by side");
                    }
                    e = Expr::Mul(Box::new(e), Box::new(self.postfix()?));
                }
                _ => return Ok(e),
            }
        }
    }

    /// After a whole number `e`: a fraction of whole numbers right after it makes a
    /// mixed number (`3\frac{1}{2}`, `3 1/2`).
    fn mixed_number(&mut self, e: &Expr) -> Result<Option<Expr>> {
        let Expr::Num(whole) = e else {
            return Ok(None);
        };
        if !whole.is_integer() {
            return Ok(None);
        }
        let save = self.pos;
        let frac = match (self.peek(), self.peek_at(1), self.peek_at(2)) {
            (Some(Tok::Frac), _, _) => {
                self.pos += 1;
                let num = self.group()?;
                let den = self.group()?;
                match (num, den) {
                    (Expr::Num(a), Expr::Num(b))
                        if a.is_integer() && b.is_integer() && !b.is_zero() && a < b =>
                    {
                        Some(a / b)
                    }
                    _ => None,
                }
            }
            (Some(Tok::Num(a)), Some(Tok::Slash), Some(Tok::Num(b))) => {
                match (decimal(a), decimal(b)) {
                    (Some(a), Some(b))
                        if !a.is_zero()
                            && a.is_integer()
                            && b.is_integer()
                            && !b.is_zero()
                            && a < b
                            && !matches!(self.peek_at(3), Some(Tok::Caret)) =>
                    {
                        self.pos += 3;
                        Some(a / b)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        match frac {
            Some(f) => {
                let value = if whole < &BigRational::zero() {
                    whole - f
                } else {
                    whole + f
                };
                Ok(Some(Expr::Num(value)))
            }
            None => {
                self.pos = save;
                Ok(None)
            }
        }
    }

    /// unary := `-` unary | postfix
    fn unary(&mut self) -> Result<Expr> {
        if self.eat(&Tok::Minus) {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        if self.eat(&Tok::Plus) {
            return self.unary();
        }
        self.postfix()
    }

    /// postfix := power (`!` | `%` | `°`)*
    fn postfix(&mut self) -> Result<Expr> {
        let mut e = self.power()?;
        loop {
            match self.peek() {
                // `5!!` is a double factorial, not (5!)!.
                Some(Tok::Bang) if self.peek_at(1) == Some(&Tok::Bang) => {
                    return err("a double factorial");
                }
                Some(Tok::Bang) => e = sized(Expr::Fact(Box::new(e)))?,
                Some(Tok::Percent) => e = Expr::Percent(Box::new(e)),
                Some(Tok::Degree) => e = Expr::Degrees(Box::new(e)),
                _ => return Ok(e),
            }
            self.pos += 1;
        }
    }

    /// power := atom (`^` unary-atom)?  (right-associative)
    fn power(&mut self) -> Result<Expr> {
        let base = self.atom()?;
        if self.eat(&Tok::Caret) {
            let exp = if self.peek() == Some(&Tok::GroupOpen) {
                self.group()?
            } else if self.eat(&Tok::Minus) {
                Expr::Neg(Box::new(self.power()?))
            } else {
                self.power()?
            };
            return Ok(Expr::Pow(Box::new(base), Box::new(exp)));
        }
        Ok(base)
    }

    /// A `{…}` group, or (LaTeX's shorthand) one digit or one name: `\frac12`.
    fn group(&mut self) -> Result<Expr> {
        match self.peek().cloned() {
            Some(Tok::GroupOpen) => {
                self.pos += 1;
                self.group_body()
            }
            Some(Tok::Num(n)) => {
                // `\frac12`: the lexer splits the digits.
                self.pos += 1;
                Ok(Expr::Num(
                    decimal(&n).ok_or_else(|| ParseError(format!("not a number: {n}")))?,
                ))
            }
            _ => self.atom(),
        }
    }

    /// The rest of a `{…}` group after its `{`: an expression, or TeX's infix
    /// `{n \choose k}` and `{a \over b}`.
    fn group_body(&mut self) -> Result<Expr> {
        let e = self.with_bars(0, Self::expr)?;
        let e = self.infix_group_op(e)?;
        self.expect(&Tok::GroupClose)?;
        Ok(e)
    }

    /// After `e`, TeX's infix `\choose` or `\over` and its second operand, if one is
    /// there: `e` choose it, or `e` over it.
    fn infix_group_op(&mut self, e: Expr) -> Result<Expr> {
        if self.eat(&Tok::Choose) {
            let k = self.expr()?;
            return sized(Expr::Binom(Box::new(e), Box::new(k)));
        }
        if self.eat(&Tok::Over) {
            let d = self.expr()?;
            return Ok(Expr::Div(Box::new(e), Box::new(d)));
        }
        Ok(e)
    }

    /// atom := number | name | function | `\frac` | `\binom` | `\sqrt` | ( expr ) |
    /// { expr } | |expr| | ⌊expr⌋ | ⌈expr⌉ | ∞
    fn atom(&mut self) -> Result<Expr> {
        let Some(t) = self.next() else {
            return err("the answer ends too early");
        };
        match t {
            Tok::Num(n) => {
                if let Some(Tok::Repeat(r)) = self.peek().cloned() {
                    self.pos += 1;
                    return repeating(&n, &r)
                        .map(Expr::Num)
                        .ok_or_else(|| ParseError(format!("{n}…{r}")));
                }
                decimal(&n)
                    .map(Expr::Num)
                    .ok_or_else(|| ParseError(format!("not a number: {n}")))
            }
            Tok::Infinity => Ok(Expr::Infinity),
            Tok::Frac => {
                let num = self.group()?;
                let den = self.group()?;
                Ok(Expr::Div(Box::new(num), Box::new(den)))
            }
            Tok::Sqrt => {
                let index = if self.peek() == Some(&Tok::Open('[')) {
                    self.pos += 1;
                    let n = self.expr()?;
                    self.expect(&Tok::Close(']'))?;
                    n
                } else {
                    Expr::Num(BigRational::from_integer(2.into()))
                };
                let radicand = match self.peek() {
                    Some(Tok::Open('(')) => self.atom()?,
                    _ => self.group()?,
                };
                Ok(Expr::Root(Box::new(index), Box::new(radicand)))
            }
            Tok::Open(c @ ('(' | '[')) => {
                let e = self.with_bars(0, Self::expr)?;
                let close = if c == '(' { ')' } else { ']' };
                self.expect(&Tok::Close(close))?;
                Ok(e)
            }
            Tok::GroupOpen => self.group_body(),
            Tok::Binom => {
                let n = self.group()?;
                let k = self.group()?;
                sized(Expr::Binom(Box::new(n), Box::new(k)))
            }
            Tok::Open(c @ ('⌊' | '⌈' | '|')) => {
                let e = self.with_bars(0, Self::expr)?;
                let (close, f): (char, fn(Box<Expr>) -> Expr) = match c {
                    '⌊' => ('⌋', Expr::Floor),
                    '⌈' => ('⌉', Expr::Ceil),
                    _ => ('|', Expr::Abs),
                };
                self.expect(&Tok::Close(close))?;
                Ok(f(Box::new(e)))
            }
            Tok::Bar => {
                let e = self.with_bars(self.bars + 1, Self::expr)?;
                self.expect(&Tok::Bar)?;
                Ok(Expr::Abs(Box::new(e)))
            }
            Tok::Name(n) => self.name(n),
            other => err(format!("unexpected {other:?}")),
        }
    }

    /// A name: a function (applied to what follows), `\log_b`, or a variable/constant.
    fn name(&mut self, n: String) -> Result<Expr> {
        if let Some(fold) = Fold::named(&n) {
            return Ok(Expr::Fold(fold, self.bracketed_args()?));
        }
        if let Some(f) = bracketed_function(&n) {
            let mut args = self.bracketed_args()?;
            return match (args.pop(), args.is_empty()) {
                (Some(arg), true) => Ok(f(Box::new(arg))),
                _ => err(format!("{n} of more than one argument")),
            };
        }
        if !FUNCS.contains(&n.as_str()) {
            return Ok(Expr::Name(n));
        }
        let base = if n == "log" && self.eat(&Tok::Underscore) {
            Some(self.group()?)
        } else {
            None
        };
        // `\sin^2 x` is (sin x)².
        let mut power = if self.eat(&Tok::Caret) {
            Some(self.group()?)
        } else {
            None
        };
        let mut n = n;
        // `\sin^{-1} x` is arcsin x, as a reader takes it; for the functions whose
        // inverse the grader does not evaluate, it is neither that nor a reciprocal.
        if power.as_ref().is_some_and(is_minus_one) {
            match n.as_str() {
                "sin" | "cos" | "tan" => {
                    n = format!("arc{n}");
                    power = None;
                }
                _ => return err(format!("the inverse {n}^{{-1}}")),
            }
        }
        let arg = self.argument()?;
        let applied = match (n.as_str(), base) {
            (_, Some(b)) => Expr::Log(Box::new(b), Box::new(arg)),
            // Unmarked `log` is taken as natural, as in most competition answers' CAS.
            ("log" | "ln", None) => Expr::Func("ln".into(), Box::new(arg)),
            ("lg", None) => Expr::Log(
                Box::new(Expr::Num(BigRational::from_integer(10.into()))),
                Box::new(arg),
            ),
            _ => Expr::Func(n, Box::new(arg)),
        };
        Ok(match power {
            Some(p) => Expr::Pow(Box::new(applied), Box::new(p)),
            None => applied,
        })
    }

    /// A function's argument. In brackets, what they hold (`\sin(2x)`, `\sin{2x}`; so
    /// `\sin(x)^2` is (sin x)², the power after the application). Without them, the
    /// usual reading: the product that follows, a coefficient and then names and their
    /// powers (`\sin 2x` is sin(2x), `\ln 2\pi r` is ln(2πr), `\sin x^2` is sin(x²)),
    /// ending at anything else: `+`, `-`, a relation, `\cdot`, `/`, a bracket, a
    /// number, or another function (`\sin x \cos x` is sin(x)·cos(x)).
    fn argument(&mut self) -> Result<Expr> {
        if matches!(self.peek(), Some(Tok::Open('(' | '[') | Tok::GroupOpen)) {
            return self.atom();
        }
        let mut arg = self.unary()?;
        while matches!(self.peek(), Some(Tok::Name(m)) if !is_function(m)) {
            arg = Expr::Mul(Box::new(arg), Box::new(self.postfix()?));
        }
        Ok(arg)
    }

    /// The arguments of `\max(a, b)`, `\gcd\{a, b\}`, `\min{a, b}`: at least one, in
    /// brackets (`\max 3, 5` could be the list of `\max 3` and 5).
    fn bracketed_args(&mut self) -> Result<Vec<Expr>> {
        let close = match self.next() {
            Some(Tok::Open('(')) => Tok::Close(')'),
            Some(Tok::Open('{')) => Tok::Close('}'),
            Some(Tok::GroupOpen) => Tok::GroupClose,
            other => return err(format!("a function's arguments in brackets, not {other:?}")),
        };
        let mut args = vec![self.with_bars(0, Self::expr)?];
        while self.eat(&Tok::Comma) {
            args.push(self.with_bars(0, Self::expr)?);
        }
        self.expect(&close)?;
        Ok(args)
    }

    /// Runs `f` with `bars` plain `|…|` open: one more inside `|…|`, none inside a
    /// bracket or group (whose own `|` start new absolute values: `(2|x|)`).
    fn with_bars<T>(&mut self, bars: usize, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let outer = std::mem::replace(&mut self.bars, bars);
        let out = f(self);
        self.bars = outer;
        out
    }
}

/// Whether a name is a function's: it is applied to what follows, and ends the
/// argument of a function before it (`\sin x \max(…)`).
fn is_function(name: &str) -> bool {
    FUNCS.contains(&name) || Fold::named(name).is_some() || bracketed_function(name).is_some()
}

/// The functions of one argument written by name with brackets (`floor(x)`, from plain
/// text or `\operatorname{}`): what they build.
fn bracketed_function(name: &str) -> Option<fn(Box<Expr>) -> Expr> {
    Some(match name {
        "floor" => Expr::Floor,
        "ceil" => Expr::Ceil,
        "abs" => Expr::Abs,
        _ => return None,
    })
}

/// `e` itself, unless it is a factorial or binomial coefficient of constants too large
/// to compute: then the answer is unreadable (a reader cannot write it out either).
fn sized(e: Expr) -> Result<Expr> {
    match value::too_large(&e) {
        Some(t) => err(t.to_string()),
        None => Ok(e),
    }
}

/// The names applied to what follows them.
const FUNCS: &[&str] = &[
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "ln", "exp", "lg", "log",
];

/// Whether `e` is `-1` as written (`^{-1}`).
fn is_minus_one(e: &Expr) -> bool {
    matches!(e, Expr::Neg(a) if matches!(&**a, Expr::Num(r) if r.is_one()))
}

/// Whether `t` can start a factor multiplied by juxtaposition.
fn starts_factor(t: &Tok) -> bool {
    matches!(
        t,
        Tok::Num(_)
            | Tok::Name(_)
            | Tok::Frac
            | Tok::Sqrt
            | Tok::Open('(' | '⌊' | '⌈' | '|')
            | Tok::GroupOpen
            | Tok::Binom
            | Tok::Infinity
    )
}
