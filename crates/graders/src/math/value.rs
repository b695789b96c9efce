//! The value of an expression: exact (a rational) while only rational operations are
//! involved, a float once something irrational is (π, a root, a logarithm), nothing
//! where it is undefined (a division by zero, an even root of a negative number).
//!
//! Exactness is what lets the grader refuse a rounded approximation of an exact answer
//! (`1.414` for `\sqrt{2}`, `0.33` for `\frac13`) while accepting every exact spelling of
//! it (`0.\overline{3}`, `\frac{2}{6}`). Exact values are bounded in size (whole numbers
//! at 65,536 bits, other fractions at 8,192): past that an answer's value is a float, so
//! a policy cannot make the grader spend its time on arithmetic no answer needs.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use super::integer::{self, TooLarge};
use super::tree::{Expr, Fold};

/// A value.
#[derive(Debug, Clone, PartialEq)]
pub enum Num {
    /// Exact.
    Exact(BigRational),
    /// Approximate (finite).
    Approx(f64),
}

impl Num {
    /// As a float (`None` when too large to be one).
    pub fn to_f64(&self) -> Option<f64> {
        match self {
            Num::Exact(r) => r.to_f64().filter(|f| f.is_finite()),
            Num::Approx(f) => Some(*f),
        }
    }

    fn approx(f: f64) -> Option<Num> {
        f.is_finite().then_some(Num::Approx(f))
    }
}

/// Values for the free variables of an expression.
pub trait Bindings {
    /// The value of `name`, if it is a bound variable.
    fn get(&self, name: &str) -> Option<Num>;
}

/// No variables bound: constants only.
pub struct NoVars;

impl Bindings for NoVars {
    fn get(&self, _: &str) -> Option<Num> {
        None
    }
}

/// The biggest exponent computed exactly; past it, a float.
const MAX_EXACT_EXP: u32 = 256;

/// The biggest whole number computed exactly (a power, a sum, a product), in bits of
/// numerator and denominator; past it, a float (which overflows to "no value" for the
/// truly huge).
const MAX_EXACT_BITS: u64 = 1 << 16;

