//! Running a generated project's unittest suite with `python3 -m unittest -v` and reading its log.
//!
//! Canonical test id: the form Python 3.11+ prints in verbose mode,
//! `test_name (tests.test_module.TestClass.test_name)`; older Pythons' `test_name (module.Class)`
//! is normalised to it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Outcome of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Passed.
    Ok,
    /// Assertion failed.
    Fail,
    /// Raised an exception.
    Error,
    /// Skipped.
    Skipped,
}

/// Result of one suite run.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// Test id -> outcome.
    pub outcomes: BTreeMap<String, Outcome>,
    /// Test id -> its `FAIL:`/`ERROR:` report (traceback and message).
    pub reports: BTreeMap<String, String>,
    /// The run hit the time limit.
    pub timed_out: bool,
    /// Raw stderr.
    pub log: String,
}

impl RunResult {
    /// Ids of tests that did not pass.
    pub fn failing(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Fail | Outcome::Error))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Ids of tests that passed.
    pub fn passing(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter(|(_, o)| **o == Outcome::Ok)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Normalises `name (dotted)` to the canonical id; `None` for lines that are not test headers.
pub fn canonical_id(head: &str) -> Option<String> {
    let (name, rest) = head.split_once(" (")?;
    let dotted = rest.strip_suffix(')')?;
    if name.is_empty()
        || !name.chars().all(|c| c.is_alphanumeric() || c == '_')
        || !dotted
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    {
        return None;
    }
    if dotted.ends_with(&format!(".{name}")) {
        Some(format!("{name} ({dotted})"))
    } else {
        Some(format!("{name} ({dotted}.{name})"))
    }
}

/// Parses the stderr of `python -m unittest -v`.
pub fn parse_log(log: &str) -> RunResult {
    let mut r = RunResult {
        log: log.to_string(),
        ..RunResult::default()
    };
    for line in log.lines() {
        let Some((head, status)) = line.rsplit_once(" ... ") else {
            continue;
        };
        let Some(id) = canonical_id(head.trim()) else {
            continue;
        };
        let o = match status.trim() {
            "ok" => Outcome::Ok,
            "FAIL" => Outcome::Fail,
            "ERROR" => Outcome::Error,
            s if s.starts_with("skipped") => Outcome::Skipped,
            "expected failure" => Outcome::Ok,
            _ => Outcome::Fail,
        };
        r.outcomes.insert(id, o);
    }
    // Detailed reports: "=====\nFAIL: id\n-----\n<traceback>" up to the next separator.
    let mut cur: Option<(String, String)> = None;
    for line in log.lines() {
        let is_sep = line.starts_with("======") || line.starts_with("------");
        if let Some(rest) = line
            .strip_prefix("FAIL: ")
            .or_else(|| line.strip_prefix("ERROR: "))
        {
            if let Some((id, body)) = cur.take() {
                r.reports.insert(id, body);
            }
            if let Some(id) = canonical_id(rest.trim()) {
                cur = Some((id, String::new()));
            }
            continue;
        }
        if line.starts_with("======") || line.starts_with("Ran ") {
            if let Some((id, body)) = cur.take() {
                r.reports.insert(id, body);
            }
            continue;
        }
        if let Some((_, body)) = cur.as_mut() {
            if is_sep && body.is_empty() {
                continue;
            }
            if line.starts_with("------") {
                continue;
            }
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some((id, body)) = cur.take() {
        r.reports.insert(id, body);
    }
    for body in r.reports.values_mut() {
        *body = body.trim_end().to_string();
    }
    r
}

/// Runs `python3 -m unittest -v` in `dir` with a time limit.
pub fn run_unittest(dir: &Path, limit: Duration) -> std::io::Result<RunResult> {
    let mut child = Command::new("python3")
        .args(["-m", "unittest", "-v"])
        .current_dir(dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONHASHSEED", "0")
        .env_remove("PYTHONPATH")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let mut timed_out = false;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = reader.join().unwrap_or_default();
    let mut r = parse_log(&log);
    r.timed_out = timed_out;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_verbose_log_of_old_and_new_pythons() {
        let log = "test_a (tests.test_m.TestX.test_a) ... ok\ntest_b (tests.test_m.TestX) ... FAIL\ntest_c (tests.test_m.TestX.test_c) ... ERROR\n\n======================================================================\nFAIL: test_b (tests.test_m.TestX)\n----------------------------------------------------------------------\nTraceback (most recent call last):\n  File \"x.py\", line 3, in test_b\nAssertionError: 1 != 2\n\n======================================================================\nERROR: test_c (tests.test_m.TestX.test_c)\n----------------------------------------------------------------------\nTraceback (most recent call last):\nZeroDivisionError: division by zero\n\n----------------------------------------------------------------------\nRan 3 tests in 0.001s\n";
        let r = parse_log(log);
        assert_eq!(r.passing(), vec!["test_a (tests.test_m.TestX.test_a)"]);
        assert_eq!(
            r.failing(),
            vec![
                "test_b (tests.test_m.TestX.test_b)",
                "test_c (tests.test_m.TestX.test_c)"
            ]
        );
        assert!(r.reports["test_b (tests.test_m.TestX.test_b)"].ends_with("AssertionError: 1 != 2"));
        assert!(r.reports["test_c (tests.test_m.TestX.test_c)"].contains("ZeroDivisionError"));
    }
}
