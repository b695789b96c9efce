//! Shadowing: a module the agent adds that Python loads in place of the runner, the
//! standard library, an installed package, a restored test module or the grader's own
//! hidden file. Every shadow here is a real forgery: [`TROJAN`] makes every pytest and
//! unittest test pass wherever it is imported, then becomes the module it shadows, so
//! the run looks normal. Each test first shows on the host, outside the service, that
//! the forgery works (the workspace as the grader would run it, without the guard:
//! the wrong fix passes), then that the service scores it 0 with the shadow named
//! among what its guard removed before the run (or refused), and that the right fix
//! still scores 1.
//!
//! - [`named_shadows_score_zero_and_right_fixes_still_score_one`]: the forms found
//!   from outside (a package or `__main__` over the command grader's hidden
//!   `checker.py`, an extension module over a protected file, `pytest.py`, `pluggy/`
//!   and `argparse.py` at the root under `python3 -m pytest`, a package in the test
//!   directory over the package under test, a package over a restored unittest
//!   module).
//! - [`the_derived_attack_surface_is_refused`]: nothing listed by hand. For each
//!   grader (SWE with pytest, code with unittest under `-m` and under a runner script
//!   read by the `django` parser, command), the test runs the graded
//!   command on the host with an audit hook, collects every module the run imported
//!   and every workspace file it opened, and plants a shadow of each: every top-level
//!   name at the root and (where pytest puts the test directory first) as a package
//!   there, and a twin and an extension module beside every workspace module it
//!   imported or opened. The grade must be 0
//!   with every planted shadow named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use rollout::domain::{JobResult, Task};
use serde_json::{Value, json};

use crate::forgeries::{assert_all_zero, bash, run, write};
use crate::swe::{build_repos, instances, patches, task as swe_task};

/// The forging shadow (`tests/data/shadow_trojan.py`).
const TROJAN: &str = include_str!("../data/shadow_trojan.py");
/// The sandboxes' Python: they see the host's `/usr`, so the host's system Python is
/// the one the grader runs.
const PYTHON: &str = "/usr/bin/python3";
/// The SWE instance the SWE shadows start from (its wrong fix fails a real test).
const CLAMP: &str = "rollout-examples__clamp-1";
/// The command grader's check: `add` must add.
const CHECK: &str = "from add import add\nassert add(2, 3) == 5\n";
const WRONG_ADD: &str = "def add(a, b):\n    return a - b\n";
const RIGHT_ADD: &str = "def add(a, b):\n    return a + b\n";
/// The code grader's unittest module and the fake one a shadow package holds.
const UNIT_TESTS: &str = "import unittest\n\nfrom calc import mul\n\n\nclass C(unittest.TestCase):\n    def test_small(self):\n        self.assertEqual(mul(2, 3), 6)\n\n    def test_zero(self):\n        self.assertEqual(mul(0, 9), 0)\n";
const FAKE_UNIT_TESTS: &str = "import unittest\n\n\nclass C(unittest.TestCase):\n    def test_small(self):\n        pass\n\n    def test_zero(self):\n        pass\n";
const WRONG_MUL: &str = "def mul(a, b):\n    return a + b\n";
const RIGHT_MUL: &str = "def mul(a, b):\n    return a * b\n";

/// A workspace on the host, as the grader would run it, for the controls and the
/// discovery runs.
struct Local {
    dir: tempfile::TempDir,
}

impl Local {
    fn from_files(files: &BTreeMap<String, String>) -> Local {
        let local = Local {
            dir: tempfile::tempdir().unwrap(),
        };
        for (path, text) in files {
            local.plant(path, text);
        }
        local
    }

