//! The grader's verdicts on the answer spellings each category is about.

use super::grade;

fn yes(response: &str, truth: &str) {
    let v = grade(response, truth);
    assert!(v.correct, "{response:?} vs {truth:?}: {v:?}");
}

fn no(response: &str, truth: &str) {
    let v = grade(response, truth);
    assert!(
        !v.correct,
        "{response:?} vs {truth:?} should be wrong: {v:?}"
    );
}

#[test]
fn numbers_and_their_spellings() {
    yes("\\boxed{\\dfrac{1}{2}}", "\\frac12");
    yes("\\boxed{0.5}", "\\frac{1}{2}");
    yes("\\boxed{−3}", "-3");
    yes("\\boxed{1\\,000\\,000}", "1000000");
    yes("#### 1,200", "1200");
    yes("The answer is 12 345.", "12345");
    yes("\\boxed{6.02e23}", "6.02\\times 10^{23}");
    yes("\\boxed{0.\\overline{3}}", "\\frac{1}{3}");
    yes("\\boxed{3\\frac{1}{2}}", "\\frac{7}{2}");
    yes("The answer is 3 1/2", "3.5");
    no("\\boxed{0.33}", "\\frac{1}{3}");
    no("\\boxed{1.414}", "\\sqrt{2}");
    no("\\boxed{1,000}", "(1, 0)");
}

#[test]
fn thousands_separators_on_either_side_in_any_spelling() {
    // Separators in the truth, none in the answer.
    for truth in [
        "1,000,000",
        "1{,}000{,}000",
        "1,\\!000,\\!000",
        "1\\,000\\,000",
        "1\\ 000\\ 000",
        "1 000 000",
        "1\u{2009}000\u{2009}000",
    ] {
        yes("\\boxed{1000000}", truth);
        no("\\boxed{1000}", truth);
        no("\\boxed{1, 0, 0}", truth);
    }
    yes("\\boxed{12345}", "12\\,345");
    yes("\\boxed{x = 1000}", "x = 1{,}000");
    // Separators in the answer, none in the truth.
    for answer in [
        "1{,}000", "1,\\!000", "1\\,000", "1\\ 000", "1,000", "1 000",
    ] {
        yes(&format!("\\boxed{{{answer}}}"), "1000");
        no(&format!("\\boxed{{{answer}}}"), "100");
    }
    // Different spellings on the two sides, and mixed in one number.
    yes("\\boxed{1,000,000}", "1{,}000{,}000");
    yes("\\boxed{1\\,000\\,000}", "1,\\!000,\\!000");
    yes("\\boxed{12 345}", "12,345");
    yes("\\boxed{1,000\\,000}", "1000000");
    yes("\\boxed{2,500.5}", "2{,}500.5");
    // Lists and tuples stay lists and tuples.
    yes("\\boxed{(1,2)}", "(1,2)");
    no("\\boxed{12}", "(1,2)");
    no("\\boxed{123}", "1, 2, 3");
    yes("\\boxed{1, 250}", "1, 250");
    no("\\boxed{1250}", "1, 250");
    no("\\boxed{1250}", "(1,250)");
    no("\\boxed{0.123456}", "0.123 456");
}

#[test]
fn units_and_text_follow_the_truth() {
    yes("\\boxed{50\\%}", "50\\%");
    yes("\\boxed{50}", "50\\%");
    yes("\\boxed{0.5}", "50\\%");
    yes("\\boxed{30^\\circ}", "30");
    yes("\\boxed{\\frac{\\pi}{6}}", "30^\\circ");
    yes("\\boxed{5\\text{ cm}}", "5");
    yes("Answer: 7 apples", "7");
}

#[test]
fn shapes() {
    yes("\\boxed{\\{3, 1, 2\\}}", "\\{1,2,3\\}");
    no("\\boxed{(2, 1)}", "(1, 2)");
    yes("\\boxed{[0, 1)}", "[0,1)");
    no("\\boxed{(0, 1]}", "[0,1)");
    yes("\\boxed{x \\le 3}", "(-\\infty, 3]");
    yes("\\boxed{(-\\infty, 3]}", "x \\leq 3");
    yes("\\boxed{1 < x \\le 2}", "(1, 2]");
    yes("\\boxed{x = 2 \\text{ or } x = 3}", "2, 3");
    yes(
        "\\boxed{\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}}",
        "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}",
    );
    yes("\\boxed{y = 2x + 1}", "2x - y + 1 = 0");
}

