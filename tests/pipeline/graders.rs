//! Graders end to end through `shell` tasks: a math answer graded in the EVAL worker's
//! own process, programs run against stdin/stdout cases and unit tests in a fresh
//! sandbox under time and memory limits, and the ways a program can try to fake a pass.

use std::time::Duration;

use rollout::domain::{JobResult, Status, Task};

use crate::helpers::TestEnv;

/// A shell task whose steps write `solution.py` with `program` and then print `say`,
/// graded by `grader`.
fn task(name: &str, program: &str, say: &str, grader: serde_json::Value) -> Task {
    let mut t = Task::new(
        "shell",
        serde_json::json!({
            "steps": [
                {"tool": "file", "args": {"command": "create", "path": "solution.py", "file_text": program}},
                {"tool": "bash", "args": {"command": format!("printf '%s' {}", shell_quote(say))}},
            ],
            "grader": grader,
        }),
    );
    t.client_id = Some(name.to_string());
    t
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

async fn run_all(env: &TestEnv, tasks: &[Task], batch: &str) -> Vec<JobResult> {
    env.submit(tasks, batch).await;
    let mut results = env
        .wait_results(batch, tasks.len(), Duration::from_secs(300))
        .await;
    results.sort_by_key(|r| r.client_id.clone());
    assert_eq!(results.len(), tasks.len());
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
    }
    results
}

fn by_name<'a>(results: &'a [JobResult], name: &str) -> &'a JobResult {
    results
        .iter()
        .find(|r| r.client_id.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no result for {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_math_answer_is_graded_without_a_sandbox() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let math = |truth: &str| serde_json::json!({"type": "math", "answer": truth});
    let tasks = vec![
        task(
            "a-right",
            "",
            "so the answer is $\\boxed{0.\\overline{3}}$",
            math("\\frac13"),
        ),
        task(
            "b-rounded",
            "",
            "so the answer is $\\boxed{0.333}$",
            math("\\frac13"),
        ),
        task("c-hedged", "", "either \\boxed{2} or \\boxed{3}", math("2")),
        task("d-none", "", "I do not know", math("2")),
        task("e-thousands", "", "#### 1,250", math("1250")),
    ];
    let results = run_all(&env, &tasks, "math").await;
    let want = [1.0, 0.0, 0.0, 0.0, 1.0];
    for (r, w) in results.iter().zip(want) {
        assert_eq!(
            r.reward,
            Some(w),
            "{}: {:#}",
            r.client_id.as_deref().unwrap(),
            r.output["eval"]
        );
        assert_eq!(r.output["eval"]["grader"], "math");
    }
    let eval = &by_name(&results, "b-rounded").output["eval"];
    assert_eq!(eval["extracted"], "0.333");
    assert_eq!(eval["source"], "boxed");
    let hedged = &by_name(&results, "c-hedged").output["eval"];
    assert!(
        hedged["reason"]
            .as_str()
            .unwrap()
            .contains("several different final answers"),
        "{hedged}"
    );
    // No EVAL sandbox was made for a math grade: nothing of the sort in the details.
    assert!(
        by_name(&results, "a-right").output["eval"]
            .get("applied")
            .is_none()
    );
}

/// Three stdin/stdout cases of adding two numbers, rewarded `reward`.
fn io_grader(reward: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "code",
        "run": "python3 solution.py",
        "cases": [
            {"name": "small", "stdin": "2 3\n", "stdout": "5\n"},
            {"name": "negative", "stdin": "-4 1\n", "stdout": "-3"},
            {"name": "large", "stdin": "1000000000 1000000000\n", "stdout": "2000000000\n"},
        ],
        "time_limit_ms": 3000,
        "memory_limit_mb": 256,
        "reward": reward,
    })
}

