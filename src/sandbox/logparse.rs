//! Test-log parsers: turn a test runner's output into per-test statuses.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The status of one test, SWE-bench's vocabulary.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum TestStatus {
    /// Passed.
    Passed,
    /// Failed an assertion.
    Failed,
    /// Skipped.
    Skipped,
    /// Errored (setup, import or unexpected exception).
    Error,
    /// Expected failure that failed.
    Xfail,
    /// Expected failure that passed.
    Xpass,
}

/// Test name -> status.
pub type StatusMap = BTreeMap<String, TestStatus>;

/// A parser of one runner's log format.
pub trait LogParser: Send + Sync {
    /// Short name ("pytest", "unittest").
    fn name(&self) -> &'static str;
    /// Per-test statuses found in the log; empty when the log has none.
    fn parse(&self, log: &str) -> StatusMap;
    /// Canonical form of a test name as written in FAIL_TO_PASS/PASS_TO_PASS.
    fn normalize(&self, name: &str) -> String {
        name.trim().to_string()
    }
}

/// pytest run with `-rA`: the short summary lines `STATUS test-id[ - message]`, and also the
/// verbose progress lines `test-id STATUS` when `-v` was given.
#[derive(Clone, Copy, Debug, Default)]
pub struct PytestParser;

const PYTEST_WORDS: &[(&str, TestStatus)] = &[
    ("PASSED", TestStatus::Passed),
    ("FAILED", TestStatus::Failed),
    ("SKIPPED", TestStatus::Skipped),
    ("ERROR", TestStatus::Error),
    ("XFAIL", TestStatus::Xfail),
    ("XPASS", TestStatus::Xpass),
];

/// Cuts a pytest summary remainder at the first ` - ` outside square brackets.
fn cut_message(rest: &str) -> &str {
    let bytes = rest.as_bytes();
    let mut depth = 0i32;
    for i in 0..bytes.len() {
        match bytes[i] {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b' ' if depth <= 0 && rest[i..].starts_with(" - ") => return &rest[..i],
            _ => {}
        }
    }
    rest
}

impl LogParser for PytestParser {
    fn name(&self) -> &'static str {
        "pytest"
    }

    fn parse(&self, log: &str) -> StatusMap {
        let mut map = StatusMap::new();
        for raw in log.lines() {
            let line = raw.trim_end();
            // Summary form: "PASSED tests/test_a.py::test_x".
            if let Some((word, status)) = PYTEST_WORDS
                .iter()
                .find(|(w, _)| line.starts_with(w) && line[w.len()..].starts_with(' '))
            {
                let rest = line[word.len()..].trim_start();
                if rest.starts_with('[') {
                    // "SKIPPED [1] file.py:12: reason" names no test id.
                    continue;
                }
                let name = cut_message(rest).trim();
                if !name.is_empty() {
                    map.insert(name.to_string(), *status);
                }
                continue;
            }
            // Verbose form: "tests/test_a.py::test_x PASSED [ 50%]".
            if let Some(idx) = line.find("::") {
                let head = &line[..idx];
                if head.contains(' ') {
                    continue;
                }
                for (word, status) in PYTEST_WORDS {
                    let pat = format!(" {word}");
                    if let Some(pos) = line.rfind(&pat) {
                        let after = &line[pos + pat.len()..];
                        if after.is_empty() || after.starts_with(' ') {
                            map.entry(line[..pos].trim().to_string()).or_insert(*status);
                            break;
                        }
                    }
                }
            }
        }
        map
    }
}

/// `python -m unittest -v`: lines `test_x (pkg.mod.Class.test_x) ... ok`, possibly with a
/// docstring line or test output between the name and the status.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnittestParser;

fn unittest_status(s: &str) -> Option<TestStatus> {
    let s = s.trim();
    match s {
        "ok" => Some(TestStatus::Passed),
        "FAIL" => Some(TestStatus::Failed),
        "ERROR" => Some(TestStatus::Error),
        "expected failure" => Some(TestStatus::Xfail),
        "unexpected success" => Some(TestStatus::Xpass),
        _ if s.starts_with("skipped") => Some(TestStatus::Skipped),
        _ => None,
    }
}

/// Parses `name (dotted.path)` into the canonical `dotted.path.name` id.
fn unittest_head(line: &str) -> Option<String> {
    let open = line.find(" (")?;
    let method = &line[..open];
    if method.is_empty() || !method.chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let rest = &line[open + 2..];
    let close = rest.find(')')?;
    let inner = &rest[..close];
    if inner.is_empty()
        || !inner
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    {
        return None;
    }
    if inner.ends_with(&format!(".{method}")) {
        Some(inner.to_string())
    } else {
        Some(format!("{inner}.{method}"))
    }
}

