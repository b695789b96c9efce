//! SWE-bench-style instances: what a repository task is, which files its test patch
//! touches, and the verdict from a test run's results.
//!
//! An instance is SWE-bench's record as its datasets ship it: `instance_id`, `repo`
//! (`owner/name`), `base_commit`, the gold `patch`, the `test_patch` that adds or changes
//! the tests, and the tests that must go from failing to passing (`FAIL_TO_PASS`) and
//! keep passing (`PASS_TO_PASS`), as JSON lists or as the JSON-encoded strings of lists
//! the HuggingFace exports hold. Other fields (`problem_statement`, `hints_text`,
//! `version`, …) are kept as they are.
//!
//! The reward is 1 iff every named test passed in the log; a test the log does not
//! mention did not pass (a run that crashed, or an agent that deleted it).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize};

use super::logs::TestStatus;

/// A SWE-bench instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    /// The instance's name (`astropy__astropy-12907`).
    pub instance_id: String,
    /// The repository, `owner/name`.
    pub repo: String,
    /// The commit the agent starts from and the tests are applied to.
    pub base_commit: String,
    /// The gold patch (never shown to the agent; kept for checking the instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// The patch that adds the instance's tests.
    pub test_patch: String,
    /// Tests that fail before the fix and must pass after it.
    #[serde(rename = "FAIL_TO_PASS", deserialize_with = "test_names")]
    pub fail_to_pass: Vec<String>,
    /// Tests that pass before the fix and must still pass.
    #[serde(rename = "PASS_TO_PASS", default, deserialize_with = "test_names")]
    pub pass_to_pass: Vec<String>,
    /// The commit SWE-bench builds the instance's environment from (recorded; the
    /// environment is the task's sandbox image or setup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_setup_commit: Option<String>,
    /// A prepared image holding the environment and the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The dataset's other fields, kept as they were.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A list of test names, or a JSON string holding one (SWE-bench's HuggingFace form).
fn test_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        List(Vec<String>),
        Encoded(String),
    }
    match Names::deserialize(d)? {
        Names::List(v) => Ok(v),
        Names::Encoded(s) if s.trim().is_empty() => Ok(Vec::new()),
        Names::Encoded(s) => serde_json::from_str(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "a string of test names must hold a JSON list of strings: {e}"
            ))
        }),
    }
}

/// The paths a unified diff touches, both sides of renames included, in order and once
/// each (from `--- a/…`, `+++ b/…`, `rename from/to` and, for diffs without content
/// lines such as binary or mode changes, the `diff --git` header).
pub fn patch_paths(patch: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut add = |p: Option<String>| {
        if let Some(p) = p
            && !p.is_empty()
            && seen.insert(p.clone())
        {
            out.push(p);
        }
    };
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("--- ") {
            add(side_path(rest, "a/"));
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            add(side_path(rest, "b/"));
        } else if let Some(rest) = line.strip_prefix("rename from ") {
            add(Some(unquote(rest)));
        } else if let Some(rest) = line.strip_prefix("rename to ") {
            add(Some(unquote(rest)));
        } else if let Some(rest) = line.strip_prefix("diff --git ") {
            add(header_path(rest));
        }
    }
    out
}

/// The files a test patch leaves in place (added or changed, not deleted): the test
/// files to run when the task names no command.
pub fn patched_files(patch: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("+++ ")
            && let Some(p) = side_path(rest, "b/")
            && !out.contains(&p)
        {
            out.push(p);
        }
    }
    out
}

/// A `---`/`+++` line's path without its `a/`/`b/` side, or `None` for `/dev/null`.
fn side_path(rest: &str, side: &str) -> Option<String> {
    // Git ends the name with a tab when it holds spaces; anything after is a timestamp.
    let name = unquote(rest.split('\t').next().unwrap_or(rest).trim_end());
    if name == "/dev/null" {
        return None;
    }
    Some(name.strip_prefix(side).unwrap_or(&name).to_string())
}

