//! The math grader: finds a response's final answer ([`extract`]), reads it and the
//! ground truth into expressions ([`tree`]) and answer shapes ([`lex`], [`expr`]), and decides
//! whether they mean the same thing ([`compare`], with exact values from [`value`],
//! expressions with variables at the points of [`sample`], principal complex values
//! from [`complex`] where the reals have none).
//!
//! The other side leads where one side alone is ambiguous: a truth that is one number
//! lets `1,000` and `1 000` be a thousand (and not the pair (1, 0)), and a truth
//! written `1,000` is a thousand when that makes it one number ([`separators`]); a truth
//! written as an interval accepts the inequality that says the same; a truth that is a
//! choice letter lets a final letter count as the answer.

pub mod compare;
pub mod complex;
pub mod expr;
pub mod extract;
pub mod integer;
pub mod lex;
pub mod sample;
pub mod separators;
pub mod tree;
pub mod value;

use serde::Serialize;

use expr::{Answer, Expr};
use extract::{NoAnswer, Source};
use lex::{Rel, Tok};

/// The grader's verdict on one response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Whether the response's final answer means the ground truth.
    pub correct: bool,
    /// The final answer found in the response, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extracted: Option<String>,
    /// Where it was found: `boxed`, `stated`, `hashes` or `choice`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    /// Why: what matched, or what was missing, unreadable or different.
    pub reason: String,
}

impl Verdict {
    fn no(extracted: Option<String>, source: Option<&'static str>, reason: String) -> Self {
        Verdict {
            correct: false,
            extracted,
            source,
            reason,
        }
    }
}

fn source_name(s: Source) -> &'static str {
    match s {
        Source::Boxed => "boxed",
        Source::Stated => "stated",
        Source::Hashes => "hashes",
        Source::Choice => "choice",
    }
}

/// Reads an answer as written: tokens, then the answer's shape.
pub fn read(text: &str) -> Result<Answer, expr::ParseError> {
    expr::parse(&lex::lex(text))
}

/// Grades `response` against the ground truth `truth` (an answer as a dataset writes
/// it: `\frac{1}{2}`, `(1, 2)`, `x \le 3`, `B`).
pub fn grade(response: &str, truth: &str) -> Verdict {
    let truth_answer = read(truth);
    let choices = matches!(truth_answer, Ok(Answer::Letter(_)));
    let found = match extract::final_answer(response, choices) {
        Ok(found) => found,
        Err(e @ NoAnswer::Missing) => return Verdict::no(None, None, e.to_string()),
        Err(e @ NoAnswer::Hedged(_)) => return Verdict::no(None, Some("boxed"), e.to_string()),
    };
    let (correct, reason) = judge(&found.text, truth, truth_answer);
    Verdict {
        correct,
        extracted: Some(found.text),
        source: Some(source_name(found.source)),
        reason,
    }
}

/// Grades `answer` that is the final answer itself (what an agent gave its `finish`
/// tool) rather than a response to find one in: its marked answer when it marks one
/// (`\boxed{}`, "the answer is …"), else all of it, so a bare `0.5` is an answer.
pub fn grade_answer(answer: &str, truth: &str) -> Verdict {
    let marked = grade(answer, truth);
    if marked.source.is_some() {
        return marked;
    }
    let given = answer.trim();
    if given.is_empty() {
        return marked;
    }
    let (correct, reason) = judge(given, truth, read(truth));
    Verdict {
        correct,
        extracted: Some(given.to_string()),
        source: Some("answer"),
        reason,
    }
}