impl LogParser for UnittestParser {
    fn name(&self) -> &'static str {
        "unittest"
    }

    fn parse(&self, log: &str) -> StatusMap {
        let mut map = StatusMap::new();
        let mut pending: Option<String> = None;
        for raw in log.lines() {
            let line = raw.trim_end();
            if let Some(id) = unittest_head(line) {
                if let Some(pos) = line.rfind(" ... ") {
                    if let Some(st) = unittest_status(&line[pos + 5..]) {
                        map.insert(id, st);
                        pending = None;
                        continue;
                    }
                }
                pending = Some(id);
                continue;
            }
            // Failure details: "FAIL: test_x (pkg.Class.test_x)" confirm a status.
            for (prefix, st) in [
                ("FAIL: ", TestStatus::Failed),
                ("ERROR: ", TestStatus::Error),
            ] {
                if let Some(rest) = line.strip_prefix(prefix) {
                    if let Some(id) = unittest_head(rest) {
                        map.entry(id).or_insert(st);
                    }
                }
            }
            if let Some(id) = &pending {
                let status = match line.rfind(" ... ") {
                    Some(pos) => unittest_status(&line[pos + 5..]),
                    None => line.strip_prefix("... ").and_then(unittest_status),
                }
                .or_else(|| unittest_status(line).filter(|_| line == line.trim()));
                if let Some(st) = status {
                    map.insert(id.clone(), st);
                    pending = None;
                }
            }
        }
        map
    }

    fn normalize(&self, name: &str) -> String {
        unittest_head(name.trim()).unwrap_or_else(|| name.trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytest_summary_and_verbose() {
        let log = "\
tests/test_a.py::test_v PASSED                                  [ 20%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_x
PASSED tests/test_a.py::test_p[a - b]
FAILED tests/test_a.py::test_y - assert 1 == 2
ERROR tests/test_a.py::test_z - ImportError
SKIPPED [1] tests/test_a.py:10: no reason
XFAIL tests/test_a.py::test_w - reason
";
        let m = PytestParser.parse(log);
        assert_eq!(m["tests/test_a.py::test_x"], TestStatus::Passed);
        assert_eq!(m["tests/test_a.py::test_p[a - b]"], TestStatus::Passed);
        assert_eq!(m["tests/test_a.py::test_y"], TestStatus::Failed);
        assert_eq!(m["tests/test_a.py::test_z"], TestStatus::Error);
        assert_eq!(m["tests/test_a.py::test_w"], TestStatus::Xfail);
        assert_eq!(m["tests/test_a.py::test_v"], TestStatus::Passed);
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn unittest_verbose_forms() {
        let log = "\
test_add (tests.test_calc.TestCalc.test_add) ... ok
test_div (tests.test_calc.TestCalc) ... FAIL
test_doc (tests.test_calc.TestCalc.test_doc)
Adds numbers. ... ok
test_noisy (tests.test_calc.TestCalc.test_noisy) ... some printed output
ERROR
test_skip (tests.test_calc.TestCalc.test_skip) ... skipped 'later'
test_xf (tests.test_calc.TestCalc.test_xf) ... expected failure

======================================================================
FAIL: test_div (tests.test_calc.TestCalc)
";
        let m = UnittestParser.parse(log);
        assert_eq!(m["tests.test_calc.TestCalc.test_add"], TestStatus::Passed);
        assert_eq!(m["tests.test_calc.TestCalc.test_div"], TestStatus::Failed);
        assert_eq!(m["tests.test_calc.TestCalc.test_doc"], TestStatus::Passed);
        assert_eq!(m["tests.test_calc.TestCalc.test_noisy"], TestStatus::Error);
        assert_eq!(m["tests.test_calc.TestCalc.test_skip"], TestStatus::Skipped);
        assert_eq!(m["tests.test_calc.TestCalc.test_xf"], TestStatus::Xfail);
        assert_eq!(
            UnittestParser.normalize("test_div (tests.test_calc.TestCalc)"),
            "tests.test_calc.TestCalc.test_div"
        );
    }

    #[test]
    fn garbage_gives_nothing() {
        assert!(PytestParser.parse("Traceback...\nSyntaxError").is_empty());
        assert!(UnittestParser.parse("Traceback...\nSyntaxError").is_empty());
    }
}
