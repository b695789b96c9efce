//! The points at which two expressions with variables are compared, and how they
//! compare at one point.
//!
//! Points cover the domain a reader has in mind: negative and positive values, zero,
//! fractions, magnitudes from a twentieth to forty. Fixed points would let a policy
//! learn them (a polynomial vanishing at them is `x` there), and positive ones alone
//! take `x` for `|x|` and `\ln x` for `\ln|x|`; so each problem draws its own, from a
//! generator seeded by a hash of its ground truth: the same problem always gets the
//! same points (grading is deterministic), different problems different ones.
//!
//! Two kinds of point. *Special* points give every variable a small exact value (0,
//! ±1, ±2, ±3, ±½, ⅓, -3/2), where answers have their removable gaps (`\frac{x^2-1}{x-1}`
//! at 1). *Generic* points give real variables random floats, where no removable gap
//! lies. A variable the truth uses as an integer (under a factorial, as a binomial
//! coefficient's lower index or a gcd's argument) is a whole number from 0 to 12 at
//! every point, as it is only defined there.

use std::hash::{Hash, Hasher};

use num_bigint::BigInt;
use num_rational::BigRational;

use super::complex;
use super::tree::{Expr, Fold};
use super::value::{Bindings, Num, close, eval, same};

/// Special points drawn for each comparison.
const SPECIAL: usize = 6;

/// Generic points drawn at most.
const GENERIC: usize = 64;

/// Generic points at which the two sides must agree, out of [`GENERIC`]; comparison
/// stops after this many. A truth defined on a small part of the line (`\arcsin x`,
/// `\sqrt{x - 5}`) is defined at fewer of the points drawn.
const ENOUGH: usize = 16;

/// The fewest generic points at which the two sides must be compared for them to be
/// equal: fewer, and the truth's domain was barely reached.
pub const AT_LEAST: usize = 4;

/// The small exact values of special points, as (numerator, denominator).
const SPECIAL_VALUES: [(i64, i64); 11] = [
    (0, 1),
    (1, 1),
    (-1, 1),
    (2, 1),
    (-2, 1),
    (3, 1),
    (-3, 1),
    (1, 2),
    (-1, 2),
    (1, 3),
    (-3, 2),
];

/// The largest value of an integer variable.
const MAX_INTEGER: u64 = 12;

/// One step of the SplitMix64 generator: a well-mixed 64-bit hash of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform float in [0, 1) from 64 random bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// FNV-1a: a small deterministic hasher (the standard library's is randomly keyed per
/// process, which would give a problem different points in every process).
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01B3);
        }
    }
}

fn fnv(value: &impl Hash) -> u64 {
    let mut h = Fnv(0xCBF2_9CE4_8422_2325);
    value.hash(&mut h);
    h.finish()
}

/// The seed of a problem's points: a hash of its ground truth.
pub fn seed(truth: &impl Hash) -> u64 {
    splitmix64(fnv(truth))
}

/// How a variable is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Real,
    Integer,
}

/// The variables of a comparison and how each is sampled.
pub struct Variables {
    names: Vec<String>,
    kinds: Vec<Kind>,
    /// Each variable's stream of random numbers: the problem's seed and its name, so a
    /// variable's values do not depend on which others there are.
    streams: Vec<u64>,
}

impl Variables {
    /// `names`, each an integer variable if `truth` uses it as one.
    pub fn new(names: Vec<String>, truth: &Expr, seed: u64) -> Variables {
        let mut integers = Vec::new();
        integer_variables(truth, &mut integers);
        let kinds = names
            .iter()
            .map(|n| {
                if integers.contains(n) {
                    Kind::Integer
                } else {
                    Kind::Real
                }
            })
            .collect();
        let streams = names.iter().map(|n| splitmix64(seed ^ fnv(n))).collect();
        Variables {
            names,
            kinds,
            streams,
        }
    }

    /// Whether every variable is an integer one (then every point is special, and
    /// the special ones count as compared).
    pub fn all_integer(&self) -> bool {
        self.kinds.iter().all(|k| *k == Kind::Integer)
    }

    /// The points to compare at: `SPECIAL` special ones, then `GENERIC` generic
    /// ones (when every variable is an integer, distinct ones only).
    pub fn points(&self) -> impl Iterator<Item = Point<'_>> + '_ {
        let all_integer = self.all_integer();
        let mut seen: Vec<Vec<Num>> = Vec::new();
        (0..SPECIAL + GENERIC).filter_map(move |i| {
            let special = i < SPECIAL;
            let values: Vec<Num> = (0..self.names.len())
                .map(|v| self.value(v, i as u64, special))
                .collect();
            if all_integer {
                // Whole numbers repeat: a repeated point says nothing new.
                if seen.contains(&values) {
                    return None;
                }
                seen.push(values.clone());
            }
            Some(Point {
                names: &self.names,
                values,
                special: special || all_integer,
            })
        })
    }

