//! Whether a given answer means the ground truth: the same number (exactly, when both
//! are exact), the same expression (equal at sampled points of its variables), the same
//! set (in any order), tuple or interval (in order, brackets included), the same matrix,
//! the same choice letter. Percentages and degrees follow the ground truth's lead: a
//! truth of `50\%` takes `50`, `0.5` and `50\%`; a truth of `30^\circ` takes `30` and
//! `\frac{\pi}{6}`.

use super::expr::{Answer, Expr};
use super::lex::Rel;
use super::sample::{self, Variables, close_loose};
use super::tree::variables;
use super::value::{NoVars, Num, eval, same};

/// The number before the percent sign (`percent`) or the degree sign (otherwise), when
/// `e` carries that unit.
fn in_unit(e: &Expr, percent: bool) -> Option<&Expr> {
    match e {
        Expr::Percent(i) if percent => Some(i),
        Expr::Degrees(i) if !percent => Some(i),
        _ => None,
    }
}

/// Whether two expressions are equal.
pub fn expr_equal(truth: &Expr, given: &Expr) -> bool {
    // The same expression written the same way, even where it has no value at the
    // sampled points (`n!` and `\binom{n}{k}` are only defined at integers).
    if truth == given {
        return true;
    }
    // Infinities compare by sign.
    match (infinity_sign(truth), infinity_sign(given)) {
        (Some(a), Some(b)) => return a == b,
        (Some(_), None) | (None, Some(_)) => return false,
        _ => {}
    }
    // Units, percent first, then degrees: both in the unit compare the numbers before
    // the signs. Otherwise the truth's unit makes clear what a bare number means: in the
    // unit (`50` for 50%, `90` for 90°) or its value (`0.5`; an expression in π is
    // radians). A unit only the answer carries may be dropped or meant.
    for percent in [true, false] {
        match (in_unit(truth, percent), in_unit(given, percent)) {
            (Some(t), Some(g)) => return expr_equal(t, g),
            (Some(t), None) => return expr_equal(t, given) || values_equal(truth, given),
            (None, Some(g)) => return expr_equal(truth, g) || values_equal(truth, given),
            (None, None) => {}
        }
    }
    values_equal(truth, given)
}

fn infinity_sign(e: &Expr) -> Option<bool> {
    match e {
        Expr::Infinity => Some(true),
        Expr::Neg(a) => infinity_sign(a).map(|s| !s),
        _ => None,
    }
}

/// Equal values: as constants, or at the sampled points of their variables
/// ([`sample`]).
fn values_equal(truth: &Expr, given: &Expr) -> bool {
    let mut names = Vec::new();
    variables(truth, &mut names);
    let mut given_names = Vec::new();
    variables(given, &mut given_names);
    if names.is_empty() && given_names.is_empty() {
        return match (eval(truth, &NoVars), eval(given, &NoVars)) {
            (Some(a), Some(b)) => same(&a, &b),
            _ => false,
        };
    }
    for n in given_names {
        if !names.contains(&n) {
            // A variable the truth does not have: only equal if it cancels out, which
            // the points below check.
            names.push(n);
        }
    }
    let vars = Variables::new(names, truth, sample::seed(truth));
    sample::equal_at_points(truth, given, &vars)
}

/// Whether `given` means `truth`.
pub fn answer_equal(truth: &Answer, given: &Answer) -> bool {
    match (truth, given) {
        (Answer::Letter(a), Answer::Letter(b)) => a == b,
        (Answer::Expr(t), Answer::Expr(g)) => expr_equal(t, g),
        // `x = 5` for `5`, and `5` for `x = 5`.
        (Answer::Expr(t), Answer::Relation(sides, rels)) if is_binding(sides, rels) => {
            expr_equal(t, &sides[1])
        }
        (Answer::Relation(sides, rels), Answer::Expr(g)) if is_binding(sides, rels) => {
            expr_equal(&sides[1], g)
        }
        (Answer::Relation(ts, tr), Answer::Relation(gs, gr)) => relation_equal(ts, tr, gs, gr),
        (
            Answer::Bracketed {
                open: to,
                close: tc,
                items: ti,
            },
            Answer::Bracketed {
                open: go,
                close: gc,
                items: gi,
            },
        ) => {
            if *to == '{' && *go == '{' {
                unordered(ti, gi)
            } else {
                to == go && tc == gc && ordered(ti, gi)
            }
        }
        // A bare list and a set are both unordered collections of answers.
        (Answer::List(t), Answer::List(g)) => unordered(t, g),
        (
            Answer::List(t),
            Answer::Bracketed {
                open: '{', items, ..
            },
        )
        | (
            Answer::Bracketed {
                open: '{',
                items: t,
                ..
            },
            Answer::List(items),
        ) => unordered(t, items),
        (Answer::Union(t), Answer::Union(g)) => unordered(t, g),
        (Answer::Matrix(t), Answer::Matrix(g)) => {
            t.len() == g.len()
                && t.iter().zip(g).all(|(tr, gr)| {
                    tr.len() == gr.len() && tr.iter().zip(gr).all(|(a, b)| expr_equal(a, b))
                })
        }
        _ => false,
    }
}