#[test]
fn symbolic() {
    yes("\\boxed{(x+1)^2}", "x^2 + 2x + 1");
    no("\\boxed{x^2 + 1}", "(x+1)^2");
    yes("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sin(\\pi/3)");
    yes("\\boxed{2\\sqrt{2}}", "\\sqrt{8}");
}

#[test]
fn functions_without_parentheses_take_the_product_that_follows() {
    yes("\\boxed{\\sin 2x}", "2\\sin x\\cos x");
    yes("\\boxed{\\sin 2x}", "\\sin(2x)");
    no("\\boxed{\\sin 2x}", "2\\sin x");
    no("\\boxed{2\\sin x}", "\\sin 2x");
    no("\\boxed{\\sin 2x}", "x\\sin 2");
    yes("\\boxed{\\cos x}", "\\cos(x)");
    yes("\\boxed{\\ln 2x}", "\\ln 2 + \\ln x");
    no("\\boxed{\\ln 2x}", "x\\ln 2");
    yes("\\boxed{\\ln x + 1}", "1 + \\ln(x)");
    yes("\\boxed{\\sin^2 x}", "(\\sin x)^2");
    yes("\\boxed{\\sin^2 x}", "1 - \\cos^2 x");
    yes("\\boxed{\\sin(x)^2}", "\\sin^2 x");
    no("\\boxed{\\sin^2 x}", "\\sin(x^2)");
    yes("\\boxed{\\sin x^2}", "\\sin(x^2)");
    yes("\\boxed{\\log_2 8}", "3");
    no("\\boxed{\\log_2 8}", "\\log(16)");
    yes(
        "\\boxed{\\tan\\theta}",
        "\\frac{\\sin\\theta}{\\cos\\theta}",
    );
    yes("\\boxed{\\sin x \\cos x}", "\\frac{1}{2}\\sin 2x");
    yes("\\boxed{\\sin x \\cos x}", "\\sin(x)\\cos(x)");
    no("\\boxed{\\sin x \\cos x}", "\\sin(x\\cos x)");
    yes("\\boxed{\\cos 2\\pi x}", "\\cos(2\\pi x)");
    yes("\\boxed{\\sin x / 2}", "\\frac{\\sin x}{2}");
    yes("\\boxed{\\sin 30^\\circ}", "\\frac12");
    // `^{-1}` on a trigonometric function is its inverse, not a reciprocal.
    yes("\\boxed{\\sin^{-1} \\frac{1}{2}}", "\\frac{\\pi}{6}");
    yes("\\boxed{\\tan^{-1} x}", "\\arctan x");
    no("\\boxed{\\tan^{-1} x}", "\\frac{1}{\\tan x}");
    no("\\boxed{\\sec^{-1} 2}", "\\frac{1}{\\sec 2}");
}

#[test]
fn commitment_and_letters() {
    no("It is \\boxed{2} or \\boxed{3}.", "2");
    no("I am not sure.", "2");
    yes("So the answer is (C).", "C");
    yes("Therefore: C", "C");
    no("So the answer is (B).", "C");
}

#[test]
fn hostile_answers_are_refused_quickly_not_crashes() {
    // Nesting far past any answer's: refused, not a stack overflow.
    let deep = format!("\\boxed{{{}1{}}}", "(".repeat(100_000), ")".repeat(100_000));
    no(&deep, "1");
    let deep_groups = format!("\\boxed{{{}1{}}}", "{".repeat(5_000), "}".repeat(5_000));
    no(&deep_groups, "1");
    // Numbers too big to build: no value, so not equal (and no time spent building).
    no("\\boxed{((10^{256})^{256})^{256}}", "1");
    no("\\boxed{10^{10^{10^{10}}}}", "1");
    no("\\boxed{1e999999999}", "1");
    no("\\boxed{100000!}", "1");
    // A long chain: too long for a final answer.
    let chain = format!("\\boxed{{{}1}}", "1+".repeat(10_000));
    no(&chain, "10001");
    // A huge response with no answer in it.
    no(&"x".repeat(5_000_000), "1");
}