const ADD: &str = "a, b = map(int, input().split())\nprint(a + b)\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_are_judged_on_their_cases_under_time_and_memory_limits() {
    let env = TestEnv::start(|s| {
        s.stages.eval.concurrency = 4;
    })
    .await;
    env.workers_in_process(1);
    let code = io_grader;
    let tasks = vec![
        task("a-correct", ADD, "", code("all")),
        task(
            "b-wrong",
            "a, b = map(int, input().split())\nprint(a * b)\n",
            "",
            code("all"),
        ),
        task("c-slow", "while True:\n    pass\n", "", code("all")),
        task(
            "d-hungry",
            "x = bytearray(2 * 1024 ** 3)\nprint(len(x))\n",
            "",
            code("all"),
        ),
        task(
            "e-crash",
            "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n",
            "",
            code("all"),
        ),
        task(
            "f-partly",
            "a, b = map(int, input().split())\nprint(a + b if a > 0 else 0)\n",
            "",
            code("fraction"),
        ),
        task("g-exit", "raise SystemExit(3)\n", "", code("all")),
    ];
    let results = run_all(&env, &tasks, "code").await;
    let reward = |n: &str| by_name(&results, n).reward.unwrap();
    let failure = |n: &str| {
        by_name(&results, n).output["eval"]["failure"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        reward("a-correct"),
        1.0,
        "{:#}",
        by_name(&results, "a-correct").output["eval"]
    );
    assert_eq!(by_name(&results, "a-correct").output["eval"]["passed"], 3);

    assert_eq!(reward("b-wrong"), 0.0);
    assert_eq!(
        failure("b-wrong"),
        "small: wrong answer: line 1: expected \"5\", got \"6\""
    );
    // All-or-nothing stops at the first failing case.
    let cases = &by_name(&results, "b-wrong").output["eval"]["cases"];
    assert_eq!(cases[1]["skipped"], "an earlier case failed", "{cases}");

    assert_eq!(reward("c-slow"), 0.0);
    assert!(
        failure("c-slow").contains("time limit exceeded"),
        "{}",
        failure("c-slow")
    );
    assert_eq!(reward("d-hungry"), 0.0);
    assert!(
        failure("d-hungry").contains("memory limit exceeded"),
        "{:#}",
        by_name(&results, "d-hungry").output["eval"]
    );
    let stderr = by_name(&results, "d-hungry").output["eval"]["cases"][0]["stderr"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(stderr.contains("MemoryError"), "{stderr}");
    assert_eq!(reward("e-crash"), 0.0);
    assert!(
        failure("e-crash").contains("crashed"),
        "{}",
        failure("e-crash")
    );
    assert_eq!(reward("g-exit"), 0.0);
    assert!(
        failure("g-exit").contains("runtime error"),
        "{}",
        failure("g-exit")
    );

    // Fraction: the negative case fails, the other two pass.
    let partly = by_name(&results, "f-partly");
    assert!(
        (partly.reward.unwrap() - 2.0 / 3.0).abs() < 1e-9,
        "{:#}",
        partly.output["eval"]
    );
    assert_eq!(partly.output["eval"]["total"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_tests_decide_from_the_log_and_a_program_cannot_fake_or_edit_them() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let tests = "from solution import add\n\ndef test_small():\n    assert add(2, 3) == 5\n\ndef test_negative():\n    assert add(-4, 1) == -3\n";
    let grader = |reward: &str| {
        serde_json::json!({
            "type": "code",
            "tests": {"test_solution.py": tests},
            "test_command": "pytest-3 -rA -p no:cacheprovider test_solution.py",
            "reward": reward,
            "protect": ["test_*.py"],
        })
    };
    let with_test_edit = |program: &str, name: &str, reward: &str| {
        let mut t = task(name, program, "", grader(reward));
        // The agent also rewrites the test file so that it passes.
        t.spec["steps"].as_array_mut().unwrap().push(serde_json::json!(
            {"tool": "bash", "args": {"command": "printf 'def test_small():\\n    pass\\n' > test_solution.py"}}
        ));
        t
    };
    let tasks = vec![
        task(
            "a-right",
            "def add(a, b):\n    return a + b\n",
            "",
            grader("all"),
        ),
        task(
            "b-half",
            "def add(a, b):\n    return abs(a + b)\n",
            "",
            grader("fraction"),
        ),
        // Ends the interpreter with status 0 as soon as pytest imports it.
        task("c-exit-zero", "import os\nos._exit(0)\n", "", grader("all")),
        with_test_edit("def add(a, b):\n    return 0\n", "d-edits-tests", "all"),
    ];
    let results = run_all(&env, &tasks, "tests").await;
    let eval = |n: &str| by_name(&results, n).output["eval"].clone();
    assert_eq!(
        by_name(&results, "a-right").reward,
        Some(1.0),
        "{:#}",
        eval("a-right")
    );
    assert_eq!(
        eval("a-right")["tests"]["results"]["test_solution.py::test_small"],
        "passed"
    );
    assert_eq!(
        by_name(&results, "b-half").reward,
        Some(0.5),
        "{:#}",
        eval("b-half")
    );
    assert_eq!(
        eval("b-half")["failure"],
        "test test_solution.py::test_negative failed"
    );
    let exit = by_name(&results, "c-exit-zero");
    assert_eq!(exit.reward, Some(0.0), "{:#}", eval("c-exit-zero"));
    assert_eq!(
        eval("c-exit-zero")["tests"]["exit_code"],
        0,
        "the run did exit 0"
    );
    // The seal's word on it, which says more than the missing summary.
    assert!(
        eval("c-exit-zero")["failure"]
            .as_str()
            .unwrap()
            .contains("did not end normally"),
        "{:#}",
        eval("c-exit-zero")
    );
    // The rewritten test file is replaced by the task's: the wrong program fails it.
    let edited = by_name(&results, "d-edits-tests");
    assert_eq!(edited.reward, Some(0.0), "{:#}", eval("d-edits-tests"));
    assert_eq!(
        eval("d-edits-tests")["tests"]["results"]["test_solution.py::test_small"],
        "failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_in_the_answer_is_run_and_expected_outputs_never_enter_the_sandbox() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let grader = serde_json::json!({
        "type": "code",
        "program": {"path": "main.py", "language": "python"},
        "run": "python3 main.py",
        "cases": [{"stdin": "2 3\n", "stdout": "5\n"}, {"stdin": "7 8\n", "stdout": "15\n"}],
    });
    let answer = |code: &str| format!("Here is my solution:\n```python\n{code}```\nDone.");
    // A program that looks for the expected outputs anywhere it can read.
    let snoop = "import os\nfound = []\nfor top in ('.', '/tmp', '/var/tmp', '/home', '/root', '/run', '/etc', '/opt'):\n    for root, dirs, files in os.walk(top):\n        for f in files:\n            try:\n                p = os.path.join(root, f)\n                if os.path.isfile(p) and not os.path.islink(p) and {'5', '15'} <= set(open(p, errors='ignore').read(100000).split()):\n                    found.append(os.path.join(root, f))\n            except Exception:\n                pass\nprint(found[0] if found else 'nothing')\n";
    let mut grader = grader;
    grader["time_limit_ms"] = 20_000.into();
    let tasks = vec![
        task("a-answer", "", &answer(ADD), grader.clone()),
        task("b-no-block", "", "print(5)", grader.clone()),
        task("c-snoop", "", &answer(snoop), grader.clone()),
    ];
    let results = run_all(&env, &tasks, "answer").await;
    assert_eq!(
        by_name(&results, "a-answer").reward,
        Some(1.0),
        "{:#}",
        by_name(&results, "a-answer").output["eval"]
    );
    let none = by_name(&results, "b-no-block");
    assert_eq!(none.reward, Some(0.0));
    assert!(
        none.output["eval"]["error"]
            .as_str()
            .unwrap()
            .contains("no closed fenced code block")
    );
    let snoop = by_name(&results, "c-snoop");
    assert_eq!(snoop.reward, Some(0.0));
    assert_eq!(
        snoop.output["eval"]["failure"],
        "case 0: wrong answer: line 1: expected \"5\", got \"nothing\"",
        "{:#}",
        snoop.output["eval"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grader_specs_are_refused_with_the_field_named() {
    let env = TestEnv::start(|_| {}).await;
    let bad = [
        (serde_json::json!({"grader": {"type": "math"}}), "answer"),
        (
            serde_json::json!({"grader": {"type": "math", "answer": " "}}),
            "grader.answer",
        ),
        (serde_json::json!({"grader": {"type": "poetry"}}), "grader"),
        (
            serde_json::json!({"grader": {"type": "code"}}),
            "grader.cases",
        ),
        (
            serde_json::json!({"grader": {"type": "code", "cases": [{"stdin": "", "stdout": ""}]}}),
            "grader.run",
        ),
        (
            serde_json::json!({"grader": {"type": "code", "test_command": "pytest-3", "log_parser": "tap"}}),
            "grader.log_parser",
        ),
        (
            serde_json::json!({"grader": {"type": "code", "test_command": "t", "tests": {"../x.py": ""}}}),
            "grader.tests",
        ),
        (
            serde_json::json!({"check": {"command": "true"}, "grader": {"type": "math", "answer": "1"}}),
            "not both",
        ),
    ];
    crate::helpers::assert_specs_refused(&env, "shell", &bad).await;
}

/// A program that, given `start`, leaves a detached writer behind (a double fork into a
/// session of its own, as a daemon does) and, given `check`, says whether it is alive.
const LEAVES_A_WRITER: &str = r#"import os
if input().strip() == "start":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            fd = os.open("/dev/null", os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(fd, i)
            os.execvp("sh", ["sh", "-c", "while :; do echo beat >> /tmp/beat; sleep 0.05; done # heartbeat-writer"])
        os._exit(0)
    os.wait()
    print("started")
else:
    alive = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                alive += b"heartbeat-writer" in open(f"/proc/{p}/cmdline", "rb").read()
            except OSError:
                pass
    print("alive" if alive else "gone")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_case_started_ends_with_it_even_in_a_session_of_its_own() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let grader = serde_json::json!({
        "type": "code",
        "run": "python3 solution.py",
        "cases": [
            {"name": "start", "stdin": "start\n", "stdout": "started\n"},
            {"name": "check", "stdin": "check\n", "stdout": "gone\n"},
        ],
        "time_limit_ms": 10000,
    });
    let results = run_all(
        &env,
        &[task("writer", LEAVES_A_WRITER, "", grader)],
        "strays",
    )
    .await;
    let eval = &by_name(&results, "writer").output["eval"];
    assert_eq!(results[0].reward, Some(1.0), "{eval:#}");
}