    /// A clone of `repo` with `patches` applied in order.
    fn from_repo(repo: &Path, patches: &[&str]) -> Local {
        let local = Local {
            dir: tempfile::tempdir().unwrap(),
        };
        let root = local.root();
        let ok = Command::new("git")
            .args(["clone", "-q"])
            .arg(repo)
            .arg(&root)
            .status()
            .unwrap();
        assert!(ok.success(), "git clone {}", repo.display());
        for (i, patch) in patches.iter().enumerate() {
            let file = local.dir.path().join(format!("p{i}.patch"));
            std::fs::write(&file, patch).unwrap();
            let ok = Command::new("git")
                .args(["apply", "--whitespace=nowarn"])
                .arg(&file)
                .current_dir(&root)
                .status()
                .unwrap();
            assert!(ok.success(), "patch {i} applies");
        }
        local
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn plant(&self, path: &str, text: &str) {
        let p = self.root().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// Runs `command` in the workspace with the sandboxes' programs; whether it
    /// succeeded, and its output.
    fn run(&self, command: &str, env: &[(&str, &str)]) -> (bool, String) {
        let out = Command::new("bash")
            .arg("-c")
            .arg(command)
            .current_dir(self.root())
            .env("PATH", "/usr/bin:/bin")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONPATH")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

/// Whether the host can build the extension-module forgery (gcc and Python's headers,
/// which `scripts/setup.sh` installs); a missing one fails under CI.
fn can_build_extensions(test: &str) -> bool {
    let local = Local::from_files(&BTreeMap::new());
    std::fs::create_dir_all(local.root()).unwrap();
    let (ok, out) = local.run(&build_extension("probe_ext", "."), &[]);
    if !ok {
        crate::prerequisite::missing(
            test,
            &format!(
                "cannot build a Python extension module (gcc and python3-dev): {}",
                out.trim()
            ),
        );
    }
    ok
}

/// A shell command that builds an empty extension module `name` into directory `dir`
/// of the workspace (it imports, and does nothing) and prints `built-<name>`.
fn build_extension(name: &str, dir: &str) -> String {
    format!(
        "set -e\nmkdir -p {dir}\nprintf '%s\\n' '#include <Python.h>' 'static struct PyModuleDef d = {{PyModuleDef_HEAD_INIT, \"{name}\", 0, -1, 0}};' 'PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&d); }}' > /tmp/ext_{name}.c\ngcc -shared -fPIC $(/usr/bin/python3-config --includes) /tmp/ext_{name}.c -o \"{dir}/{name}$({PYTHON} -c 'import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])')\"\necho built-{name}\n"
    )
}

/// A `shell` task with `sandbox`, `steps` and grading `field` (`check` or `grader`).
fn shell_task(name: &str, sandbox: Value, steps: Vec<Value>, field: &str, grading: Value) -> Task {
    let mut spec = json!({"sandbox": sandbox, "steps": steps});
    spec[field] = grading;
    let mut t = Task::new("shell", spec);
    t.client_id = Some(name.to_string());
    t
}

/// The files of a step list that writes files (for the controls).
fn written(steps: &[Value]) -> Vec<(String, String)> {
    steps
        .iter()
        .filter(|s| s["tool"] == "file")
        .map(|s| {
            (
                s["args"]["path"].as_str().unwrap().to_string(),
                s["args"]["file_text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The command grader's task with a hidden `checker.py` run by `command`.
fn hidden_checker(name: &str, add: &str, command: &str, steps: Vec<Value>) -> Task {
    shell_task(
        name,
        json!({"files": {"add.py": add}}),
        steps,
        "check",
        json!({"command": command, "files": {"checker.py": CHECK}}),
    )
}

/// The command grader's task whose `check_add.py` is in the sandbox and protected.
fn protected_check(name: &str, steps: Vec<Value>) -> Task {
    shell_task(
        name,
        json!({"files": {"add.py": WRONG_ADD, "check_add.py": CHECK}}),
        steps,
        "check",
        json!({"command": "python3 -c 'import check_add'", "protect": ["check_add.py"]}),
    )
}

/// The code grader with unittest over `tests/test_calc.py`.
fn unittest_grader() -> Value {
    json!({
        "type": "code",
        "tests": {"tests/__init__.py": "", "tests/test_calc.py": UNIT_TESTS},
        "test_command": "python3 -m unittest -v tests.test_calc",
        "log_parser": "unittest",
    })
}

fn unittest_task(name: &str, steps: Vec<Value>) -> Task {
    shell_task(name, json!({}), steps, "grader", unittest_grader())
}

/// A test runner started as a script from a directory that is not a package, as
/// Django's `tests/runtests.py` is: unittest over `test_calc`, the repository's root
/// on the path after the runner's own directory.
const RUNNER_SCRIPT: &str = "import os\nimport sys\nimport unittest\n\nsys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\nsuite = unittest.defaultTestLoader.loadTestsFromName('test_calc')\nresult = unittest.TextTestRunner(verbosity=2).run(suite)\nsys.exit(not result.wasSuccessful())\n";
/// The command that starts it.
const SCRIPT_RUNNER: &str = "python3 tests/runtests.py";

/// The grader's files of the script runner's task (the runner and its test module).
fn script_runner_files() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("tests/runtests.py".to_string(), RUNNER_SCRIPT.to_string()),
        ("tests/test_calc.py".to_string(), UNIT_TESTS.to_string()),
    ])
}

/// The code grader with the script runner, its log read by the `django` parser.
fn script_runner_task(name: &str, steps: Vec<Value>) -> Task {
    let grader = json!({
        "type": "code",
        "tests": script_runner_files(),
        "test_command": SCRIPT_RUNNER,
        "log_parser": "django",
    });
    shell_task(name, json!({}), steps, "grader", grader)
}

/// The files the code grader's workspace holds once graded, with the program `calc`.
fn unittest_files(calc: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("calc.py".to_string(), calc.to_string()),
        ("tests/__init__.py".to_string(), String::new()),
        ("tests/test_calc.py".to_string(), UNIT_TESTS.to_string()),
    ])
}

/// Asserts each result named in `right` scored 1.
fn assert_one(results: &BTreeMap<String, JobResult>, right: &[&str]) {
    for name in right {
        let r = &results[*name];
        assert_eq!(
            r.reward,
            Some(1.0),
            "the right fix {name} must still score 1: {:#}",
            r.output["eval"]
        );
    }
}

/// Asserts the jobs named in `right` scored 1, every other one 0, and each job of
/// `planted` had every shadow it planted removed or refused by the guard.
fn assert_right_one_rest_zero(
    results: &BTreeMap<String, JobResult>,
    right: &[&str],
    planted: &BTreeMap<String, Vec<String>>,
) {
    assert_one(results, right);
    let forged: BTreeMap<String, JobResult> = results
        .iter()
        .filter(|(n, _)| !right.contains(&n.as_str()))
        .map(|(n, r)| (n.clone(), r.clone()))
        .collect();
    assert_all_zero(&forged);
    for (name, paths) in planted {
        assert_named(name, &results[name], paths);
    }
}

/// The SWE grader's command, as a graded run of the gold patch reported it.
fn swe_command(results: &BTreeMap<String, JobResult>, gold: &str) -> String {
    results[gold].output["eval"]["command"]
        .as_str()
        .expect("a graded SWE run reports its command")
        .to_string()
}

/// The `clamp` example repository built on the host, with its instance and patches.
struct Clamp {
    _repos: tempfile::TempDir,
    repo: PathBuf,
    instance: Value,
    patches: BTreeMap<String, String>,
    test_patch: String,
}

impl Clamp {
    fn build() -> Clamp {
        let repos = tempfile::tempdir().unwrap();
        build_repos(repos.path());
        let instance = instances()[CLAMP].clone();
        let test_patch = instance["test_patch"].as_str().unwrap().to_string();
        Clamp {
            repo: repos.path().join("clamp"),
            _repos: repos,
            instance,
            patches: patches()[CLAMP].clone(),
            test_patch,
        }
    }
}

/// The named SWE shadows over the wrong fix, by job name.
fn swe_shadows() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("swe/pytest-at-root", vec![write("pytest.py", TROJAN)]),
        (
            "swe/pluggy-at-root",
            vec![write("pluggy/__init__.py", TROJAN)],
        ),
        ("swe/argparse-at-root", vec![write("argparse.py", TROJAN)]),
        (
            "swe/package-in-tests",
            vec![write("tests/numkit/__init__.py", TROJAN)],
        ),
    ]
}

/// A command-grader forgery for the controls: its name, the check command, the steps
/// that plant it, and the file the grader expects (hidden or protected).
type CommandForgery<'a> = (&'a str, &'a str, &'a Vec<Value>, &'a str);

/// The controls: on the host, without the guard, each named forgery does make its
/// wrong fix pass (so the service's 0 is the guard's doing).
fn assert_forgeries_work_unguarded(
    clamp: &Clamp,
    command: &str,
    swe_shadows: &[(&str, Vec<Value>)],
    commands: &[CommandForgery<'_>],
) {
    for (name, steps) in swe_shadows {
        let local = Local::from_repo(&clamp.repo, &[&clamp.patches["wrong"], &clamp.test_patch]);
        let (ok, _) = local.run(command, &[]);
        assert!(!ok, "the wrong fix alone must fail its tests");
        for (path, text) in written(steps) {
            local.plant(&path, &text);
        }
        let (ok, out) = local.run(command, &[]);
        assert!(
            ok && out.contains("3 passed"),
            "{name}: the shadow should make the wrong fix pass without the guard: {out}"
        );
    }
    for (name, command, steps, base) in commands {
        let local = Local::from_files(&BTreeMap::from([
            ("add.py".to_string(), WRONG_ADD.to_string()),
            (base.to_string(), CHECK.to_string()),
        ]));
        assert!(!local.run(command, &[]).0, "{name}: the check must fail");
        for (path, text) in written(steps) {
            local.plant(&path, &text);
        }
        for step in steps.iter().filter(|s| s["tool"] == "bash") {
            let (ok, out) = local.run(step["args"]["command"].as_str().unwrap(), &[]);
            assert!(ok, "{name}: {out}");
        }
        let (ok, out) = local.run(command, &[]);
        assert!(
            ok,
            "{name}: the shadow should pass the check without the guard: {out}"
        );
    }
    let local = Local::from_files(&unittest_files(WRONG_MUL));
    local.plant("tests/test_calc/__init__.py", FAKE_UNIT_TESTS);
    let (ok, out) = local.run("python3 -m unittest -v tests.test_calc", &[]);
    assert!(
        ok && out.contains("OK"),
        "the package over the restored test module should pass without the guard: {out}"
    );
}

/// The shadows each named forgery plants, by job.
fn named_planted(swe_shadows: &[(&str, Vec<Value>)]) -> BTreeMap<String, Vec<String>> {
    let mut planted: BTreeMap<String, Vec<String>> = swe_shadows
        .iter()
        .map(|(n, steps)| {
            (
                n.to_string(),
                written(steps).into_iter().map(|(p, _)| p).collect(),
            )
        })
        .collect();
    for (name, path) in [
        ("command/hidden-package", "checker/__init__.py"),
        ("command/hidden-main", "checker/__init__.py"),
        ("command/protected-extension", "check_add.ext"),
        (
            "code/unittest-package-over-module",
            "tests/test_calc/__init__.py",
        ),
    ] {
        planted.insert(name.to_string(), vec![path.to_string()]);
    }
    planted
}

/// Asserts what the named test's jobs must show besides their rewards: the right fix's
/// workspace imports on record, and the extension forgery really built in its sandbox.
fn assert_on_record(results: &BTreeMap<String, JobResult>) {
    // What the right fix's run loaded from the workspace is on record.
    let imported = &results["swe/right"].output["eval"]["guard"]["imported"];
    assert!(
        imported
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p == "numkit/core.py")),
        "the run's workspace imports are not recorded: {imported}"
    );
    let built =
        &results["command/protected-extension"].output["run"]["steps"][0]["observation"]["output"];
    assert!(
        built
            .as_str()
            .unwrap_or_default()
            .contains("built-check_add"),
        "the extension forgery was not built in the sandbox: {built}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_shadows_score_zero_and_right_fixes_still_score_one() {
    let test = "named_shadows_score_zero_and_right_fixes_still_score_one";
    if !can_build_extensions(test) {
        return;
    }
    let clamp = Clamp::build();
    let (inst, repo, patch) = (&clamp.instance, &clamp.repo, &clamp.patches);
    let swe_shadows = swe_shadows();
    let mut tasks = Vec::new();
    for (name, steps) in &swe_shadows {
        let mut t = swe_task(name, inst, repo, &patch["wrong"]);
        t.spec["steps"]
            .as_array_mut()
            .unwrap()
            .extend(steps.clone());
        tasks.push(t);
    }
    let mut gold = swe_task("swe/right", inst, repo, &patch["gold"]);
    // A right fix may add modules of its own: a submodule, and a new top-level module.
    gold.spec["steps"].as_array_mut().unwrap().extend([
        write("numkit/bounds.py", "LOW = 0\n"),
        write("clamp_notes.py", "NOTES = []\n"),
    ]);
    tasks.push(gold);
    let package = vec![write("checker/__init__.py", "")];
    let main = vec![
        write("checker/__init__.py", ""),
        write("checker/__main__.py", ""),
    ];
    let extension = vec![bash(&build_extension("check_add", "."))];
    tasks.extend([
        hidden_checker(
            "command/hidden-package",
            WRONG_ADD,
            "python3 -c 'import checker'",
            package.clone(),
        ),
        hidden_checker(
            "command/hidden-main",
            WRONG_ADD,
            "python3 -m checker",
            main.clone(),
        ),
        protected_check("command/protected-extension", extension.clone()),
        hidden_checker(
            "command/right-import",
            RIGHT_ADD,
            "python3 -c 'import checker'",
            vec![],
        ),
        hidden_checker(
            "command/right-main",
            RIGHT_ADD,
            "python3 -m checker",
            vec![],
        ),
        unittest_task(
            "code/unittest-package-over-module",
            vec![
                write("calc.py", WRONG_MUL),
                write("tests/test_calc/__init__.py", FAKE_UNIT_TESTS),
            ],
        ),
        unittest_task("code/right", vec![write("calc.py", RIGHT_MUL)]),
    ]);
    let results = run(tasks, "named-shadows", 3).await;
    let right = [
        "swe/right",
        "command/right-import",
        "command/right-main",
        "code/right",
    ];
    let planted = named_planted(&swe_shadows);
    assert_right_one_rest_zero(&results, &right, &planted);
    assert_on_record(&results);

    // The controls: on the host, without the guard, each forgery does pass its wrong fix.
    let command = swe_command(&results, "swe/right");
    let commands = [
        (
            "hidden-package",
            "python3 -c 'import checker'",
            &package,
            "checker.py",
        ),
        ("hidden-main", "python3 -m checker", &main, "checker.py"),
        (
            "protected-extension",
            "python3 -c 'import check_add'",
            &extension,
            "check_add.py",
        ),
    ];
    assert_forgeries_work_unguarded(&clamp, &command, &swe_shadows, &commands);
}

/// What a graded run touched, from an audit hook in its every Python.
struct Touched {
    /// Top-level names of the modules imported from a file.
    names: BTreeSet<String>,
    /// Workspace-relative paths of the Python files the run imported or opened there.
    workspace_modules: BTreeSet<String>,
    /// Other workspace files it opened (configuration).
    workspace_files: BTreeSet<String>,
}

/// The recorder: every Python of the run writes what it imported and opened at exit.
const RECORDER: &str = r#"import atexit, json, os, sys
_opened = []
def _hook(event, args):
    if event == "open" and args and isinstance(args[0], str):
        _opened.append(os.path.abspath(args[0]))
sys.addaudithook(_hook)
def _dump():
    mods = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}
    out = os.path.join(os.environ["ROLLOUT_RECORD"], "%d.json" % os.getpid())
    with open(out, "w") as f:
        json.dump({"modules": {n: p for n, p in mods.items() if isinstance(p, str)}, "opened": _opened}, f)
atexit.register(_dump)
"#;

/// Runs `command` in `local` with the recorder and reads what the run touched.
fn discover(local: &Local, command: &str) -> Touched {
    let rec = tempfile::tempdir().unwrap();
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("sitecustomize.py"), RECORDER).unwrap();
    let (_, out) = local.run(
        command,
        &[
            ("PYTHONPATH", site.path().to_str().unwrap()),
            ("ROLLOUT_RECORD", rec.path().to_str().unwrap()),
        ],
    );
    let root = std::fs::canonicalize(local.root()).unwrap();
    let mut touched = Touched {
        names: BTreeSet::new(),
        workspace_modules: BTreeSet::new(),
        workspace_files: BTreeSet::new(),
    };
    let mut any = false;
    for entry in std::fs::read_dir(rec.path()).unwrap() {
        any = true;
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap()).unwrap();
        let in_ws = |p: &str| {
            std::fs::canonicalize(p)
                .ok()
                .and_then(|c| c.strip_prefix(&root).ok().map(|r| r.to_path_buf()))
                .map(|r| r.to_string_lossy().into_owned())
        };
        for (name, file) in v["modules"].as_object().unwrap() {
            let top = name.split('.').next().unwrap();
            if ["sitecustomize", "__main__"].contains(&top) {
                continue;
            }
            touched.names.insert(top.to_string());
            if let Some(rel) = in_ws(file.as_str().unwrap()) {
                touched.workspace_modules.insert(rel);
            }
        }
        for p in v["opened"].as_array().unwrap() {
            if let Some(rel) = in_ws(p.as_str().unwrap()) {
                if rel.ends_with(".py") {
                    touched.workspace_modules.insert(rel);
                } else {
                    touched.workspace_files.insert(rel);
                }
            }
        }
    }
    assert!(any, "the discovery run recorded nothing: {out}");
    touched
}