    /// The value of variable `v` at point `i`.
    fn value(&self, v: usize, i: u64, special: bool) -> Num {
        let r = |k: u64| splitmix64(self.streams[v].wrapping_add(4 * i + k));
        let exact = |n: i64, d: i64| Num::Exact(BigRational::new(BigInt::from(n), BigInt::from(d)));
        if self.kinds[v] == Kind::Integer {
            let n = r(0) % (MAX_INTEGER + 1);
            return exact(i64::try_from(n).unwrap_or(0), 1);
        }
        if special {
            let pick = r(0) % SPECIAL_VALUES.len() as u64;
            let (n, d) = SPECIAL_VALUES[usize::try_from(pick).unwrap_or(0)];
            return exact(n, d);
        }
        // A fraction below 1, a value up to 4, or a larger one up to 40, either sign.
        let bucket = unit(r(1));
        let u = unit(r(2));
        let magnitude = if bucket < 0.35 {
            0.05 + 0.95 * u
        } else if bucket < 0.8 {
            1.0 + 3.0 * u
        } else {
            4.0 * 10f64.powf(u)
        };
        Num::Approx(if r(3) & 1 == 1 { -magnitude } else { magnitude })
    }
}

/// Variables that `e` uses as integers: under a factorial, in a binomial coefficient
/// whose lower index has a variable (both indices), in a gcd or lcm.
fn integer_variables(e: &Expr, out: &mut Vec<String>) {
    let mut all = |a: &Expr| super::tree::variables(a, out);
    match e {
        Expr::Fact(a) => all(a),
        Expr::Binom(n, k) => {
            let mut in_k = Vec::new();
            super::tree::variables(k, &mut in_k);
            if in_k.is_empty() {
                integer_variables(n, out);
            } else {
                all(n);
                all(k);
            }
        }
        Expr::Fold(Fold::Gcd | Fold::Lcm, args) => args.iter().for_each(all),
        Expr::Name(_) | Expr::Num(_) | Expr::Infinity => {}
        Expr::Neg(a)
        | Expr::Func(_, a)
        | Expr::Floor(a)
        | Expr::Ceil(a)
        | Expr::Abs(a)
        | Expr::Percent(a)
        | Expr::Degrees(a) => integer_variables(a, out),
        Expr::Add(a, b)
        | Expr::Mul(a, b)
        | Expr::Div(a, b)
        | Expr::Pow(a, b)
        | Expr::Root(a, b)
        | Expr::Log(a, b) => {
            integer_variables(a, out);
            integer_variables(b, out);
        }
        Expr::Fold(_, args) => args.iter().for_each(|a| integer_variables(a, out)),
    }
}

/// Values for the variables at one point.
pub struct Point<'a> {
    names: &'a [String],
    values: Vec<Num>,
    /// Every variable has a small exact value (or a whole one): where an answer may
    /// have a removable gap.
    pub special: bool,
}

impl Bindings for Point<'_> {
    fn get(&self, name: &str) -> Option<Num> {
        let i = self.names.iter().position(|n| n == name)?;
        self.values.get(i).cloned()
    }
}

/// How two expressions compare at one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// Both have a value there, the same one.
    Agree,
    /// They have different values there, or only the truth has one.
    Differ,
    /// Not a point to compare at: outside the truth's domain, or a removable gap.
    Skip,
}

/// How `truth` and `given` compare at `point`.
///
/// The truth's domain is the problem's: where the truth has no value (`\ln x` at
/// negative x) the answer's value says nothing (`\ln|x|` is right for `\ln x`). Where
/// the truth has a value and the answer has no real one, the answer is wrong unless its
/// principal complex value is the truth's value (`\sqrt{x}\sqrt{x}` and `e^{\ln x}`
/// are x for negative x; `\ln x` is ln|x| + iπ there, not ln|x|), or the point is
/// special: a removable gap such as `\frac{x^2-1}{x-1}` at 1 is not a wrong answer.
pub fn compare_at(truth: &Expr, given: &Expr, point: &Point) -> At {
    let Some(t) = eval(truth, point) else {
        return At::Skip;
    };
    match eval(given, point) {
        Some(g) => {
            if same_value(&t, &g) {
                At::Agree
            } else {
                At::Differ
            }
        }
        None => match (complex::eval(given, point), t.to_f64()) {
            (Some(g), Some(t)) if complex::close(g, complex::C::real(t)) => At::Agree,
            (None, _) if point.special => At::Skip,
            _ => At::Differ,
        },
    }
}

/// The same value at a sampled point: exactly when both are exact, else within the
/// rounding of a float evaluation.
fn same_value(a: &Num, b: &Num) -> bool {
    if let (Num::Exact(_), Num::Exact(_)) = (a, b) {
        return same(a, b);
    }
    match (a.to_f64(), b.to_f64()) {
        (Some(x), Some(y)) => close_loose(x, y),
        _ => false,
    }
}

/// At sampled points both sides are floats: allow for rounding in the evaluation.
pub fn close_loose(x: f64, y: f64) -> bool {
    close(x, y) || (x - y).abs() <= 1e-7 * x.abs().max(y.abs()).max(1.0)
}

/// Whether `truth` and `given` are equal at the points of `vars`: they agree at every
/// point where the truth has a value, at [`AT_LEAST`] generic ones or more.
pub fn equal_at_points(truth: &Expr, given: &Expr, vars: &Variables) -> bool {
    let mut agreed = 0;
    for point in vars.points() {
        match compare_at(truth, given, &point) {
            At::Differ => return false,
            At::Agree if !point.special || vars.all_integer() => agreed += 1,
            At::Agree | At::Skip => {}
        }
        if agreed >= ENOUGH {
            break;
        }
    }
    agreed >= AT_LEAST
}
