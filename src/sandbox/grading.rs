//! Grading like the SWE-bench harness: FAIL_TO_PASS and PASS_TO_PASS must all pass.

use crate::sandbox::logparse::{LogParser, StatusMap, TestStatus};
use serde::{Deserialize, Serialize};

/// SWE-bench's resolution levels.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum Resolution {
    /// Every FAIL_TO_PASS and PASS_TO_PASS test passes.
    Full,
    /// Some but not all FAIL_TO_PASS tests pass; every PASS_TO_PASS test passes.
    Partial,
    /// Anything else.
    No,
}

/// Which expected tests succeeded and which failed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TestsReport {
    /// FAIL_TO_PASS tests that now pass.
    pub f2p_success: Vec<String>,
    /// FAIL_TO_PASS tests that do not pass (failed, errored, skipped or missing).
    pub f2p_failure: Vec<String>,
    /// PASS_TO_PASS tests maintained (passed or skipped).
    pub p2p_success: Vec<String>,
    /// PASS_TO_PASS tests broken (failed, errored or missing).
    pub p2p_failure: Vec<String>,
}

/// The grade of one run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Grade {
    /// FULL / PARTIAL / NO.
    pub resolution: Resolution,
    /// True only on FULL.
    pub resolved: bool,
    /// Per-group outcomes.
    pub report: TestsReport,
    /// Why the run is not resolved, when it is not.
    pub reason: Option<String>,
}

fn passed(s: Option<&TestStatus>) -> bool {
    matches!(s, Some(TestStatus::Passed) | Some(TestStatus::Xfail))
}

fn rate(ok: usize, bad: usize) -> f64 {
    if ok + bad == 0 {
        1.0
    } else {
        ok as f64 / (ok + bad) as f64
    }
}

/// Grades parsed statuses against the instance's FAIL_TO_PASS and PASS_TO_PASS lists.
///
/// SKIPPED counts as a failure for FAIL_TO_PASS and as maintained for PASS_TO_PASS; a test
/// absent from the log counts as a failure. An empty status map means the log could not be
/// parsed: NO, with a reason.
pub fn grade(
    statuses: &StatusMap,
    parser: &dyn LogParser,
    fail_to_pass: &[String],
    pass_to_pass: &[String],
) -> Grade {
    let mut report = TestsReport::default();
    if statuses.is_empty() {
        report.f2p_failure = fail_to_pass.to_vec();
        report.p2p_failure = pass_to_pass.to_vec();
        return Grade {
            resolution: Resolution::No,
            resolved: false,
            report,
            reason: Some(format!(
                "no {} test results found in the log",
                parser.name()
            )),
        };
    }
    // Statuses keyed by canonical name, so both spellings of a test id match.
    let canon: std::collections::HashMap<String, TestStatus> = statuses
        .iter()
        .map(|(k, v)| (parser.normalize(k), *v))
        .collect();
    for t in fail_to_pass {
        let s = canon.get(&parser.normalize(t));
        if passed(s) {
            report.f2p_success.push(t.clone());
        } else {
            report.f2p_failure.push(t.clone());
        }
    }
    for t in pass_to_pass {
        let s = canon.get(&parser.normalize(t));
        if passed(s) || s == Some(&TestStatus::Skipped) {
            report.p2p_success.push(t.clone());
        } else {
            report.p2p_failure.push(t.clone());
        }
    }
    let f2p = rate(report.f2p_success.len(), report.f2p_failure.len());
    let p2p = rate(report.p2p_success.len(), report.p2p_failure.len());
    let resolution = if f2p == 1.0 && p2p == 1.0 {
        Resolution::Full
    } else if f2p > 0.0 && f2p < 1.0 && p2p == 1.0 {
        Resolution::Partial
    } else {
        Resolution::No
    };
    let reason = match resolution {
        Resolution::Full => None,
        _ => {
            let mut parts = vec![];
            if !report.f2p_failure.is_empty() {
                parts.push(format!(
                    "{} of {} FAIL_TO_PASS not passing (first: {})",
                    report.f2p_failure.len(),
                    fail_to_pass.len(),
                    report.f2p_failure[0]
                ));
            }
            if !report.p2p_failure.is_empty() {
                parts.push(format!(
                    "{} of {} PASS_TO_PASS broken (first: {})",
                    report.p2p_failure.len(),
                    pass_to_pass.len(),
                    report.p2p_failure[0]
                ));
            }
            Some(parts.join("; "))
        }
    };
    Grade {
        resolution,
        resolved: resolution == Resolution::Full,
        report,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::logparse::{PytestParser, UnittestParser};

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn full_partial_no_and_skips() {
        let mut m = StatusMap::new();
        m.insert("a".into(), TestStatus::Passed);
        m.insert("b".into(), TestStatus::Passed);
        m.insert("s".into(), TestStatus::Skipped);
        m.insert("f".into(), TestStatus::Failed);
        let g = grade(&m, &PytestParser, &names(&["a", "b"]), &names(&["s"]));
        assert_eq!(g.resolution, Resolution::Full);
        assert!(g.resolved);
        let g = grade(&m, &PytestParser, &names(&["a", "s"]), &names(&["b"]));
        assert_eq!(
            g.resolution,
            Resolution::Partial,
            "skipped F2P is a failure"
        );
        assert!(!g.resolved);
        let g = grade(&m, &PytestParser, &names(&["a"]), &names(&["f"]));
        assert_eq!(g.resolution, Resolution::No);
        let g = grade(&m, &PytestParser, &names(&["a"]), &names(&["missing"]));
        assert_eq!(g.resolution, Resolution::No, "a missing P2P test is broken");
        assert!(g.reason.unwrap().contains("missing"));
    }

    #[test]
    fn unparseable_log_is_not_resolved_with_reason() {
        let g = grade(&StatusMap::new(), &UnittestParser, &names(&["x"]), &[]);
        assert_eq!(g.resolution, Resolution::No);
        assert!(g.reason.unwrap().contains("no unittest test results"));
    }

    #[test]
    fn unittest_names_match_in_either_spelling() {
        let m = UnittestParser.parse("test_a (m.C.test_a) ... ok\n");
        let g = grade(&m, &UnittestParser, &names(&["test_a (m.C)"]), &[]);
        assert!(g.resolved);
    }
}