/// The value of `e`, or `None` where it is undefined or not a real number.
pub fn eval(e: &Expr, vars: &dyn Bindings) -> Option<Num> {
    use Num::{Approx, Exact};
    Some(match e {
        Expr::Num(r) => Exact(r.clone()),
        Expr::Name(n) => match vars.get(n) {
            Some(Num::Approx(v)) => Num::approx(v)?,
            Some(v) => v,
            None => match n.as_str() {
                "pi" => Approx(std::f64::consts::PI),
                "e" => Approx(std::f64::consts::E),
                _ => return None,
            },
        },
        Expr::Neg(a) => match eval(a, vars)? {
            Exact(r) => Exact(-r),
            Approx(f) => Approx(-f),
        },
        Expr::Add(a, b) => match (eval(a, vars)?, eval(b, vars)?) {
            (Exact(x), Exact(y)) if let Some(r) = exact(Op::Add, &x, &y) => Exact(r),
            (x, y) => Num::approx(x.to_f64()? + y.to_f64()?)?,
        },
        Expr::Mul(a, b) => match (eval(a, vars)?, eval(b, vars)?) {
            (Exact(x), Exact(y)) if let Some(r) = exact(Op::Mul, &x, &y) => Exact(r),
            (x, y) => Num::approx(x.to_f64()? * y.to_f64()?)?,
        },
        Expr::Div(a, b) => match (eval(a, vars)?, eval(b, vars)?) {
            (_, Exact(y)) if y.is_zero() => return None,
            (Exact(x), Exact(y)) if let Some(r) = exact(Op::Div, &x, &y) => Exact(r),
            (x, y) => {
                let d = y.to_f64()?;
                if d == 0.0 {
                    return None;
                }
                Num::approx(x.to_f64()? / d)?
            }
        },
        Expr::Pow(a, b) => pow(eval(a, vars)?, eval(b, vars)?)?,
        Expr::Root(n, x) => {
            let n = eval(n, vars)?;
            let x = eval(x, vars)?;
            root(n, x)?
        }
        Expr::Func(f, a) => {
            let x = eval(a, vars)?.to_f64()?;
            let y = match f.as_str() {
                "sin" => x.sin(),
                "cos" => x.cos(),
                "tan" => x.tan(),
                "cot" => 1.0 / x.tan(),
                "sec" => 1.0 / x.cos(),
                "csc" => 1.0 / x.sin(),
                "arcsin" if x.abs() <= 1.0 => x.asin(),
                "arccos" if x.abs() <= 1.0 => x.acos(),
                "arctan" => x.atan(),
                "sinh" => x.sinh(),
                "cosh" => x.cosh(),
                "tanh" => x.tanh(),
                "ln" if x > 0.0 => x.ln(),
                "exp" => x.exp(),
                _ => return None,
            };
            Num::approx(y)?
        }
        Expr::Log(b, a) => {
            let (b, x) = (eval(b, vars)?.to_f64()?, eval(a, vars)?.to_f64()?);
            if b <= 0.0 || b == 1.0 || x <= 0.0 {
                return None;
            }
            Num::approx(x.ln() / b.ln())?
        }
        Expr::Fact(_) | Expr::Binom(..) | Expr::Floor(_) | Expr::Ceil(_) | Expr::Fold(..) => {
            discrete(e, vars)?
        }
        Expr::Abs(a) => match eval(a, vars)? {
            Exact(r) => Exact(r.abs()),
            Approx(f) => Approx(f.abs()),
        },
        Expr::Percent(a) => match eval(a, vars)? {
            Exact(r) => Exact(r / BigRational::from_integer(100.into())),
            Approx(f) => Approx(f / 100.0),
        },
        Expr::Degrees(a) => Num::approx(eval(a, vars)?.to_f64()?.to_radians())?,
        Expr::Infinity => return None,
    })
}

/// The value of a factorial, binomial coefficient, floor, ceiling or fold: exact on
/// exact arguments, and a floor or ceiling exact even of an approximate one.
fn discrete(e: &Expr, vars: &dyn Bindings) -> Option<Num> {
    use Num::{Approx, Exact};
    Some(match e {
        Expr::Fact(a) => match eval(a, vars)? {
            Exact(r) => Exact(BigRational::from_integer(integer::factorial(&r).ok()??)),
            Approx(_) => return None,
        },
        Expr::Binom(n, k) => {
            let Exact(k) = eval(k, vars)? else {
                return None;
            };
            if !k.is_integer() {
                return None;
            }
            let k = k.to_integer();
            match eval(n, vars)? {
                Exact(n) => Exact(integer::binomial(&n, &k).ok()?),
                Approx(x) => Num::approx(integer::binomial_f64(x, &k)?)?,
            }
        }
        Expr::Floor(a) => match eval(a, vars)? {
            Exact(r) => Exact(r.floor()),
            Approx(f) => Exact(BigRational::from_integer(integer::floor_f64(f)?)),
        },
        Expr::Ceil(a) => match eval(a, vars)? {
            Exact(r) => Exact(r.ceil()),
            Approx(f) => Exact(BigRational::from_integer(integer::ceil_f64(f)?)),
        },
        Expr::Fold(fold, args) => {
            let values = args
                .iter()
                .map(|a| eval(a, vars))
                .collect::<Option<Vec<Num>>>()?;
            folded(*fold, values)?
        }
        _ => return None,
    })
}

