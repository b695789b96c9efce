//! The expression tree every part of the math grader shares: what the parser
//! ([`expr`](super::expr)) builds, what [`value`](super::value) evaluates and
//! [`sample`](super::sample) and [`compare`](super::compare) walk. It sits below all of
//! them, so none of them imports another to reach it.

use num_rational::BigRational;

/// An expression (hashed to seed the points it is compared at).
#[derive(Debug, Clone, PartialEq, Hash)]
pub enum Expr {
    /// An exact number.
    Num(BigRational),
    /// A variable or a constant (`pi`, `e`, `i`).
    Name(String),
    /// `-a`.
    Neg(Box<Expr>),
    /// `a + b`.
    Add(Box<Expr>, Box<Expr>),
    /// `a · b`.
    Mul(Box<Expr>, Box<Expr>),
    /// `a / b`.
    Div(Box<Expr>, Box<Expr>),
    /// `a ^ b`.
    Pow(Box<Expr>, Box<Expr>),
    /// `\sqrt[n]{a}`: (index, radicand).
    Root(Box<Expr>, Box<Expr>),
    /// A function applied: `sin`, `cos`, `tan`, `ln`, `exp`, …
    Func(String, Box<Expr>),
    /// `\log_b a`: (base, argument).
    Log(Box<Expr>, Box<Expr>),
    /// `a!`.
    Fact(Box<Expr>),
    /// `\binom{n}{k}`, `{n \choose k}`: (n, k).
    Binom(Box<Expr>, Box<Expr>),
    /// `\lfloor a \rfloor`.
    Floor(Box<Expr>),
    /// `\lceil a \rceil`.
    Ceil(Box<Expr>),
    /// `\max(a, b, …)` and the like: one value of several.
    Fold(Fold, Vec<Expr>),
    /// `|a|`.
    Abs(Box<Expr>),
    /// `a%`: a hundredth of `a`, remembered as written so `50\%` can match `50`.
    Percent(Box<Expr>),
    /// `a°`: an angle in degrees.
    Degrees(Box<Expr>),
    /// `\infty`.
    Infinity,
}

/// A function of any number of arguments that folds them into one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fold {
    /// `\min`.
    Min,
    /// `\max`.
    Max,
    /// `\gcd` (of integers).
    Gcd,
    /// `\operatorname{lcm}` (of integers).
    Lcm,
}

impl Fold {
    /// The fold a name (`min`, `max`, `gcd`, `lcm`) stands for.
    pub(super) fn named(name: &str) -> Option<Fold> {
        Some(match name {
            "min" => Fold::Min,
            "max" => Fold::Max,
            "gcd" => Fold::Gcd,
            "lcm" => Fold::Lcm,
            _ => return None,
        })
    }
}

/// The free variables of `e` (every name but `pi`, and `e` unless it is used as one).
pub(super) fn variables(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Name(n) if n != "pi" && n != "e" => {
            if !out.contains(n) {
                out.push(n.clone());
            }
        }
        Expr::Name(_) | Expr::Num(_) | Expr::Infinity => {}
        Expr::Neg(a)
        | Expr::Func(_, a)
        | Expr::Fact(a)
        | Expr::Floor(a)
        | Expr::Ceil(a)
        | Expr::Abs(a)
        | Expr::Percent(a)
        | Expr::Degrees(a) => variables(a, out),
        Expr::Add(a, b)
        | Expr::Mul(a, b)
        | Expr::Div(a, b)
        | Expr::Pow(a, b)
        | Expr::Root(a, b)
        | Expr::Log(a, b)
        | Expr::Binom(a, b) => {
            variables(a, out);
            variables(b, out);
        }
        Expr::Fold(_, args) => args.iter().for_each(|a| variables(a, out)),
    }
}