#[test]
fn a_reward_cannot_be_forged_by_answering_everything() {
    // Answers that try to match any truth: a list of candidates, a variable, a
    // relation that is always true, a set of all the choices.
    no("\\boxed{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}", "7");
    no("\\boxed{x}", "7");
    no("\\boxed{x = x}", "7");
    no("\\boxed{7 = 7}", "x = 7");
    no("\\boxed{A, B, C, D}", "C");
    no("The answer is A or B or C or D.", "C");
    no("\\boxed{\\text{any real number}}", "7");
    no("\\boxed{0/0}", "7");
    no("\\boxed{\\infty}", "7");
}

/// Graded wrong because the answer cannot be read (and the verdict says so).
fn unreadable(response: &str, truth: &str) {
    let v = grade(response, truth);
    assert!(
        !v.correct && v.reason.contains("cannot read"),
        "{response:?} vs {truth:?} should be unreadable: {v:?}"
    );
}

#[test]
fn binomials_floors_extremes_divisors_factorials_and_absolute_values() {
    yes("\\boxed{\\binom{10}{2}}", "45");
    yes("\\boxed{\\dbinom{10}{2}}", "45");
    yes("\\boxed{\\tbinom{10}{8}}", "45");
    yes("\\boxed{{10 \\choose 2}}", "45");
    yes("\\boxed{10 \\choose 2}", "\\binom{10}{2}");
    yes("\\boxed{\\binom52}", "10");
    yes("\\boxed{\\binom{n}{2}}", "\\frac{n(n-1)}{2}");
    no("\\boxed{\\binom{10}{2}}", "102");
    no("\\boxed{\\binom{10}{2}}", "20");
    no("\\boxed{\\binom{10}{2}}", "(10, 2)");

    yes("\\boxed{\\lfloor 7/2 \\rfloor}", "3");
    no("\\boxed{\\lfloor 7/2 \\rfloor}", "7/2");
    no("\\boxed{\\lfloor 7/2 \\rfloor}", "4");
    yes("\\boxed{\\left\\lfloor \\frac{7}{2} \\right\\rfloor}", "3");
    yes("\\boxed{⌊3.5⌋}", "3");
    yes("\\boxed{\\lceil 7/2 \\rceil}", "4");
    no("\\boxed{\\lceil 7/2 \\rceil}", "3");
    yes("\\boxed{\\lfloor -7/2 \\rfloor}", "-4");
    yes("\\boxed{\\lfloor \\pi \\rfloor}", "3");
    yes("\\boxed{\\lfloor \\log_{10} 1000 \\rfloor}", "3");
    yes("\\boxed{2\\lfloor 2.5 \\rfloor}", "4");
    yes("\\boxed{\\operatorname{floor}(7/2)}", "3");

    yes("\\boxed{\\max(3,5)}", "5");
    no("\\boxed{\\max(3,5)}", "35");
    no("\\boxed{\\max(3,5)}", "(3,5)");
    no("\\boxed{\\max(3,5)}", "3");
    yes("\\boxed{\\min(3,5)}", "3");
    yes("\\boxed{\\max\\{3, 5, 4\\}}", "5");
    yes("\\boxed{\\operatorname{max}(3, 5)}", "5");
    yes("\\boxed{\\max \\left( -1, -2 \\right)}", "-1");
    yes("\\boxed{\\max(\\pi, 3)}", "\\pi");
    yes("The answer is max(3, 5).", "5");

    yes("\\boxed{\\gcd(12,18)}", "6");
    no("\\boxed{\\gcd(12,18)}", "1218");
    no("\\boxed{\\gcd(12,18)}", "(12, 18)");
    yes("\\boxed{\\operatorname{lcm}(4,6)}", "12");
    yes("\\boxed{\\mathrm{lcm}(4,6)}", "12");
    yes("\\boxed{\\text{lcm}(4, 6, 10)}", "60");
    no("\\boxed{\\text{lcm}(4,6)}", "24");
    no("\\boxed{\\gcd(1.5, 3)}", "1.5");

    yes("\\boxed{5!}", "120");
    yes("\\boxed{(2+3)!}", "120");
    yes("\\boxed{\\frac{10!}{8!}}", "90");
    yes("\\boxed{0!}", "1");
    no("\\boxed{5!}", "5");
    no("\\boxed{(-1)!}", "1");
    no("\\boxed{(1/2)!}", "1");
    unreadable("\\boxed{5!!}", "15");

    yes("\\boxed{|-3|}", "3");
    yes("\\boxed{\\left| -3 \\right|}", "3");
    yes("\\boxed{\\lvert -3 \\rvert}", "3");
    yes("\\boxed{\\left\\lvert -3 \\right\\rvert}", "3");
    yes("\\boxed{\\abs{-3}}", "3");
    yes("\\boxed{2|x|}", "|2x|");
    yes("\\boxed{|x| + \\left| y \\right|}", "|y| + |x|");
    yes("\\boxed{||x| - 5|}", "|5 - |x||");
    yes("\\boxed{|(2|x|)|}", "2|x|");
    yes("\\boxed{|x||y|}", "|x \\cdot y|");
    no("\\boxed{|x - 3|}", "x - 3");
    // Written the same way, they are the same, though defined only at integers.
    yes("\\boxed{n!}", "n!");
    yes("\\boxed{\\binom{n}{k}}", "\\dbinom{n}{k}");
    no("\\boxed{\\binom{n}{k}}", "\\binom{k}{n}");
}

