//! The principal complex value of an expression where it has no real one, so an
//! answer undefined in the reals where the truth is defined can still be the same
//! function: `\sqrt{x}\sqrt{x}` is x and `e^{\ln x}` is x at negative x (as algebra
//! says), while `\ln x` is ln|x| + iπ there, not the truth's `\ln|x|`.
//!
//! Every part with a real value keeps it (so the real cube root of a negative number
//! stays real); only what the reals leave undefined (an even root or a fractional power
//! of a negative number, the logarithm of one, `\arcsin 2`) takes its principal complex
//! value. Integer functions (factorials, binomial coefficients, floors, ceilings,
//! `\min`, `\max`, gcd, lcm) of a complex value have none.

use std::f64::consts::{FRAC_PI_2, PI};
use std::ops::{Add, Div, Mul, Neg, Sub};

use num_traits::ToPrimitive;

use super::tree::Expr;
use super::value::{self, Bindings, Num};

/// A complex number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct C {
    re: f64,
    im: f64,
}

impl C {
    /// The real number `x`.
    pub fn real(x: f64) -> C {
        C { re: x, im: 0.0 }
    }

    const I: C = C { re: 0.0, im: 1.0 };

    fn norm(self) -> f64 {
        self.re.hypot(self.im)
    }

    fn finite(self) -> Option<C> {
        (self.re.is_finite() && self.im.is_finite()).then_some(self)
    }

    fn exp(self) -> C {
        let m = self.re.exp();
        C {
            re: m * self.im.cos(),
            im: m * self.im.sin(),
        }
    }

    /// The principal logarithm (`None` at 0).
    fn ln(self) -> Option<C> {
        let n = self.norm();
        (n != 0.0).then(|| C {
            re: n.ln(),
            im: self.im.atan2(self.re),
        })
    }

    /// The principal power `self^w` (`0^w` is 0 for a positive real `w`).
    fn pow(self, w: C) -> Option<C> {
        if self.norm() == 0.0 {
            return (w.im == 0.0 && w.re > 0.0).then_some(C::real(0.0));
        }
        Some((w * self.ln()?).exp())
    }

    fn sqrt(self) -> Option<C> {
        self.pow(C::real(0.5))
    }

    fn sin(self) -> C {
        C {
            re: self.re.sin() * self.im.cosh(),
            im: self.re.cos() * self.im.sinh(),
        }
    }

    fn cos(self) -> C {
        C {
            re: self.re.cos() * self.im.cosh(),
            im: -self.re.sin() * self.im.sinh(),
        }
    }

    fn div(self, d: C) -> Option<C> {
        let n = d.re * d.re + d.im * d.im;
        (n != 0.0).then(|| C {
            re: (self.re * d.re + self.im * d.im) / n,
            im: (self.im * d.re - self.re * d.im) / n,
        })
    }
}

impl Add for C {
    type Output = C;
    fn add(self, o: C) -> C {
        C {
            re: self.re + o.re,
            im: self.im + o.im,
        }
    }
}

impl Sub for C {
    type Output = C;
    fn sub(self, o: C) -> C {
        C {
            re: self.re - o.re,
            im: self.im - o.im,
        }
    }
}

impl Mul for C {
    type Output = C;
    fn mul(self, o: C) -> C {
        C {
            re: self.re * o.re - self.im * o.im,
            im: self.re * o.im + self.im * o.re,
        }
    }
}

impl Neg for C {
    type Output = C;
    fn neg(self) -> C {
        C {
            re: -self.re,
            im: -self.im,
        }
    }
}

impl Div<f64> for C {
    type Output = C;
    fn div(self, d: f64) -> C {
        C {
            re: self.re / d,
            im: self.im / d,
        }
    }
}

/// Whether two complex values are the same, within the rounding of a float
/// evaluation.
pub fn close(a: C, b: C) -> bool {
    (a - b).norm() <= 1e-7 * a.norm().max(b.norm()).max(1.0)
}

/// The value of `e`: its real value where it has one, else its principal complex
/// value, or `None` (a division by zero, an integer function of a complex value, a
/// value too large for a float).
pub fn eval(e: &Expr, vars: &dyn Bindings) -> Option<C> {
    if let Some(v) = value::eval(e, vars) {
        return v.to_f64().map(C::real);
    }
    let v = match e {
        Expr::Neg(a) => -eval(a, vars)?,
        Expr::Add(a, b) => eval(a, vars)? + eval(b, vars)?,
        Expr::Mul(a, b) => eval(a, vars)? * eval(b, vars)?,
        Expr::Div(a, b) => eval(a, vars)?.div(eval(b, vars)?)?,
        Expr::Pow(a, b) => eval(a, vars)?.pow(eval(b, vars)?)?,
        Expr::Root(n, a) => {
            let Some(Num::Exact(n)) = value::eval(n, vars) else {
                return None;
            };
            if !n.is_integer() {
                return None;
            }
            let k = n.to_integer().to_u32().filter(|k| *k > 0)?;
            eval(a, vars)?.pow(C::real(1.0 / f64::from(k)))?
        }
        Expr::Func(f, a) => function(f, eval(a, vars)?)?,
        Expr::Log(b, a) => eval(a, vars)?.ln()?.div(eval(b, vars)?.ln()?)?,
        Expr::Abs(a) => C::real(eval(a, vars)?.norm()),
        Expr::Percent(a) => eval(a, vars)? / 100.0,
        Expr::Degrees(a) => eval(a, vars)? / (180.0 / PI),
        _ => return None,
    };
    v.finite()
}

/// A function of a complex value.
fn function(f: &str, z: C) -> Option<C> {
    let one = C::real(1.0);
    let i = C::I;
    Some(match f {
        "sin" => z.sin(),
        "cos" => z.cos(),
        "tan" => z.sin().div(z.cos())?,
        "cot" => z.cos().div(z.sin())?,
        "sec" => one.div(z.cos())?,
        "csc" => one.div(z.sin())?,
        // sinh z = -i sin(iz), cosh z = cos(iz).
        "sinh" => -(i * (i * z).sin()),
        "cosh" => (i * z).cos(),
        "tanh" => (-(i * (i * z).sin())).div((i * z).cos())?,
        "exp" => z.exp(),
        "ln" => z.ln()?,
        // arcsin z = -i ln(iz + √(1 − z²)), arccos z = π/2 − arcsin z.
        "arcsin" => -(i * (i * z + (one - z * z).sqrt()?).ln()?),
        "arccos" => C::real(FRAC_PI_2) + i * (i * z + (one - z * z).sqrt()?).ln()?,
        // arctan z = (i/2)(ln(1 − iz) − ln(1 + iz)).
        "arctan" => (i * ((one - i * z).ln()? - (one + i * z).ln()?)) / 2.0,
        _ => return None,
    })
}