/// Whether the answer `given` (as written) means `truth` (as written, and as read),
/// and why.
fn judge(
    given: &str,
    truth: &str,
    truth_answer: Result<Answer, expr::ParseError>,
) -> (bool, String) {
    let same_text = || normalize_text(given) == normalize_text(truth);
    let as_text = "the answer is the ground truth's text";
    // A truth written with digit groups (`1,000,000`, `12 345`) reads as a list or not
    // at all; when joining them makes it one value, it is that value.
    let truth_answer = match truth_answer {
        Ok(Answer::List(_)) | Err(_) => match separators::join(truth).map(|t| read(&t)) {
            Some(Ok(joined)) if one_value(&joined) => Ok(joined),
            _ => truth_answer,
        },
        read => read,
    };
    let Ok(truth_answer) = truth_answer else {
        // A truth the grader cannot read (a word, a name): compare as text.
        return if same_text() {
            (true, as_text.into())
        } else {
            (
                false,
                format!("the answer {given:?} differs from the ground truth's text {truth:?}"),
            )
        };
    };
    let read_given = read(given);
    if let Ok(g) = &read_given
        && equal(&truth_answer, g)
    {
        return (true, "the answer means the ground truth".into());
    }
    // A truth that is one value: digit groups separated by commas or spaces are one
    // number (`1,000`, `12 345`), which the answer read alone could not know.
    if one_value(&truth_answer)
        && let Some(joined) = separators::join(given)
        && let Ok(g) = read(&joined)
        && equal(&truth_answer, &g)
    {
        return (
            true,
            "the answer means the ground truth (digit groups joined)".into(),
        );
    }
    match read_given {
        Ok(_) => (
            false,
            format!("the answer {given:?} does not mean the ground truth {truth:?}"),
        ),
        Err(_) if same_text() => (true, as_text.into()),
        Err(e) => (false, format!("{e} (the answer was {given:?})")),
    }
}

/// One number or expression, or a relation such as `x = 1000`: an answer whose digit
/// groups are one number, not the items of a list.
fn one_value(a: &Answer) -> bool {
    matches!(a, Answer::Expr(_) | Answer::Relation(..))
}

/// Whether `given` means `truth`, also across the two ways of writing a range: an
/// inequality in one variable and an interval.
fn equal(truth: &Answer, given: &Answer) -> bool {
    if compare::answer_equal(truth, given) {
        return true;
    }
    match (truth, given) {
        (Answer::Relation(s, r), g @ (Answer::Bracketed { .. } | Answer::Union(_))) => {
            interval_of(s, r).is_some_and(|t| compare::answer_equal(&t, g))
        }
        (t @ (Answer::Bracketed { .. } | Answer::Union(_)), Answer::Relation(s, r)) => {
            interval_of(s, r).is_some_and(|g| compare::answer_equal(t, &g))
        }
        _ => false,
    }
}

/// The interval an inequality in one variable describes: `x < 3` is `(-∞, 3)`,
/// `1 \le x < 2` is `[1, 2)`, `x \ge 0` is `[0, ∞)`.
fn interval_of(sides: &[Expr], rels: &[Rel]) -> Option<Answer> {
    let is_var = |e: &Expr| matches!(e, Expr::Name(n) if n != "pi" && n != "e");
    let neg_inf = || Expr::Neg(Box::new(Expr::Infinity));
    let bound = |lo: Expr, lo_closed: bool, hi: Expr, hi_closed: bool| Answer::Bracketed {
        open: if lo_closed { '[' } else { '(' },
        close: if hi_closed { ']' } else { ')' },
        items: vec![Answer::Expr(lo), Answer::Expr(hi)],
    };
    match (sides, rels) {
        ([x, a], [r]) if is_var(x) => match r {
            Rel::Lt | Rel::Le => Some(bound(neg_inf(), false, a.clone(), *r == Rel::Le)),
            Rel::Gt | Rel::Ge => Some(bound(a.clone(), *r == Rel::Ge, Expr::Infinity, false)),
            _ => None,
        },
        ([a, x], [r]) if is_var(x) => match r {
            Rel::Gt | Rel::Ge => Some(bound(neg_inf(), false, a.clone(), *r == Rel::Ge)),
            Rel::Lt | Rel::Le => Some(bound(a.clone(), *r == Rel::Le, Expr::Infinity, false)),
            _ => None,
        },
        ([a, x, b], [r1, r2]) if is_var(x) => match (r1, r2) {
            (Rel::Lt | Rel::Le, Rel::Lt | Rel::Le) => {
                Some(bound(a.clone(), *r1 == Rel::Le, b.clone(), *r2 == Rel::Le))
            }
            (Rel::Gt | Rel::Ge, Rel::Gt | Rel::Ge) => {
                Some(bound(b.clone(), *r2 == Rel::Ge, a.clone(), *r1 == Rel::Ge))
            }
            _ => None,
        },
        _ => None,
    }
}

/// Text compared as text: case, spaces, `$`, `\text{}` and a final period ignored.
fn normalize_text(s: &str) -> String {
    let toks = lex::lex(s);
    let words: Vec<String> = toks
        .iter()
        .map(|t| match t {
            Tok::Word(w) | Tok::Name(w) => w.to_lowercase(),
            Tok::Num(n) => n.clone(),
            other => format!("{other:?}"),
        })
        .collect();
    words.join(" ")
}

#[cfg(test)]
mod tests;
