//! Exact integer functions of answers: factorials, binomial coefficients, greatest
//! common divisors and least common multiples, floors and ceilings.
//!
//! Factorials and binomial coefficients grow faster than anything else an answer can
//! write in a few characters: `1000000!` has five and a half million digits, and
//! `\binom{10^9}{5 \cdot 10^8}` more. No final answer is such a number, and computing
//! one would stall the grader on a policy's whim, so past a bound the grader refuses
//! them ([`TooLarge`]) instead of computing them.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{FromPrimitive, One, Signed, ToPrimitive, Zero};

/// The largest `n` whose factorial is computed (1000! has 2568 digits).
pub const MAX_FACTORIAL: u32 = 1000;

/// The most bits a binomial coefficient's products may take: `k` factors of `n`'s size
/// over `k!` (`k` the smaller of `k` and `n - k`), so about `k` times the bits of `n`
/// and `k`; `\binom{1000}{500}` takes under 10,000.
pub const MAX_BINOMIAL_BITS: u64 = 1 << 16;

/// The largest integers (in bits) whose gcd is taken, and the largest fraction reduced
/// by one (num-rational reduces with a binary gcd, whose time grows with the square of
/// the size and which takes a step per bit against a small number): past this, the
/// grader has no exact value.
pub const MAX_GCD_BITS: u64 = 1 << 13;

/// A value the grader will not compute because it is too large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooLarge {
    /// `n!` with `n` past [`MAX_FACTORIAL`].
    #[error("{0}! is larger than the grader computes (at most {MAX_FACTORIAL}!)")]
    Factorial(String),
    /// `\binom{n}{k}` past [`MAX_BINOMIAL_BITS`].
    #[error("the binomial coefficient of {n} and {k} is larger than the grader computes")]
    Binomial {
        /// `n`, as shown.
        n: String,
        /// `k`, as shown.
        k: String,
    },
}

/// A number as an error message shows it: in full when short, else by its size (the
/// message of a refused `10^{4000}` is not itself four thousand digits).
fn shown(n: &BigRational) -> String {
    if n.numer().bits() + n.denom().bits() <= 64 {
        n.to_string()
    } else {
        format!("a {}-bit number", n.numer().bits())
    }
}

/// Whether `n!` is within bounds (`n` a non-negative integer; other `n` have no
/// factorial, which is not this function's to say).
pub fn check_factorial(n: &BigRational) -> Result<(), TooLarge> {
    if n.is_integer() && *n > BigRational::from_integer(MAX_FACTORIAL.into()) {
        return Err(TooLarge::Factorial(shown(n)));
    }
    Ok(())
}

/// `n!`, for a non-negative integer `n`; `None` for any other `n`.
pub fn factorial(n: &BigRational) -> Result<Option<BigInt>, TooLarge> {
    check_factorial(n)?;
    if !n.is_integer() || n.is_negative() {
        return Ok(None);
    }
    let n = n.to_integer().to_u32().unwrap_or(0);
    let mut acc = BigInt::one();
    for k in 2..=n {
        acc *= k;
    }
    Ok(Some(acc))
}

/// How many factors `\binom{n}{k}` multiplies: `k`, or `n - k` when that is fewer and
/// `n` is a whole number; `None` when the coefficient is 0 without any (`k < 0`, or
/// `k > n` for a whole `n`).
fn binomial_factors(n: &BigRational, k: &BigInt) -> Option<BigInt> {
    if k.is_negative() {
        return None;
    }
    if n.is_integer() && !n.is_negative() {
        let n = n.to_integer();
        if *k > n {
            return None;
        }
        return Some(k.clone().min(n - k));
    }
    Some(k.clone())
}

/// Whether `\binom{n}{k}` is within bounds (`k` an integer).
pub fn check_binomial(n: &BigRational, k: &BigInt) -> Result<(), TooLarge> {
    let Some(factors) = binomial_factors(n, k) else {
        return Ok(());
    };
    let size = n.numer().bits() + n.denom().bits() + factors.bits();
    // A whole `n` gives a whole coefficient, found by an exact division; a fractional one
    // a fraction to reduce.
    let max = if n.is_integer() {
        MAX_BINOMIAL_BITS
    } else {
        MAX_GCD_BITS
    };
    let within = factors
        .to_u64()
        .is_some_and(|f| f.saturating_mul(size) <= max);
    if within {
        Ok(())
    } else {
        Err(TooLarge::Binomial {
            n: shown(n),
            k: shown(&BigRational::from_integer(k.clone())),
        })
    }
}

/// `\binom{n}{k}` = n(n−1)…(n−k+1) / k! for an integer `k` and any rational `n` (so
/// `\binom{n}{2}` is n(n−1)/2 wherever `n` is sampled), 0 for `k < 0`.
pub fn binomial(n: &BigRational, k: &BigInt) -> Result<BigRational, TooLarge> {
    check_binomial(n, k)?;
    let Some(factors) = binomial_factors(n, k) else {
        return Ok(BigRational::zero());
    };
    // Within bounds, the count of factors is small. With `n` whole, the symmetric
    // `n - k` factors give the same value.
    let count = factors.to_u64().unwrap_or(0);
    // n = p/q: p(p − q)…(p − (count − 1)q) over q^count · count!, reduced once.
    let (p, q) = (n.numer(), n.denom());
    let (mut top, mut bottom) = (BigInt::one(), BigInt::one());
    for i in 0..count {
        top *= p - q * i;
        bottom *= q * (i + 1);
    }
    Ok(if n.is_integer() {
        BigRational::from_integer(top / bottom)
    } else {
        BigRational::new(top, bottom)
    })
}