/// `\min`, `\max`, `\gcd` or `\operatorname{lcm}` of values: the extremes keep the
/// chosen value as it is (exact or not), gcd and lcm are of integers only.
fn folded(fold: Fold, values: Vec<Num>) -> Option<Num> {
    match fold {
        Fold::Min | Fold::Max => {
            let mut best: Option<Num> = None;
            for v in values {
                let better = match &best {
                    None => true,
                    Some(b) => {
                        let less = match (&v, b) {
                            (Num::Exact(x), Num::Exact(y)) => x < y,
                            _ => v.to_f64()? < b.to_f64()?,
                        };
                        less == (fold == Fold::Min) && !same(&v, b)
                    }
                };
                if better {
                    best = Some(v);
                }
            }
            best
        }
        Fold::Gcd | Fold::Lcm => {
            let ints = values
                .into_iter()
                .map(|v| match v {
                    Num::Exact(r) if r.is_integer() => Some(r.to_integer()),
                    _ => None,
                })
                .collect::<Option<Vec<BigInt>>>()?;
            let n = if fold == Fold::Gcd {
                integer::gcd(&ints)?
            } else {
                integer::lcm(&ints)?
            };
            Some(Num::Exact(BigRational::from_integer(n)))
        }
    }
}

/// Whether `e` is a factorial or binomial coefficient of constants past what the grader
/// computes, and which; its arguments with variables are not (their values are only
/// ever sampled ones).
pub fn too_large(e: &Expr) -> Option<TooLarge> {
    let constant = |a: &Expr| match eval(a, &NoVars) {
        Some(Num::Exact(r)) => Some(r),
        // An approximate argument (`(10^{300})!`) is as large as its float.
        Some(Num::Approx(f)) => BigRational::from_float(f.round()),
        None => None,
    };
    match e {
        Expr::Fact(a) => integer::check_factorial(&constant(a)?).err(),
        Expr::Binom(n, k) => {
            let (n, k) = (constant(n)?, constant(k)?);
            if !k.is_integer() {
                return None;
            }
            integer::check_binomial(&n, &k.to_integer()).err()
        }
        _ => None,
    }
}

/// An exact operation of two numbers.
enum Op {
    Add,
    Mul,
    Div,
}

/// Bits of a fraction's numerator and denominator.
fn bits(r: &BigRational) -> u64 {
    r.numer().bits() + r.denom().bits()
}

/// `x op y` exactly, while that is cheap; `None` (the caller computes a float) past it.
/// Whole numbers up to [`MAX_EXACT_BITS`] add, multiply and divide evenly without a gcd;
/// other fractions are reduced by one, whose time grows with the square of their size,
/// so they stay within [`integer::MAX_GCD_BITS`]. Unbounded, a chain of products of
/// `(10^{76})^{256}` took a minute.
fn exact(op: Op, x: &BigRational, y: &BigRational) -> Option<BigRational> {
    if matches!(op, Op::Div) && y.is_zero() {
        return None;
    }
    let size = bits(x) + bits(y);
    if x.is_integer() && y.is_integer() && size <= MAX_EXACT_BITS {
        let (a, b) = (x.numer(), y.numer());
        match op {
            Op::Add => return Some(BigRational::from_integer(a + b)),
            Op::Mul => return Some(BigRational::from_integer(a * b)),
            Op::Div if !b.is_zero() && (a % b).is_zero() => {
                return Some(BigRational::from_integer(a / b));
            }
            Op::Div => {}
        }
    }
    (size <= integer::MAX_GCD_BITS).then(|| match op {
        Op::Add => x + y,
        Op::Mul => x * y,
        Op::Div => x / y,
    })
}

/// `b^k`, its parts raised apart (a reduced fraction's powers stay reduced: no gcd).
fn power(b: &BigRational, k: u32) -> Option<BigRational> {
    let k = usize::try_from(k).ok()?;
    Some(BigRational::new_raw(
        num_traits::pow(b.numer().clone(), k),
        num_traits::pow(b.denom().clone(), k),
    ))
}