/// `name = value`: a variable bound to an answer.
fn is_binding(sides: &[Expr], rels: &[Rel]) -> bool {
    rels == [Rel::Eq] && matches!(&sides[0], Expr::Name(n) if n != "pi" && n != "e")
}

/// Two equations are equal when one's `lhs − rhs` is a nonzero constant multiple of the
/// other's; two inequality chains when they read the same (or the same reversed).
fn relation_equal(ts: &[Expr], tr: &[Rel], gs: &[Expr], gr: &[Rel]) -> bool {
    if tr == [Rel::Eq] && gr == [Rel::Eq] {
        return equations_equal(ts, gs);
    }
    let same_way = tr == gr && ts.iter().zip(gs).all(|(a, b)| expr_equal(a, b));
    let flipped: Vec<Rel> = gr.iter().rev().map(|r| flip(*r)).collect();
    let reversed = tr == flipped.as_slice()
        && ts
            .iter()
            .zip(gs.iter().rev())
            .all(|(a, b)| expr_equal(a, b));
    ts.len() == gs.len() && (same_way || reversed)
}

fn flip(r: Rel) -> Rel {
    match r {
        Rel::Lt => Rel::Gt,
        Rel::Gt => Rel::Lt,
        Rel::Le => Rel::Ge,
        Rel::Ge => Rel::Le,
        r => r,
    }
}

fn equations_equal(ts: &[Expr], gs: &[Expr]) -> bool {
    if ts.len() != 2 || gs.len() != 2 {
        return false;
    }
    let diff = |s: &[Expr]| {
        Expr::Add(
            Box::new(s[0].clone()),
            Box::new(Expr::Neg(Box::new(s[1].clone()))),
        )
    };
    let (f, g) = (diff(ts), diff(gs));
    let mut names = Vec::new();
    variables(&f, &mut names);
    variables(&g, &mut names);
    let vars = Variables::new(names, &f, sample::seed(&f));
    let mut ratio: Option<f64> = None;
    let mut compared = 0;
    for point in vars.points() {
        // Outside the truth's domain nothing is compared; where only the truth's side
        // has a value, the answer's equation is wrong, unless the point may be a
        // removable gap (as for expressions, [`sample::compare_at`]).
        let Some(a) = eval(&f, &point) else {
            continue;
        };
        let Some(b) = eval(&g, &point) else {
            if point.special {
                continue;
            }
            return false;
        };
        let (Some(a), Some(b)) = (a.to_f64(), b.to_f64()) else {
            return false;
        };
        if b.abs() < 1e-12 || a.abs() < 1e-12 {
            if !(a.abs() < 1e-12 && b.abs() < 1e-12) {
                return false;
            }
            continue;
        }
        let r = a / b;
        match ratio {
            None => ratio = Some(r),
            Some(r0) if close_loose(r0, r) => {}
            Some(_) => return false,
        }
        if !point.special || vars.all_integer() {
            compared += 1;
        }
    }
    compared >= sample::AT_LEAST
}

fn ordered(t: &[Answer], g: &[Answer]) -> bool {
    t.len() == g.len() && t.iter().zip(g).all(|(a, b)| answer_equal(a, b))
}

/// The same answers in any order, each matched once.
fn unordered(t: &[Answer], g: &[Answer]) -> bool {
    if t.len() != g.len() {
        return false;
    }
    let mut used = vec![false; g.len()];
    t.iter().all(|a| {
        let hit = g
            .iter()
            .enumerate()
            .find(|(i, b)| !used[*i] && answer_equal(a, b))
            .map(|(i, _)| i);
        match hit {
            Some(i) => {
                used[i] = true;
                true
            }
            None => false,
        }
    })
}

/// The value of a constant answer, for details.
pub fn constant(e: &Expr) -> Option<Num> {
    eval(e, &NoVars)
}
