//! The math grader against a careful human's verdicts, beside HuggingFace's
//! math-verify on the same cases in the same run.
//!
//! `tests/data/math_grading.toml` holds the cases: a response, the ground truth, the
//! human verdict and why. The test grades each with `rollout::graders::math::grade`,
//! asks `scripts/math_verify_verdicts.py` for math-verify's verdicts, prints the
//! agreement of both with the human per category, and fails unless the grader agrees
//! with the human more often than math-verify does, overall and in no category less.
//! Run with `--nocapture` to see the table (BENCHMARKS.md keeps one).
//!
//! `tests/data/math_grading_heldout.toml` is a held-out set in the same format, written
//! without looking at the grader's code (number separators in the truth, functions
//! applied without parentheses, LaTeX commands to evaluate or to refuse, and a mix of
//! competition-style answers): the grader must agree with the human on at least 97%
//! of it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde::Deserialize;

#[derive(Deserialize)]
struct Cases {
    case: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    category: String,
    response: String,
    truth: String,
    correct: bool,
    note: String,
}

#[derive(Deserialize)]
struct Reference {
    correct: bool,
    seconds: f64,
}

const CASES: &str = "tests/data/math_grading.toml";
const HELD_OUT: &str = "tests/data/math_grading_heldout.toml";

fn load(path: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(path).expect("the grading set");
    toml::from_str::<Cases>(&text)
        .expect("the grading set parses")
        .case
}

/// math-verify's verdicts on the cases of `path`, in case order.
fn math_verify(path: &str) -> Vec<Reference> {
    let out = Command::new("python3")
        .arg("scripts/math_verify_verdicts.py")
        .arg(path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "math-verify did not run ({}); install it with `pip install math-verify==0.9.0` \
         (scripts/test.sh does):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a verdict line"))
        .collect()
}

#[derive(Default)]
struct Tally {
    cases: usize,
    ours: usize,
    theirs: usize,
}

/// Grades every case of `path`, prints the agreement table (per category, the grader
/// and math-verify against the human) and the grader's misses, and returns the tallies.
fn agreement(path: &str) -> (BTreeMap<String, Tally>, Tally) {
    assert!(Path::new(path).exists(), "run from the crate root");
    let cases = load(path);
    let reference = math_verify(path);
    assert_eq!(
        reference.len(),
        cases.len(),
        "one math-verify verdict per case"
    );

    let mut by_category: BTreeMap<String, Tally> = BTreeMap::new();
    let mut total = Tally::default();
    let mut our_misses = Vec::new();
    let mut our_time = 0.0;
    for (case, theirs) in cases.iter().zip(&reference) {
        let start = Instant::now();
        let verdict = rollout::graders::math::grade(&case.response, &case.truth);
        our_time += start.elapsed().as_secs_f64();
        let tally = by_category.entry(case.category.clone()).or_default();
        for t in [&mut *tally, &mut total] {
            t.cases += 1;
            t.ours += usize::from(verdict.correct == case.correct);
            t.theirs += usize::from(theirs.correct == case.correct);
        }
        if verdict.correct != case.correct {
            our_misses.push(format!(
                "  [{}] {:?} vs truth {:?}: human {}, grader {} ({}); note: {}",
                case.category,
                case.response,
                case.truth,
                case.correct,
                verdict.correct,
                verdict.reason,
                case.note
            ));
        }
    }
    let pct = |n: usize, d: usize| 100.0 * n as f64 / d as f64;
    println!("{path}:");
    println!("| category | cases | rollout | math-verify |");
    println!("|---|---:|---:|---:|");
    for (category, t) in &by_category {
        println!(
            "| {category} | {} | {:.0}% | {:.0}% |",
            t.cases,
            pct(t.ours, t.cases),
            pct(t.theirs, t.cases)
        );
    }
    println!(
        "| **all** | {} | **{:.1}%** | **{:.1}%** |",
        total.cases,
        pct(total.ours, total.cases),
        pct(total.theirs, total.cases)
    );
    let their_time: f64 = reference.iter().map(|r| r.seconds).sum();
    let n = cases.len() as f64;
    println!(
        "time per answer: rollout {:.3} ms, math-verify {:.2} ms",
        1e3 * our_time / n,
        1e3 * their_time / n
    );
    if !our_misses.is_empty() {
        println!("cases the grader gets wrong:\n{}", our_misses.join("\n"));
    }
    (by_category, total)
}

#[test]
fn the_grader_agrees_with_human_verdicts_more_than_math_verify() {
    let (by_category, total) = agreement(CASES);
    assert!(total.cases >= 150, "the set has {} cases", total.cases);
    assert!(
        total.ours > total.theirs,
        "the grader agrees with the human on {} of {} cases, math-verify on {}",
        total.ours,
        total.cases,
        total.theirs
    );
    for (category, t) in &by_category {
        assert!(
            t.ours >= t.theirs,
            "in {category} the grader agrees on {} of {}, math-verify on {}",
            t.ours,
            t.cases,
            t.theirs
        );
    }
}

#[test]
fn the_grader_agrees_with_human_verdicts_on_held_out_material() {
    let (_, total) = agreement(HELD_OUT);
    assert!(total.cases >= 100, "the set has {} cases", total.cases);
    // At least 97%, in whole cases.
    assert!(
        total.ours * 100 >= total.cases * 97,
        "the grader agrees with the human on {} of {} held-out cases (goal: 97%)",
        total.ours,
        total.cases
    );
}

/// The math examples (`examples/math.jsonl`) come out as their script intends: each
/// scripted answer, graded against its task's truth, gets the verdict its metadata gives
/// it, so the demo's mixed rewards are the grader's considered ones.
#[test]
fn the_math_examples_grade_as_intended() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/math.jsonl"))
            .unwrap();
    let mut checked = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let task: serde_json::Value = serde_json::from_str(line).unwrap();
        let truth = task["spec"]["grader"]["answer"].as_str().unwrap();
        for a in task["metadata"]["answers"].as_array().unwrap() {
            let response = a["response"].as_str().unwrap();
            let verdict = rollout::graders::math::grade(response, truth);
            assert_eq!(
                verdict.correct,
                a["correct"].as_bool().unwrap(),
                "{response:?} against {truth:?}: {verdict:?}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked}");
}