fn pow(base: Num, exp: Num) -> Option<Num> {
    if let (Num::Exact(b), Num::Exact(x)) = (&base, &exp) {
        if x.is_integer() {
            let n = x.to_integer();
            // Exact while the result stays a reasonable size: `((10^{256})^{256})^{256}`
            // would otherwise be a number of billions of digits.
            let bits = b.numer().bits() + b.denom().bits();
            let k = n.abs().to_u32().filter(|k| {
                *k <= MAX_EXACT_EXP && bits.saturating_mul(u64::from(*k)) <= MAX_EXACT_BITS
            });
            if let Some(k) = k {
                if b.is_zero() && n.is_negative() {
                    return None;
                }
                let p = power(b, k)?;
                return Some(Num::Exact(if n.is_negative() { p.recip() } else { p }));
            }
        }
        // A rational power of a perfect power stays exact: 8^(1/3) = 2, 4^(3/2) = 8.
        if let Some(r) = exact_rational_power(b, x) {
            return Some(Num::Exact(r));
        }
    }
    // A negative number to a fraction of odd denominator is the real root's power, as
    // a reader takes `x^{1/3}` (the cube root of x, for negative x too).
    let odd_root = match &exp {
        Num::Exact(x) if !x.is_integer() && x.denom().bit(0) => Some(x.numer().bit(0)),
        _ => None,
    };
    let (b, x) = (base.to_f64()?, exp.to_f64()?);
    if b < 0.0 && x.fract() != 0.0 {
        let odd_numerator = odd_root?;
        let p = (-b).powf(x);
        return Num::approx(if odd_numerator { -p } else { p });
    }
    Num::approx(b.powf(x))
}

/// `b^(p/q)` when `b`'s numerator and denominator are perfect `q`-th powers.
fn exact_rational_power(b: &BigRational, x: &BigRational) -> Option<BigRational> {
    let q = x.denom().to_u32().filter(|q| (2..=16).contains(q))?;
    let p = x.numer().to_i32()?;
    // A negative power of 0 (`0^{-1/2}`) is undefined, not a reciprocal to take.
    if (b.is_negative() && q % 2 == 0) || (b.is_zero() && p < 0) {
        return None;
    }
    let root = |n: &BigInt| -> Option<BigInt> {
        let r = n.abs().nth_root(q);
        (num_traits::pow(r.clone(), usize::try_from(q).ok()?) == n.abs())
            .then(|| if n.is_negative() { -r } else { r })
    };
    // The roots of a reduced fraction's coprime parts are coprime: no gcd to take.
    let base = BigRational::new_raw(root(b.numer())?, root(b.denom())?);
    let bits = base.numer().bits() + base.denom().bits();
    if p.unsigned_abs() > MAX_EXACT_EXP
        || bits.saturating_mul(u64::from(p.unsigned_abs())) > MAX_EXACT_BITS
    {
        return None;
    }
    let powed = power(&base, p.unsigned_abs())?;
    Some(if p < 0 { powed.recip() } else { powed })
}

fn root(n: Num, x: Num) -> Option<Num> {
    let Num::Exact(n) = &n else {
        return None;
    };
    if !n.is_integer() || !n.is_positive() {
        return None;
    }
    let inv = BigRational::new(BigInt::one(), n.to_integer());
    if let Num::Exact(r) = &x
        && let Some(v) = exact_rational_power(r, &inv)
    {
        return Some(Num::Exact(v));
    }
    let f = x.to_f64()?;
    let k = n.to_integer().to_u32()?;
    if f < 0.0 {
        if k % 2 == 0 {
            return None;
        }
        return Num::approx(-(-f).powf(1.0 / f64::from(k)));
    }
    Num::approx(f.powf(1.0 / f64::from(k)))
}

/// Whether two values are the same number: exactly when both are exact, else within a
/// relative 1e-9 (so a rounded decimal never equals an irrational value).
pub fn same(a: &Num, b: &Num) -> bool {
    match (a, b) {
        (Num::Exact(x), Num::Exact(y)) => x == y,
        _ => match (a.to_f64(), b.to_f64()) {
            (Some(x), Some(y)) => close(x, y),
            _ => false,
        },
    }
}

/// Within a relative 1e-9 (absolute 1e-12 near zero).
pub fn close(x: f64, y: f64) -> bool {
    let scale = x.abs().max(y.abs());
    (x - y).abs() <= 1e-12_f64.max(scale * 1e-9)
}