/// The path of a `diff --git a/X b/X` header when both sides agree (a binary or
/// mode-only change); renames are read from their own lines.
fn header_path(rest: &str) -> Option<String> {
    if rest.starts_with('"') {
        let end = closing_quote(rest)?;
        let a = unquote(&rest[..=end]);
        return a.strip_prefix("a/").map(str::to_string);
    }
    // Unquoted: `a/X b/X`, X the same on both sides.
    let half = rest.len().checked_sub(1)? / 2;
    let (a, b) = (rest.get(..half)?, rest.get(half + 1..)?);
    match (a.strip_prefix("a/"), b.strip_prefix("b/")) {
        (Some(x), Some(y)) if x == y => Some(x.to_string()),
        _ => None,
    }
}

/// The index of the quote closing the C-quoted string `s` starts with.
fn closing_quote(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// Git's C-style quoting undone (`"a/sp\303\244ce \"x\""` → `a/späce "x"`); other
/// names as they are.
fn unquote(s: &str) -> String {
    let Some(inner) = s.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return s.to_string();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut it = inner.bytes().peekable();
    while let Some(b) = it.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        match it.next() {
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(b'a') => bytes.push(7),
            Some(b'b') => bytes.push(8),
            Some(b'f') => bytes.push(12),
            Some(b'v') => bytes.push(11),
            Some(b'r') => bytes.push(b'\r'),
            Some(d @ b'0'..=b'7') => {
                let mut v = u32::from(d - b'0');
                for _ in 0..2 {
                    match it.peek() {
                        Some(&n @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(n - b'0');
                            it.next();
                        }
                        _ => break,
                    }
                }
                bytes.push(u8::try_from(v).unwrap_or(b'?'));
            }
            Some(other) => bytes.push(other),
            None => bytes.push(b'\\'),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How the named tests came out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Every `FAIL_TO_PASS` and `PASS_TO_PASS` test passed.
    pub resolved: bool,
    /// `FAIL_TO_PASS` tests that passed, of how many.
    pub fail_to_pass_passed: usize,
    /// How many `FAIL_TO_PASS` tests there are.
    pub fail_to_pass_total: usize,
    /// `PASS_TO_PASS` tests that passed.
    pub pass_to_pass_passed: usize,
    /// How many `PASS_TO_PASS` tests there are.
    pub pass_to_pass_total: usize,
    /// The named tests that did not pass, with what the log says (`failed`, `skipped`,
    /// `missing` when it does not mention them), at most [`MAX_LISTED`].
    pub not_passed: BTreeMap<String, String>,
}

/// How many tests that did not pass a verdict lists by name.
pub const MAX_LISTED: usize = 50;

/// The verdict on `instance` from a run's parsed `results`.
pub fn verdict(instance: &Instance, results: &BTreeMap<String, TestStatus>) -> Verdict {
    let mut not_passed = BTreeMap::new();
    let mut count = |names: &[String]| {
        let mut passed = 0;
        for name in names {
            match results.get(name) {
                Some(TestStatus::Passed) => passed += 1,
                other => {
                    if not_passed.len() < MAX_LISTED {
                        let what = match other {
                            Some(TestStatus::Failed) => "failed",
                            Some(TestStatus::Skipped) => "skipped",
                            _ => "missing",
                        };
                        not_passed.insert(name.clone(), what.to_string());
                    }
                }
            }
        }
        passed
    };
    let f2p = count(&instance.fail_to_pass);
    let p2p = count(&instance.pass_to_pass);
    Verdict {
        resolved: f2p == instance.fail_to_pass.len()
            && p2p == instance.pass_to_pass.len()
            && !instance.fail_to_pass.is_empty(),
        fail_to_pass_passed: f2p,
        fail_to_pass_total: instance.fail_to_pass.len(),
        pass_to_pass_passed: p2p,
        pass_to_pass_total: instance.pass_to_pass.len(),
        not_passed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_PATCH: &str = "diff --git a/tests/test_calc.py b/tests/test_calc.py
index 1111111..2222222 100644
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,2 +1,5 @@
 from calc import add
+
+def test_neg():
+    assert add(-1, -1) == -2
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1 @@
+def test_x(): pass
diff --git a/tests/old.py b/tests/old.py
deleted file mode 100644
--- a/tests/old.py
+++ /dev/null
@@ -1 +0,0 @@
-x = 1
diff --git a/tests/data.bin b/tests/data.bin
new file mode 100644
index 0000000..e69de29
Binary files /dev/null and b/tests/data.bin differ
diff --git a/t/a.txt b/t/b.txt
similarity index 100%
rename from t/a.txt
rename to t/b.txt
diff --git \"a/tests/sp ace\\303\\244.py\" \"b/tests/sp ace\\303\\244.py\"
--- \"a/tests/sp ace\\303\\244.py\"
+++ \"b/tests/sp ace\\303\\244.py\"
@@ -1 +1 @@
-a
+b
";

    #[test]
    fn every_path_a_patch_touches_is_found() {
        assert_eq!(
            patch_paths(TEST_PATCH),
            [
                "tests/test_calc.py",
                "tests/test_new.py",
                "tests/old.py",
                "tests/data.bin",
                "t/a.txt",
                "t/b.txt",
                "tests/sp aceä.py",
            ]
        );
        assert_eq!(
            patched_files(TEST_PATCH),
            [
                "tests/test_calc.py",
                "tests/test_new.py",
                "tests/sp aceä.py"
            ]
        );
    }

    #[test]
    fn instances_read_either_form_of_test_lists_and_keep_other_fields() {
        let listed: Instance = serde_json::from_value(serde_json::json!({
            "instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc",
            "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": ["tests/test_calc.py::test_neg"],
            "PASS_TO_PASS": [],
            "problem_statement": "add() is wrong",
        }))
        .unwrap();
        let encoded: Instance = serde_json::from_value(serde_json::json!({
            "instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc",
            "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": "[\"tests/test_calc.py::test_neg\"]",
            "PASS_TO_PASS": "[]",
        }))
        .unwrap();
        assert_eq!(listed.fail_to_pass, encoded.fail_to_pass);
        assert!(encoded.pass_to_pass.is_empty());
        assert_eq!(listed.other["problem_statement"], "add() is wrong");
        let bad = serde_json::from_value::<Instance>(serde_json::json!({
            "instance_id": "x", "repo": "o/r", "base_commit": "abc", "test_patch": "",
            "FAIL_TO_PASS": "not json",
        }));
        assert!(bad.unwrap_err().to_string().contains("JSON list"));
    }

    #[test]
    fn only_every_named_test_passing_resolves() {
        let inst: Instance = serde_json::from_value(serde_json::json!({
            "instance_id": "i", "repo": "o/r", "base_commit": "abc", "test_patch": "",
            "FAIL_TO_PASS": ["t.py::a"], "PASS_TO_PASS": ["t.py::b", "t.py::c"],
        }))
        .unwrap();
        let results = |v: &[(&str, TestStatus)]| -> BTreeMap<String, TestStatus> {
            v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
        };
        use TestStatus::*;
        let all = verdict(
            &inst,
            &results(&[
                ("t.py::a", Passed),
                ("t.py::b", Passed),
                ("t.py::c", Passed),
            ]),
        );
        assert!(all.resolved);
        let missing = verdict(&inst, &results(&[("t.py::a", Passed), ("t.py::b", Passed)]));
        assert!(!missing.resolved);
        assert_eq!(missing.not_passed["t.py::c"], "missing");
        let skipped = verdict(
            &inst,
            &results(&[
                ("t.py::a", Skipped),
                ("t.py::b", Passed),
                ("t.py::c", Failed),
            ]),
        );
        assert!(!skipped.resolved);
        assert_eq!(skipped.fail_to_pass_passed, 0);
        assert_eq!(skipped.not_passed.len(), 2);
        // An instance that names no test to fix resolves nothing.
        let mut none = inst.clone();
        none.fail_to_pass.clear();
        none.pass_to_pass.clear();
        assert!(!verdict(&none, &BTreeMap::new()).resolved);
    }
}