#[test]
fn unknown_commands_make_the_answer_unreadable_not_dropped() {
    unreadable("\\boxed{\\foo{3}}", "3");
    unreadable("\\boxed{\\neg 5}", "-5");
    unreadable("\\boxed{\\neg 5}", "5");
    unreadable("\\boxed{\\operatorname{sgn}(-2)}", "-2");
    unreadable("\\boxed{\\mathrm{sgn}(-2)}", "-2");
    unreadable("\\boxed{1, 2, \\ldots}", "1, 2");
    unreadable("\\boxed{\\sum 3}", "3");
    unreadable("\\boxed{\\mathbb{R}}", "(-\\infty, \\infty)");
    unreadable("\\boxed{\\max 3, 5}", "5");
    // The commands that only format, space or size still do, and keep what they
    // format.
    yes("\\boxed{\\displaystyle \\dfrac{1}{2}}", "0.5");
    yes("\\boxed{\\left( \\tfrac{1}{2} \\right)}", "\\frac12");
    yes("\\boxed{\\bigl( 1, 2 \\bigr)}", "(1,2)");
    yes("\\boxed{5\\ \\mathrm{cm}}", "5");
    yes("\\boxed{5 \\, \\text{min}}", "5");
    yes("\\boxed{\\hspace{1em} 7 \\quad}", "7");
    yes("\\boxed{\\textcolor{red}{7}}", "7");
    yes("\\boxed{\\mathbf{7}}", "7");
    yes("\\boxed{\\phantom{0}7}", "7");
    yes("\\boxed{\\underline{7}}", "7");
    yes("\\boxed{\\operatorname{sin}(\\pi/2)}", "1");
    yes("\\boxed{\\textdollar 5}", "5");
    yes("\\boxed{30\\textdegree}", "30^\\circ");
    yes("\\boxed{x \\leqq 3}", "x \\le 3");
    // A truth that cannot be read is still matched by the same text.
    yes("\\boxed{\\mathbb{R}}", "\\mathbb{R}");
}

#[test]
fn huge_factorials_and_binomials_are_refused_as_unreadable() {
    for answer in [
        "\\binom{10^{9}}{5*10^8}",
        "\\binom{10^{9}}{5 \\cdot 10^{8}}",
        "{10^{9} \\choose 5 \\cdot 10^{8}}",
        "\\binom{2^{256}}{2^{255}}",
        "1000000!",
        "(10^{300})!",
        "((10!)!)!",
        "1001!",
    ] {
        unreadable(&format!("\\boxed{{{answer}}}"), "1");
    }
    // Large but within bounds: exact.
    yes("\\boxed{\\frac{1000!}{999!}}", "1000");
    yes("\\boxed{\\binom{1000}{998}}", "499500");
    yes("\\boxed{\\binom{10^{9}}{10^{9} - 1}}", "10^9");
    // Nesting and length past any answer's: refused, not a stack overflow or a stall.
    for (open, close) in [
        ("\\lfloor ", "\\rfloor "),
        ("\\left|", "\\right|"),
        ("|", "|"),
        ("\\binom{", "}{1}"),
        ("\\max(", ")"),
        ("{1 \\choose ", "}"),
    ] {
        let deep = format!(
            "\\boxed{{{}1{}}}",
            open.repeat(20_000),
            close.repeat(20_000)
        );
        no(&deep, "1");
    }
    for open in ["\\text{", "\\abs{", "\\mathrm{", "\\operatorname{"] {
        let deep = format!("\\boxed{{{}1{}}}", open.repeat(20_000), "}".repeat(20_000));
        unreadable(&deep, "1");
    }
    let lcm = format!(
        "\\boxed{{\\operatorname{{lcm}}({})}}",
        vec!["(10^{77})^{256}+1"; 25].join(", ")
    );
    no(&lcm, "1");
    let many = format!("\\boxed{{{}}}", "\\binom{1000}{500}".repeat(60));
    no(&many, "1");
}