/// A step that writes [`TROJAN`] at each of `paths` (one step: the task stays small).
fn plant_trojans(paths: &[String]) -> Value {
    let mut command =
        format!("set -e\ncat > /tmp/trojan.py <<'ROLLOUT_TROJAN'\n{TROJAN}ROLLOUT_TROJAN\n");
    for p in paths {
        command.push_str(&format!(
            "mkdir -p \"$(dirname '{p}')\" && cp /tmp/trojan.py '{p}'\n"
        ));
    }
    command.push_str("echo planted\n");
    bash(&command)
}

/// The shadows to plant for what a run touched, by job: every top-level name at the
/// root and, when the run has one, as a package in a test directory that can be on the
/// path (`test_dir`), and a twin (a package beside a module file, a module file beside
/// a package) and an extension module beside every workspace module. Names the
/// workspace already holds at a place are planted beside it, not over it. Returns (job
/// suffix, steps, planted paths). `agents` are the modules the agent itself wrote (its
/// program, at the root): a twin or a second copy of the agent's own module shadows
/// nothing the grader expects (the agent could put the same code in the module itself).
fn shadows_of(
    touched: &Touched,
    test_dir: Option<&str>,
    agents: &[&str],
) -> Vec<(String, Vec<Value>, Vec<String>)> {
    let own = &touched.workspace_modules;
    let mut root = Vec::new();
    let mut in_tests = Vec::new();
    for name in &touched.names {
        let file = format!("{name}.py");
        if !own.contains(&file) && !own.contains(&format!("{name}/__init__.py")) {
            root.push(file);
        }
        // A module of the agent's own is code under test wherever it sits: a second
        // copy of it shadows nothing the grader expects.
        let agents_own = agents
            .iter()
            .any(|a| a.strip_suffix(".py").is_some_and(|stem| stem == name));
        if let Some(dir) = test_dir.filter(|_| !agents_own) {
            let package = format!("{dir}/{name}/__init__.py");
            if !own.contains(&package) && !own.contains(&format!("{dir}/{name}.py")) {
                in_tests.push(package);
            }
        }
    }
    let mut twins = Vec::new();
    let mut extensions = Vec::new();
    let mut builds = Vec::new();
    for module in own {
        let (dir, file) = module.rsplit_once('/').unwrap_or(("", module));
        let Some(stem) = file.strip_suffix(".py") else {
            continue;
        };
        let (dir, stem, twin) = if stem == "__init__" {
            let (d, s) = dir.rsplit_once('/').unwrap_or(("", dir));
            (d, s, format!("{}{s}.py", prefix(d)))
        } else {
            (dir, stem, format!("{}{stem}/__init__.py", prefix(dir)))
        };
        if !own.contains(&twin) && !agents.contains(&module.as_str()) {
            twins.push(twin);
        }
        builds.push(bash(&build_extension(
            stem,
            if dir.is_empty() { "." } else { dir },
        )));
        extensions.push(format!("{}{stem}.ext", prefix(dir)));
    }
    let mut beside = vec![plant_trojans(&twins)];
    beside.extend(builds);
    twins.extend(extensions);
    let mut jobs = vec![
        ("root".to_string(), vec![plant_trojans(&root)], root),
        ("beside".to_string(), beside, twins),
    ];
    if test_dir.is_some() {
        jobs.push((
            "test-dir".to_string(),
            vec![plant_trojans(&in_tests)],
            in_tests,
        ));
    }
    jobs
}