/// The floating-point `\binom{x}{k}` for a non-negative integer `k` up to
/// [`MAX_FACTORIAL`]: a polynomial in `x`, so expressions with a binomial in a variable
/// compare at sampled points.
pub fn binomial_f64(x: f64, k: &BigInt) -> Option<f64> {
    let k = k.to_u32().filter(|k| *k <= MAX_FACTORIAL)?;
    let mut acc = 1.0;
    for i in 0..k {
        acc *= (x - f64::from(i)) / f64::from(i + 1);
    }
    acc.is_finite().then_some(acc)
}

/// The greatest common divisor of two integers, non-negative, by Euclid's algorithm
/// (one division when one is small, where the binary algorithm takes a step per bit).
fn gcd2(a: &BigInt, b: &BigInt) -> BigInt {
    let (mut a, mut b) = (a.abs(), b.abs());
    while !b.is_zero() {
        let r = &a % &b;
        a = std::mem::replace(&mut b, r);
    }
    a
}

/// The greatest common divisor of integers (0 for none, or all zero); `None` when one
/// is larger than [`MAX_GCD_BITS`] bits.
pub fn gcd(values: &[BigInt]) -> Option<BigInt> {
    if values.iter().any(|v| v.bits() > MAX_GCD_BITS) {
        return None;
    }
    Some(values.iter().fold(BigInt::zero(), |acc, v| gcd2(&acc, v)))
}

/// The least common multiple of integers (0 if one is 0); `None` when it, or one of
/// them, would be larger than [`MAX_GCD_BITS`] bits.
pub fn lcm(values: &[BigInt]) -> Option<BigInt> {
    let mut acc = BigInt::one();
    for v in values {
        if v.is_zero() {
            return Some(BigInt::zero());
        }
        if acc.bits() + v.bits() > MAX_GCD_BITS {
            return None;
        }
        acc = (&acc * v).abs() / gcd2(&acc, v);
    }
    Some(acc)
}

/// The floor of an approximate value, as an exact integer. A value within rounding of
/// a whole number is that number (`\lfloor \log_{10} 1000 \rfloor` is 3, though the
/// logarithm computes as 2.9999999999999996): exact answers that land on a whole
/// number are far more common than ones a billionth below it.
pub fn floor_f64(x: f64) -> Option<BigInt> {
    whole_near(x).or_else(|| BigInt::from_f64(x.floor()))
}

/// The ceiling of an approximate value, as [`floor_f64`] takes its floor.
pub fn ceil_f64(x: f64) -> Option<BigInt> {
    whole_near(x).or_else(|| BigInt::from_f64(x.ceil()))
}

/// The whole number `x` is within rounding of, if any.
fn whole_near(x: f64) -> Option<BigInt> {
    let r = x.round();
    ((x - r).abs() <= 1e-9 * x.abs().max(1.0))
        .then(|| BigInt::from_f64(r))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: i64) -> BigRational {
        BigRational::from_integer(n.into())
    }

    #[test]
    fn exact_values() {
        assert_eq!(factorial(&r(5)).unwrap(), Some(120.into()));
        assert_eq!(factorial(&r(0)).unwrap(), Some(1.into()));
        assert_eq!(factorial(&r(-1)).unwrap(), None);
        assert_eq!(factorial(&(r(1) / r(2))).unwrap(), None);
        assert_eq!(binomial(&r(10), &2.into()).unwrap(), r(45));
        assert_eq!(binomial(&r(10), &8.into()).unwrap(), r(45));
        assert_eq!(binomial(&r(10), &11.into()).unwrap(), r(0));
        assert_eq!(binomial(&r(10), &(-1).into()).unwrap(), r(0));
        assert_eq!(binomial(&r(-2), &3.into()).unwrap(), r(-4));
        assert_eq!(binomial(&(r(1) / r(2)), &2.into()).unwrap(), r(-1) / r(8));
        assert_eq!(gcd(&[12.into(), 18.into()]), Some(6.into()));
        assert_eq!(gcd(&[(-4).into(), 6.into()]), Some(2.into()));
        assert_eq!(gcd(&[0.into(), 0.into()]), Some(0.into()));
        assert_eq!(lcm(&[4.into(), 6.into(), 10.into()]), Some(60.into()));
        assert_eq!(floor_f64(2.999_999_999_999_999_6), Some(3.into()));
        assert_eq!(floor_f64(-0.5), Some((-1).into()));
        assert_eq!(ceil_f64(std::f64::consts::PI), Some(4.into()));
        assert_eq!(floor_f64(f64::NAN), None);
    }

    #[test]
    fn past_the_bounds_is_refused_not_computed() {
        assert!(matches!(
            factorial(&r(1_000_000)),
            Err(TooLarge::Factorial(_))
        ));
        let big = BigRational::from_integer(BigInt::from(10).pow(4000));
        let e = factorial(&big).unwrap_err().to_string();
        assert!(e.len() < 100, "{e}");
        assert!(matches!(
            binomial(&r(1_000_000_000), &500_000_000.into()),
            Err(TooLarge::Binomial { .. })
        ));
        // Symmetry: few factors however large the lower index is.
        assert_eq!(
            binomial(&r(1_000_000_000), &999_999_999.into()).unwrap(),
            r(1_000_000_000)
        );
        assert_eq!(binomial(&r(1000), &500.into()).map(|_| ()), Ok(()));
        // A fractional `n` has no symmetry: its `k` is bounded as it is.
        assert!(binomial(&(r(1) / r(3)), &5000.into()).is_err());
        let huge = BigInt::from(2).pow(70_000);
        assert_eq!(gcd(&[huge.clone(), huge.clone() + 1]), None);
        assert_eq!(lcm(&[huge.clone(), huge + 1]), None);
    }
}