#[test]
fn exact_arithmetic_on_huge_values_ends_and_never_panics() {
    // Products of whole numbers take no gcd, and fractions past a size become floats:
    // when every exact operation reduced its result, the first of these took a minute.
    // (How long they take is not asserted: a test checks behaviour, not time.)
    let products = format!("\\boxed{{{}}}", vec!["(10^{76})^{256}"; 30].join("\\cdot "));
    no(&products, "1");
    let fractions = format!(
        "\\boxed{{{}}}",
        vec!["\\frac{(10^{76})^{256}}{3^{100}}"; 15].join("+")
    );
    no(&fractions, "1");
    let gcds = format!(
        "\\boxed{{\\gcd({})}}",
        vec!["(10^{76})^{256}+1"; 25].join(", ")
    );
    no(&gcds, "1");
    no("\\boxed{\\binom{2^{200}}{300}}", "1");
    // Undefined, not a panic (a negative power of 0 took a reciprocal of 0).
    no("\\boxed{0^{-1/2}}", "1");
    no("\\boxed{\\frac{1}{0}}", "1");
}

/// Wrong answers that agree with the truth on part of its domain only (positive
/// values, or particular points): the five fixed positive points expressions were once
/// compared at took each of them.
const EQUAL_ONLY_ON_PART_OF_THE_DOMAIN: &[(&str, &str)] = &[
    ("x", "|x|"),
    ("x", "\\sqrt{x^2}"),
    ("\\max(x, 0)", "x"),
    ("\\ln x", "\\ln|x|"),
    ("\\ln x + C", "\\ln|x| + C"),
    ("\\frac{|x|}{x}", "1"),
    ("2\\ln x", "\\ln(x^2)"),
    ("x y", "|x y|"),
    (
        "x + (x-0.7391)(x-1.6317)(x-2.7463)(x-0.9241)(x-1.4683)",
        "x",
    ),
];

#[test]
fn answers_equal_on_part_of_the_domain_are_wrong() {
    for (answer, truth) in EQUAL_ONLY_ON_PART_OF_THE_DOMAIN {
        no(&format!("\\boxed{{{answer}}}"), truth);
    }
    // Points a policy might guess (integers, small ones) are not the points either.
    no("\\boxed{x + x(x-1)(x+1)(x-2)}", "x");
    no("\\boxed{x + \\sin(\\pi x)}", "x");
    no("\\boxed{\\sqrt{x^2+y^2}}", "x+y");
    no("\\boxed{(\\sqrt{x})^2}", "|x|");
    // An equation equal on half the line.
    no("\\boxed{y = x}", "y = |x|");
}

