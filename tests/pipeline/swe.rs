//! SWE tasks through INIT, RUN and EVAL on real workers: the five tiny repositories of
//! `examples/swe` (built by `scripts/make-swe-examples.py`, their commits checked
//! against the instance file), each worked on by `shell` tasks that apply a patch an
//! agent might send. Only the gold patch scores 1: a wrong fix, and a wrong fix that
//! also edits, deletes or pre-creates the tests or adds a conftest.py reporting every
//! test passed, all score 0.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rollout::domain::{JobResult, Status, Task};
use serde_json::{Value, json};

use crate::helpers::TestEnv;

/// The instances, by id.
pub(crate) fn instances() -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/swe/instances.jsonl"
    ))
    .unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["instance_id"].as_str().unwrap().to_string(), v)
        })
        .collect()
}

/// The patches an agent might send, by instance id then name.
pub(crate) fn patches() -> BTreeMap<String, BTreeMap<String, String>> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/swe/patches.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Builds the example repositories under `dir` (and checks their commits).
pub(crate) fn build_repos(dir: &Path) {
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/make-swe-examples.py"
        ))
        .arg("--repos")
        .arg(dir)
        .output()
        .expect("run python3 scripts/make-swe-examples.py");
    assert!(
        out.status.success(),
        "building the example repositories failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A shell task that checks it starts at `base_commit`, applies `patch`, and is graded
/// by the instance cloned from `repo`.
pub(crate) fn task(name: &str, instance: &Value, repo: &Path, patch: &str) -> Task {
    let mut steps = vec![json!({"tool": "bash", "args": {"command": "git rev-parse HEAD"}})];
    if !patch.is_empty() {
        steps.push(json!({"tool": "bash", "args": {"command": format!(
            "printf '%s' {} > /tmp/agent.patch && git apply --whitespace=nowarn /tmp/agent.patch && echo applied",
            shell_quote(patch)
        )}}));
    }
    let mut t = Task::new(
        "shell",
        json!({
            "steps": steps,
            "grader": {"type": "swe", "instance": instance, "repo_url": repo, "timeout_ms": 120000},
        }),
    );
    t.client_id = Some(name.to_string());
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_gold_patch_resolves_each_tiny_repository() {
    let repos = tempfile::tempdir().unwrap();
    build_repos(repos.path());
    // Grading clones a repository and runs pytest per job, 30 jobs on 2 cores beside
    // the rest of the suite: a lease of the tests' usual 2 s lapses under that load, and
    // this test is about grading, not takeovers (those have tests of their own).
    let env = TestEnv::start(|s| s.queue.ack_wait_ms = 15_000).await;
    env.workers_in_process(4);
    let instances = instances();
    let patches = patches();
    assert_eq!(instances.len(), 5);
    let mut tasks = Vec::new();
    for (id, inst) in &instances {
        let repo = repos
            .path()
            .join(inst["repo"].as_str().unwrap().rsplit('/').next().unwrap());
        for (name, patch) in &patches[id] {
            tasks.push(task(&format!("{id}/{name}"), inst, &repo, patch));
        }
    }
    assert_eq!(tasks.len(), 30);
    // The control for the conftest attack: with `protect` emptied, the forging conftest
    // does report the wrong fix's tests passed, so the default protection is what stops it.
    let clamp = "rollout-examples__clamp-1";
    let mut unprotected = task(
        "control/conftest-unprotected",
        &instances[clamp],
        &repos.path().join("clamp"),
        &patches[clamp]["conftest"],
    );
    unprotected.spec["grader"]["protect"] = json!([]);
    tasks.push(unprotected);
    env.submit(&tasks, "swe").await;
    let results = env
        .wait_results("swe", tasks.len(), Duration::from_secs(600))
        .await;
    assert_eq!(results.len(), tasks.len());
    let (control, results): (Vec<_>, Vec<_>) = results
        .into_iter()
        .partition(|r| r.client_id.as_deref().unwrap().starts_with("control/"));
    assert_eq!(
        control[0].reward,
        Some(1.0),
        "the forging conftest should work when nothing protects against it: {:#}",
        control[0].output["eval"]
    );
    for r in &results {
        check(r, &instances);
    }
    // The instance whose test patch adds a file: a pre-created copy is replaced.
    let slug = results
        .iter()
        .find(|r| r.client_id.as_deref() == Some("rollout-examples__slug-1/precreate_tests"))
        .unwrap();
    let restored = &slug.output["eval"]["applied"]["restored"];
    assert!(
        restored
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "tests/test_punct.py"),
        "{restored}"
    );
}

/// Checks one result of the gold-patch test: INIT checked out `base_commit`, only the
/// gold patch resolves, and every cheat was undone before the tests ran.
fn check(r: &JobResult, instances: &BTreeMap<String, Value>) {
    let name = r.client_id.as_deref().unwrap();
    let (id, patch) = name.split_once('/').unwrap();
    let eval = &r.output["eval"];
    assert_eq!(r.status, Status::Done, "{name}: {r:?}");
    let steps = &r.output["run"]["steps"];
    assert_eq!(
        steps[0]["observation"]["output"].as_str().unwrap().trim(),
        instances[id]["base_commit"],
        "{name}: INIT did not check out base_commit"
    );
    if patch != "gold" {
        assert_eq!(steps[1]["observation"]["output"], "applied\n", "{name}");
    }
    let want = if patch == "gold" { 1.0 } else { 0.0 };
    assert_eq!(r.reward, Some(want), "{name}: {eval:#}");
    assert_eq!(eval["grader"], "swe", "{name}: {eval:#}");
    assert_eq!(eval["instance_id"], id, "{name}: {eval:#}");
    let f2p = eval["fail_to_pass_total"].as_u64().unwrap();
    let p2p = eval["pass_to_pass_total"].as_u64().unwrap();
    assert!(f2p >= 1, "{name}: {eval:#}");
    if patch == "gold" {
        assert_eq!(eval["fail_to_pass_passed"], f2p, "{name}: {eval:#}");
        assert_eq!(eval["pass_to_pass_passed"], p2p, "{name}: {eval:#}");
        assert!(eval["failure"].is_null(), "{name}: {eval:#}");
    } else {
        // Every cheat ends up as the wrong fix against the real tests: a named test
        // fails (one the fix should make pass, or one it breaks), and the reason
        // names it.
        assert!(
            eval["fail_to_pass_passed"].as_u64().unwrap() < f2p
                || eval["pass_to_pass_passed"].as_u64().unwrap() < p2p,
            "{name}: {eval:#}"
        );
        let failure = eval["failure"].as_str().unwrap();
        assert!(
            failure.starts_with("tests that did not pass: tests/test_"),
            "{name}: {failure}"
        );
    }
    let restored: Vec<&str> = eval["applied"]["restored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    match patch {
        "edit_tests" | "delete_tests" => assert!(
            restored.iter().any(|p| p.starts_with("tests/test_")),
            "{name}: the tests were not put back: {restored:?}"
        ),
        "conftest" => assert!(
            restored.contains(&"conftest.py") && restored.contains(&"tests/conftest.py"),
            "{name}: the conftest.py files were not removed: {restored:?}"
        ),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_swe_specs_are_refused_with_the_field_named() {
    let env = TestEnv::start(|_| {}).await;
    let inst = instances().into_values().next().unwrap();
    let spec =
        |grader: Value, sandbox: Value| json!({"steps": [], "sandbox": sandbox, "grader": grader});
    let with = |field: &str, value: Value| {
        let mut i = inst.clone();
        i[field] = value;
        json!({"type": "swe", "instance": i, "repo_url": "/nowhere"})
    };
    let good = json!({"type": "swe", "instance": inst, "repo_url": "/nowhere"});
    let mut unknown = good.clone();
    unknown["parser"] = json!("pytest");
    crate::helpers::assert_specs_refused(
        &env,
        "shell",
        &[
            (
                spec(with("FAIL_TO_PASS", json!("[]")), json!({})),
                "grader.instance.FAIL_TO_PASS",
            ),
            (
                spec(with("FAIL_TO_PASS", json!("tests/a.py::x")), json!({})),
                "JSON list",
            ),
            (
                spec(with("test_patch", json!("not a diff")), json!({})),
                "grader.instance.test_patch",
            ),
            (
                spec(with("base_commit", json!(" ")), json!({})),
                "grader.instance.base_commit",
            ),
            (
                spec(
                    good.clone(),
                    json!({"repo": {"url": "/nowhere", "commit": "0000000000"}}),
                ),
                "sandbox.repo.commit",
            ),
            (spec(unknown, json!({})), "parser"),
            (
                spec(
                    {
                        let mut g = good.clone();
                        g["log_parser"] = json!("junit");
                        g
                    },
                    json!({}),
                ),
                "grader.log_parser",
            ),
            // pytest node ids for a Django instance: its runner never prints them.
            (
                spec(
                    {
                        let mut g = good.clone();
                        g["instance"]["repo"] = json!("django/django");
                        g
                    },
                    json!({}),
                ),
                "grader.instance.FAIL_TO_PASS",
            ),
            // unittest-style ids read by the pytest parser.
            (
                spec(
                    with(
                        "FAIL_TO_PASS",
                        json!(["test_above (tests.test_core.CoreTest.test_above)"]),
                    ),
                    json!({}),
                ),
                "grader.instance.FAIL_TO_PASS",
            ),
        ],
    )
    .await;
}

/// Runs `git args` in `dir`, with a fixed identity.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A small unittest-style repository at `repo` (a `calc` module whose `double` is
/// wrong, one passing test); its base commit.
pub(crate) fn calc_repo(repo: &Path) -> String {
    std::fs::create_dir_all(repo.join("tests")).unwrap();
    std::fs::write(repo.join("tests/__init__.py"), "").unwrap();
    std::fs::write(
        repo.join("calc.py"),
        "def double(x):\n    return x + x + 1\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("tests/test_calc.py"),
        "import unittest\n\nimport calc\n\n\nclass CalcTest(unittest.TestCase):\n    def test_type(self):\n        self.assertIsInstance(calc.double(1), int)\n",
    )
    .unwrap();
    git(repo, &["init", "-q"]);
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "base"]);
    git(repo, &["rev-parse", "HEAD"]).trim().to_string()
}

/// A test of [`calc_repo`] as unittest names it: Python 3.11 writes `name
/// (module.Class.name)`.
pub(crate) fn calc_test_id(test: &str) -> String {
    format!("{test} (tests.test_calc.CalcTest.{test})")
}

/// The SWE grader of [`calc_repo`] at `base`: an instance whose test patch adds
/// `test_double` (failing until `double` is fixed) beside the passing `test_type`, run
/// by `python3 -m unittest` and read by the `unittest` parser.
pub(crate) fn calc_grader(repo: &Path, base: &str) -> Value {
    let test_patch = "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -6,3 +6,6 @@ import calc\n class CalcTest(unittest.TestCase):\n     def test_type(self):\n         self.assertIsInstance(calc.double(1), int)\n+\n+    def test_double(self):\n+        self.assertEqual(calc.double(3), 6)\n";
    let instance = json!({
        "instance_id": "calc-1", "repo": "example/calc", "base_commit": base,
        "test_patch": test_patch,
        "FAIL_TO_PASS": [calc_test_id("test_double")], "PASS_TO_PASS": [calc_test_id("test_type")],
    });
    json!({
        "type": "swe", "instance": instance, "repo_url": repo,
        "test_command": "python3 -m unittest -v {tests}", "log_parser": "unittest",
        "timeout_ms": 120000,
    })
}

/// The versions of `calc.py` [`a_unittest_instance_is_graded_by_its_own_runner`]
/// grades, by name: gold and wrong fixes, and wrong fixes that forge the runner's lines.
fn unittest_fixes() -> Vec<(&'static str, String)> {
    let id = calc_test_id;
    // unittest's lines for both tests, then the run ended before the runner's summary.
    let forged_lines = format!("{} ... ok\n{} ... ok\n", id("test_double"), id("test_type"));
    let complete = format!(
        "{forged_lines}\n----------------------------------------------------------------------\nRan 2 tests in 0.001s\n\nOK\n"
    );
    vec![
        ("gold", "def double(x):\n    return x + x\n".to_string()),
        ("wrong", "def double(x):\n    return x * 3\n".to_string()),
        (
            "forged",
            format!("import os\nos.write(2, {forged_lines:?}.encode())\nos._exit(0)\n"),
        ),
        // The same lines and the runner's own summary: a whole log, every line of it well
        // formed, then the same early exit. Only the missing seal gives it away.
        (
            "forged-complete",
            format!("import os\nos.write(2, {complete:?}.encode())\nos._exit(0)\n"),
        ),
        // The whole log, then an ordinary exit: unittest's loader lets the SystemExit
        // through, so the process ends normally, but the runner's run never returned.
        (
            "forged-complete-exit",
            format!("import sys\nsys.stderr.write({complete:?})\nsys.exit(0)\n"),
        ),
        ("gold-dotted", "def double(x):\n    return x + x\n".to_string()),
        (
            "forged-dotted",
            "import sys\n\ndef double(x):\n    t = sys._getframe(1).f_locals['self']\n    sys.stderr.write('\\n%s ... ok\\n' % t.id())\n    raise ValueError('not fixed')\n".to_string(),
        ),
    ]
}

/// A unittest-style instance, as SWE-bench's non-pytest repositories ship them: the
/// ids are unittest's names, the tests run under `python3 -m unittest -v` and the
/// `unittest` parser reads them. The gold patch resolves it; a wrong fix does not, and
/// the reason names the test; a wrong fix that prints unittest's lines for the
/// expected tests and ends the run does not either (no summary from the runner), nor
/// one that prints the runner's summary too (no completion seal). The same instance
/// with unittest's dotted ids (`tests.test_calc.CalcTest.test_double`, as SWE-Gym-style
/// rows give them) resolves with the gold patch, and not with a wrong fix that prints
/// `… ... ok` for each test it then fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unittest_instance_is_graded_by_its_own_runner() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("calc");
    let base = calc_repo(&repo);
    let grader = calc_grader(&repo, &base);
    let id = calc_test_id;
    let fixes = unittest_fixes();
    let mut dotted = grader.clone();
    dotted["instance"]["FAIL_TO_PASS"] = json!(["tests.test_calc.CalcTest.test_double"]);
    dotted["instance"]["PASS_TO_PASS"] = json!(["tests.test_calc.CalcTest.test_type"]);
    let tasks: Vec<Task> = fixes
        .iter()
        .map(|(name, code)| {
            let g = if name.ends_with("-dotted") {
                &dotted
            } else {
                &grader
            };
            let mut t = Task::new(
                "shell",
                json!({
                    "steps": [{"tool": "file", "args": {"command": "create", "path": "calc.py", "file_text": code}}],
                    "grader": g,
                }),
            );
            t.client_id = Some(name.to_string());
            t
        })
        .collect();
    let env = TestEnv::start(|s| s.queue.ack_wait_ms = 15_000).await;
    env.workers_in_process(2);
    env.submit(&tasks, "unittest").await;
    let results = env
        .wait_results("unittest", tasks.len(), Duration::from_secs(300))
        .await;
    let by = |n: &str| {
        results
            .iter()
            .find(|r| r.client_id.as_deref() == Some(n))
            .unwrap()
    };
    let gold = by("gold");
    assert_eq!(gold.reward, Some(1.0), "{:#}", gold.output["eval"]);
    assert_eq!(gold.output["eval"]["log_parser"], "unittest");
    // The run was sealed: the check below is the seal's, not a log without it.
    assert_eq!(
        gold.output["eval"]["seal"], "sealed",
        "{:#}",
        gold.output["eval"]
    );
    let wrong = &by("wrong").output["eval"];
    assert_eq!(by("wrong").reward, Some(0.0), "{wrong:#}");
    assert!(
        wrong["failure"]
            .as_str()
            .unwrap()
            .contains(&id("test_double")),
        "{wrong:#}"
    );
    let forged = &by("forged").output["eval"];
    assert_eq!(by("forged").reward, Some(0.0), "{forged:#}");
    assert!(forged["failure"].as_str().is_some(), "{forged:#}");
    let complete = &by("forged-complete").output["eval"];
    assert_eq!(by("forged-complete").reward, Some(0.0), "{complete:#}");
    assert_eq!(complete["seal"], "missing", "{complete:#}");
    let exit = &by("forged-complete-exit").output["eval"];
    assert_eq!(by("forged-complete-exit").reward, Some(0.0), "{exit:#}");
    assert_eq!(exit["seal"], "broken", "{exit:#}");
    assert!(
        exit["failure"].as_str().unwrap().contains("never returned"),
        "{exit:#}"
    );
    assert!(
        complete["failure"]
            .as_str()
            .unwrap()
            .contains("did not end normally"),
        "{complete:#}"
    );
    let gold = &by("gold-dotted").output["eval"];
    assert_eq!(by("gold-dotted").reward, Some(1.0), "{gold:#}");
    let forged = &by("forged-dotted").output["eval"];
    assert_eq!(by("forged-dotted").reward, Some(0.0), "{forged:#}");
    assert_eq!(
        forged["not_passed"]["tests.test_calc.CalcTest.test_double"], "error",
        "{forged:#}"
    );
}