/// `dir/` (nothing for the root).
fn prefix(dir: &str) -> String {
    if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    }
}

/// Asserts every planted path of `planted` is named among what the guard removed or
/// refused in `r` (an `.ext` path stands for the extension module of that stem,
/// whatever its suffix).
fn assert_named(name: &str, r: &JobResult, planted: &[String]) {
    let guard = &r.output["eval"]["guard"];
    let refused: Vec<String> = ["removed", "refused"]
        .iter()
        .filter_map(|k| guard[*k].as_array())
        .flatten()
        .map(|x| x["path"].as_str().unwrap_or_default().to_string())
        .collect();
    let missing: Vec<&String> = planted
        .iter()
        .filter(|p| match p.strip_suffix(".ext") {
            Some(stem) => !refused.iter().any(|r| {
                r.strip_prefix(stem)
                    .is_some_and(|rest| rest.starts_with('.') && !rest.ends_with(".py"))
            }),
            None => !refused.contains(p),
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{name}: {} of {} planted shadows were neither removed nor refused: {missing:?}\n{:#}",
        missing.len(),
        planted.len(),
        r.output["eval"]
    );
}

/// What each grader's run touches (SWE with pytest, code with unittest, command),
/// from a real run on the host.
fn discover_all(clamp: &Clamp, pytest_command: &str) -> [Touched; 4] {
    // What each grader's run touches, from a real run on the host.
    let swe = discover(
        &Local::from_repo(&clamp.repo, &[&clamp.patches["wrong"], &clamp.test_patch]),
        pytest_command,
    );
    let code = discover(
        &Local::from_files(&unittest_files(WRONG_MUL)),
        "python3 -m unittest -v tests.test_calc",
    );
    let command = discover(
        &Local::from_files(&BTreeMap::from([
            ("add.py".to_string(), WRONG_ADD.to_string()),
            ("checker.py".to_string(), CHECK.to_string()),
        ])),
        "python3 -m checker",
    );
    let mut files = script_runner_files();
    files.insert("calc.py".into(), WRONG_MUL.into());
    let script = discover(&Local::from_files(&files), SCRIPT_RUNNER);
    for (what, t) in [
        ("pytest", &swe),
        ("unittest", &code),
        ("checker", &command),
        ("unittest", &script),
    ] {
        assert!(
            t.names.contains(what) || what == "checker",
            "the {what} run's modules were not recorded: {:?}",
            t.names
        );
        println!(
            "{what}: {} top-level modules, {} workspace modules, {} other workspace files",
            t.names.len(),
            t.workspace_modules.len(),
            t.workspace_files.len()
        );
    }
    assert!(
        swe.workspace_modules.contains("tests/test_core.py")
            && code.workspace_modules.contains("tests/test_calc.py")
            && command.workspace_modules.contains("checker.py")
            && script.workspace_modules.contains("tests/runtests.py"),
        "the runs' own workspace modules were not recorded"
    );
    [swe, code, command, script]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_derived_attack_surface_is_refused() {
    let test = "the_derived_attack_surface_is_refused";
    if !can_build_extensions(test) {
        return;
    }
    let clamp = Clamp::build();
    let (inst, repo, patch) = (&clamp.instance, &clamp.repo, &clamp.patches);
    let pytest_command = "python3 -m pytest -rA -p no:cacheprovider 'tests/test_core.py'";
    let [swe, code, command, script] = discover_all(&clamp, pytest_command);

    let mut tasks = Vec::new();
    let mut planted = BTreeMap::new();
    for (suffix, steps, paths) in shadows_of(&swe, Some("tests"), &[]) {
        let name = format!("swe/{suffix}");
        let mut t = swe_task(&name, inst, repo, &patch["wrong"]);
        t.spec["steps"].as_array_mut().unwrap().extend(steps);
        tasks.push(t);
        planted.insert(name, paths);
    }
    for (suffix, steps, paths) in shadows_of(&code, None, &["calc.py"]) {
        let name = format!("code/{suffix}");
        let mut all = vec![write("calc.py", WRONG_MUL)];
        all.extend(steps);
        tasks.push(unittest_task(&name, all));
        planted.insert(name, paths);
    }
    // A runner started as a script puts its own directory first: Django's runtests.py.
    for (suffix, steps, paths) in shadows_of(&script, Some("tests"), &["calc.py"]) {
        let name = format!("script/{suffix}");
        let mut all = vec![write("calc.py", WRONG_MUL)];
        all.extend(steps);
        tasks.push(script_runner_task(&name, all));
        planted.insert(name, paths);
    }
    for (suffix, steps, paths) in shadows_of(&command, None, &[]) {
        let name = format!("command/{suffix}");
        tasks.push(hidden_checker(
            &name,
            WRONG_ADD,
            "python3 -m checker",
            steps,
        ));
        planted.insert(name, paths);
    }
    // Every workspace file the runs opened other than modules (configuration), edited
    // to load a forging plugin: the grader puts each back.
    for f in &swe.workspace_files {
        let name = format!("swe/config:{f}");
        let mut t = swe_task(&name, inst, repo, &patch["wrong"]);
        t.spec["steps"].as_array_mut().unwrap().extend([
            write("forge.py", TROJAN),
            write(
                f,
                "[pytest]\naddopts = -p forge\n[tool:pytest]\naddopts = -p forge\n",
            ),
        ]);
        tasks.push(t);
    }
    let mut right = swe_task("swe/right", inst, repo, &patch["gold"]);
    right.spec["steps"]
        .as_array_mut()
        .unwrap()
        .push(write("numkit/bounds.py", "LOW = 0\n"));
    tasks.push(right);
    tasks.push(unittest_task(
        "code/right",
        vec![write("calc.py", RIGHT_MUL)],
    ));
    tasks.push(hidden_checker(
        "command/right",
        RIGHT_ADD,
        "python3 -m checker",
        vec![],
    ));
    tasks.push(script_runner_task(
        "script/right",
        vec![write("calc.py", RIGHT_MUL)],
    ));
    let results = run(tasks, "derived-shadows", 3).await;
    let rights = ["swe/right", "code/right", "command/right", "script/right"];
    assert_right_one_rest_zero(&results, &rights, &planted);
    assert_eq!(
        swe_command(&results, "swe/right"),
        pytest_command,
        "the discovery ran another command than the grader"
    );
}