#[test]
fn the_same_function_wherever_the_truth_is_defined_is_right() {
    yes("\\boxed{\\sqrt{x^2}}", "|x|");
    yes("\\boxed{|x|}", "\\sqrt{x^2}");
    yes("\\boxed{\\ln|x|}", "\\ln|x|");
    yes("\\boxed{\\ln\\left|x\\right| + C}", "\\ln|x| + C");
    yes("\\boxed{\\max(x, 0)}", "\\frac{x + |x|}{2}");
    yes("\\boxed{\\ln(x^2)}", "2\\ln|x|");
    yes("\\boxed{\\sqrt{x^2 y^2}}", "|x y|");
    // The truth's domain is the problem's: outside it the answer is not compared.
    yes("\\boxed{\\ln|x|}", "\\ln x");
    yes("\\boxed{\\ln(x y)}", "\\ln x + \\ln y");
    yes("\\boxed{\\sqrt{1-x^2}}", "\\sqrt{(1-x)(1+x)}");
    yes("\\boxed{\\arcsin x}", "\\frac{\\pi}{2} - \\arccos x");
    yes("\\boxed{\\sqrt{x-5}}", "\\sqrt{x-5}\\cdot 1");
    // A removable gap is not a wrong answer.
    yes("\\boxed{\\frac{x^2-1}{x-1}}", "x+1");
    yes("\\boxed{\\frac{x^3-8}{x-2}}", "x^2+2x+4");
    yes("\\boxed{\\frac{x^2 - y^2}{x - y}}", "x + y");
    // Undefined in the reals where the truth is defined, but the same function by
    // algebra: its principal complex value is the truth's.
    yes("\\boxed{\\sqrt{x}\\sqrt{x}}", "x");
    yes("\\boxed{e^{\\ln x}}", "x");
    yes("\\boxed{\\frac{x}{\\sqrt{x}}}", "\\sqrt{x}");
    // ... and where it is not, wrong.
    no("\\boxed{2\\ln x}", "\\ln(x^2)");
    no("\\boxed{\\sqrt{x}}", "\\sqrt{|x|}");
    // Odd roots of negative numbers are real, however written.
    yes("\\boxed{x^{1/3}}", "\\sqrt[3]{x}");
    yes("\\boxed{x^{2/3}}", "\\sqrt[3]{x^2}");
    yes("\\boxed{(-8)^{1/3}}", "-2");
    // Identities.
    yes("\\boxed{\\sin^2 x + \\cos^2 x}", "1");
    yes("\\boxed{2\\sin x\\cos x}", "\\sin 2x");
    yes("\\boxed{1 + \\tan^2 x}", "\\sec^2 x");
    yes("\\boxed{\\frac{1}{x}}", "x^{-1}");
    yes("\\boxed{x^2 + 2 x y + y^2}", "(x+y)^2");
    yes(
        "\\boxed{\\frac{x}{y} + \\frac{y}{x}}",
        "\\frac{x^2+y^2}{x y}",
    );
    yes("\\boxed{e^x e^y}", "e^{x+y}");
    yes("\\boxed{y = |x|}", "y - |x| = 0");
}

#[test]
fn integer_variables_are_compared_at_whole_numbers() {
    yes("\\boxed{\\frac{(n+1)!}{n+1}}", "n!");
    yes("\\boxed{\\binom{n}{n-k}}", "\\binom{n}{k}");
    yes("\\boxed{\\frac{n!}{k!(n-k)!}}", "\\binom{n}{k}");
    yes("\\boxed{\\frac{n(n-1)}{2}}", "\\frac{n!}{2(n-2)!}");
    no("\\boxed{\\binom{n}{k+1}}", "\\binom{n}{k}");
    no("\\boxed{(n+1)!}", "n! \\cdot 1");
    yes("\\boxed{n!}", "n!");
}

#[test]
fn the_same_problem_gets_the_same_points_and_different_problems_different_ones() {
    use super::expr::{Answer, Expr};
    use super::sample::{Variables, seed};
    let expr = |text: &str| match super::read(text) {
        Ok(Answer::Expr(e)) => e,
        other => panic!("{text}: {other:?}"),
    };
    let values = |truth: &Expr| {
        let vars = Variables::new(vec!["x".into()], truth, seed(truth));
        vars.points()
            .map(|p| format!("{:?}", super::value::eval(&Expr::Name("x".into()), &p)))
            .collect::<Vec<_>>()
    };
    let (a, b) = (expr("x^2 + 1"), expr("x^2 + 2"));
    assert_eq!(values(&a), values(&expr("x^2+1")));
    assert_ne!(values(&a), values(&b));
    // Negative values, zero and fractions, and magnitudes past 4.
    let xs: Vec<f64> = [&a, &b]
        .iter()
        .flat_map(|t| {
            let vars = Variables::new(vec!["x".into()], t, seed(*t));
            vars.points()
                .filter_map(|p| super::value::eval(&Expr::Name("x".into()), &p)?.to_f64())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(xs.iter().any(|x| *x < 0.0));
    assert!(xs.iter().any(|x| *x > 0.0 && x.fract() != 0.0));
    assert!(xs.iter().any(|x| x.abs() > 4.0));
}
