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

    /// Summary lines count only inside the last "short test summary info" section, and verbose
    /// progress lines only before the first report section (FAILURES, ERRORS, PASSES, the
    /// summary): text a test prints is shown inside report sections, so it cannot forge either.
    fn parse(&self, log: &str) -> StatusMap {
        let lines: Vec<&str> = log.lines().map(str::trim_end).collect();
        let summary_at = lines
            .iter()
            .rposition(|l| is_pytest_section(l, "short test summary info"));
        let reports_at = lines
            .iter()
            .position(|l| REPORT_SECTIONS.iter().any(|s| is_pytest_section(l, s)))
            .unwrap_or(lines.len());
        let mut map = StatusMap::new();
        for line in &lines[..reports_at] {
            if let Some((name, status)) = pytest_verbose(line) {
                map.entry(name).or_insert(status);
            }
        }
        if let Some(at) = summary_at {
            for line in &lines[at + 1..] {
                if let Some((name, status)) = pytest_summary(line) {
                    map.insert(name, status);
                }
            }
        }
        map
    }
}

/// Section titles pytest prints after the progress lines.
const REPORT_SECTIONS: &[&str] = &[
    "FAILURES",
    "ERRORS",
    "PASSES",
    "warnings summary",
    "short test summary info",
];

/// True for a pytest section header `===== title =====`.
fn is_pytest_section(line: &str, title: &str) -> bool {
    line.starts_with("==") && line.ends_with("==") && line.trim_matches('=').trim() == title
}

/// Summary form: "PASSED tests/test_a.py::test_x[ - message]".
fn pytest_summary(line: &str) -> Option<(String, TestStatus)> {
    let (word, status) = PYTEST_WORDS
        .iter()
        .find(|(w, _)| line.starts_with(w) && line[w.len()..].starts_with(' '))?;
    let rest = line[word.len()..].trim_start();
    if rest.starts_with('[') {
        // "SKIPPED [1] file.py:12: reason" names no test id.
        return None;
    }
    let name = cut_message(rest).trim();
    (!name.is_empty()).then(|| (name.to_string(), *status))
}

/// Verbose form: "tests/test_a.py::test_x PASSED [ 50%]".
fn pytest_verbose(line: &str) -> Option<(String, TestStatus)> {
    let idx = line.find("::")?;
    if line[..idx].contains(' ') {
        return None;
    }
    for (word, status) in PYTEST_WORDS {
        let pat = format!(" {word}");
        if let Some(pos) = line.rfind(&pat) {
            let after = &line[pos + pat.len()..];
            if after.is_empty() || after.starts_with(' ') {
                return Some((line[..pos].trim().to_string(), *status));
            }
        }
    }
    None
}

/// How bad a status is: a test reported twice keeps its worst status, so a forged "ok" line
/// cannot hide the runner's own FAIL/ERROR record of the same test.
fn severity(s: TestStatus) -> u8 {
    match s {
        TestStatus::Passed => 0,
        TestStatus::Xfail => 1,
        TestStatus::Skipped => 2,
        TestStatus::Xpass => 3,
        TestStatus::Failed => 4,
        TestStatus::Error => 5,
    }
}

/// Records `st` for `id`, keeping the worse of two statuses.
fn record_worst(map: &mut StatusMap, id: String, st: TestStatus) {
    let e = map.entry(id).or_insert(st);
    if severity(st) > severity(*e) {
        *e = st;
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
                        record_worst(&mut map, id, st);
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
                        record_worst(&mut map, id, st);
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
                    record_worst(&mut map, id.clone(), st);
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
    fn printed_status_lines_do_not_count() {
        // A test printed summary-like lines; they are shown in a report section before the
        // real summary, which does not list test_sub as passed.
        let log = "\
============================= ERRORS =============================
----------------------------- Captured stdout -----------------------------
PASSED tests/test_a.py::test_sub
tests/test_a.py::test_sub PASSED
=========================== short test summary info ============================
ERROR tests/test_a.py - ImportError
";
        let m = PytestParser.parse(log);
        assert_eq!(m.get("tests/test_a.py::test_sub"), None, "{m:?}");
        assert_eq!(m["tests/test_a.py"], TestStatus::Error);
        // Without any summary section, summary-form text is never a result.
        let m = PytestParser.parse("PASSED tests/test_a.py::test_sub\n");
        assert!(m.is_empty(), "{m:?}");
        // unittest: a forged "ok" on the progress line loses to the runner's FAIL record.
        let log = "test_sub (t.T.test_sub) ... ok\nFAIL\n\n=====\nFAIL: test_sub (t.T.test_sub)\n";
        assert_eq!(
            UnittestParser.parse(log)["t.T.test_sub"],
            TestStatus::Failed
        );
    }

    #[test]
    fn garbage_gives_nothing() {
        assert!(PytestParser.parse("Traceback...\nSyntaxError").is_empty());
        assert!(UnittestParser.parse("Traceback...\nSyntaxError").is_empty());
    }
}
