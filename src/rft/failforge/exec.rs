//! Sandbox execution for edits: a failed edit is applied in the sandbox and the instance's
//! FAIL_TO_PASS / PASS_TO_PASS tests run, and what went wrong (the tests still failing, the
//! exception line, the last three traceback frames) becomes feedback for the diagnoser. A
//! recovered edit is accepted only when its run resolves the instance (every FAIL_TO_PASS test
//! passes and no PASS_TO_PASS test breaks).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::rft::eval::edit_to_patch;
use crate::sandbox::runner::{run_instance, MirrorRepos, RunResult, SandboxConfig};
use crate::swe::instance::Instance;
use crate::swe::subtask::SubtaskRecord;

/// Traceback frames kept per run (the innermost ones).
pub const FRAMES: usize = 3;
/// Failing test names kept per run.
const MAX_FAILING: usize = 5;

/// What one sandbox run of an edit said.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecFeedback {
    /// Every FAIL_TO_PASS test passed and no PASS_TO_PASS test broke.
    pub resolved: bool,
    /// How the run ended (`resolved`, `unresolved`, `patch_failed`, ...).
    pub status: String,
    /// FAIL_TO_PASS tests that still fail (at most a few).
    pub still_failing: Vec<String>,
    /// PASS_TO_PASS tests the edit broke (at most a few).
    pub broken: Vec<String>,
    /// The exception line of the last traceback in the test log.
    pub exception: Option<String>,
    /// The last traceback's innermost frames, outermost first, as `path:line in func`.
    pub frames: Vec<String>,
    /// The sandbox's one-line error, when it gave one.
    pub error: Option<String>,
}

impl ExecFeedback {
    /// The exception's type (`AssertionError` in `AssertionError: 1 != 2`), if any.
    pub fn exception_type(&self) -> Option<&str> {
        let e = self.exception.as_deref()?;
        let head = e.split(':').next().unwrap_or(e).trim();
        let last = head.rsplit('.').next().unwrap_or(head);
        (!last.is_empty() && !last.contains(' ')).then_some(last)
    }

    /// One line for the diagnoser.
    pub fn line(&self) -> String {
        let mut parts = vec![format!("exec {}", self.status)];
        if !self.still_failing.is_empty() {
            parts.push(format!("still failing {}", self.still_failing.join(", ")));
        }
        if !self.broken.is_empty() {
            parts.push(format!("broke {}", self.broken.join(", ")));
        }
        if let Some(e) = &self.exception {
            parts.push(e.clone());
        }
        if !self.frames.is_empty() {
            parts.push(format!("frames {}", self.frames.join(" > ")));
        }
        if self.exception.is_none() {
            if let Some(e) = &self.error {
                parts.push(e.clone());
            }
        }
        parts.join("; ")
    }
}

/// A repository path as the test log shows it, made relative to the workspace's `repo/`.
fn short_path(p: &str) -> &str {
    p.rfind("/repo/").map_or(p, |i| &p[i + "/repo/".len()..])
}

/// The exception line and the innermost [`FRAMES`] frames of the last traceback in `log`.
/// Reads Python tracebacks (`File "p", line N, in f` frames, unittest's format) and pytest's
/// long format (`p:N: Error` locations and `E   ` lines).
pub fn parse_traceback(log: &str) -> (Option<String>, Vec<String>) {
    let mut frames: Vec<String> = Vec::new();
    let mut exception: Option<String> = None;
    let mut in_tb = false;
    let (mut last_frames, mut last_exc) = (Vec::new(), None);
    for line in log.lines() {
        let t = line.trim();
        if t.starts_with("Traceback (most recent call last)") || t.starts_with("____") {
            in_tb = true;
            frames.clear();
            exception = None;
        } else if let Some(rest) = t.strip_prefix("File \"") {
            if let Some((path, tail)) = rest.split_once('"') {
                let num = tail
                    .split(", line ")
                    .nth(1)
                    .and_then(|s| s.split(',').next())
                    .unwrap_or("?");
                let func = tail
                    .rsplit(", in ")
                    .next()
                    .filter(|_| tail.contains(", in "));
                frames.push(match func {
                    Some(f) => format!("{}:{num} in {}", short_path(path), f.trim()),
                    None => format!("{}:{num}", short_path(path)),
                });
                in_tb = true;
            }
        } else if let Some(e) = t.strip_prefix("E ").filter(|_| line.starts_with('E')) {
            if in_tb && exception.is_none() {
                exception = Some(e.trim().to_string());
            }
        } else if in_tb && !line.starts_with([' ', '\t']) && !t.is_empty() {
            if let Some((loc, rest)) = pytest_location(t) {
                frames.push(loc);
                if !rest.is_empty() && exception.is_none() {
                    exception = Some(rest);
                }
            } else if !frames.is_empty() && exception.is_none() {
                exception = Some(t.to_string());
            }
            if exception.is_some() && !frames.is_empty() {
                last_frames = std::mem::take(&mut frames);
                last_exc = exception.take();
                in_tb = false;
            }
        }
    }
    if !frames.is_empty() || exception.is_some() {
        last_frames = frames;
        last_exc = exception.or(last_exc);
    }
    let skip = last_frames.len().saturating_sub(FRAMES);
    (last_exc, last_frames.split_off(skip))
}

/// A pytest location line `path.py:12: Rest`: (`path.py:12`, the rest).
fn pytest_location(t: &str) -> Option<(String, String)> {
    let (path, tail) = t.split_once(".py:")?;
    let (num, rest) = tail.split_once(':')?;
    if path.contains(' ') || num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((
        format!("{}.py:{num}", short_path(path)),
        rest.trim().to_string(),
    ))
}

/// The feedback of a finished sandbox run.
pub fn feedback_of(r: &RunResult) -> ExecFeedback {
    let status = serde_json::to_value(r.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", r.status));
    let (exception, frames) = r
        .process
        .as_ref()
        .map(|p| parse_traceback(&p.output.tail))
        .unwrap_or_default();
    let (still_failing, broken) = r
        .grade
        .as_ref()
        .map(|g| {
            let cut = |v: &[String]| v.iter().take(MAX_FAILING).cloned().collect::<Vec<_>>();
            (cut(&g.report.f2p_failure), cut(&g.report.p2p_failure))
        })
        .unwrap_or_default();
    ExecFeedback {
        resolved: r.resolved,
        status,
        still_failing,
        broken,
        exception,
        frames,
        error: r.error.clone(),
    }
}

/// Runs edit answers against their instance's tests.
pub trait EditExecutor {
    /// Feedback per job `(record, answer)`, in order; `None` when the answer yields no patch
    /// (nothing to run).
    fn execute(
        &mut self,
        jobs: &[(&SubtaskRecord, &str)],
    ) -> anyhow::Result<Vec<Option<ExecFeedback>>>;
}

/// The sandbox as the executor: each distinct (instance, patch) runs once, `workers` at a time.
pub struct SandboxExecutor {
    sb: SandboxConfig,
    mirrors: MirrorRepos,
    instances: HashMap<String, Instance>,
    workers: usize,
    cache: BTreeMap<(String, String), ExecFeedback>,
}

impl SandboxExecutor {
    /// An executor over `instances`, whose repositories are mirrored under `repos`.
    pub fn new(sb: SandboxConfig, repos: &Path, instances: &[Instance], workers: usize) -> Self {
        Self {
            sb,
            mirrors: MirrorRepos::new(repos),
            instances: instances
                .iter()
                .map(|i| (i.instance_id.clone(), i.clone()))
                .collect(),
            workers: workers.max(1),
            cache: BTreeMap::new(),
        }
    }
}

impl EditExecutor for SandboxExecutor {
    fn execute(
        &mut self,
        jobs: &[(&SubtaskRecord, &str)],
    ) -> anyhow::Result<Vec<Option<ExecFeedback>>> {
        let keys: Vec<Option<(String, String)>> = jobs
            .iter()
            .map(|(r, a)| edit_to_patch(r, a).map(|p| (r.instance_id.clone(), p)))
            .collect();
        let mut todo: Vec<(String, String)> = keys
            .iter()
            .flatten()
            .filter(|k| !self.cache.contains_key(*k))
            .cloned()
            .collect();
        todo.sort();
        todo.dedup();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.workers)
            .build()?;
        let (sb, mirrors, instances) = (&self.sb, &self.mirrors, &self.instances);
        let results: Vec<ExecFeedback> = pool.install(|| {
            use rayon::prelude::*;
            todo.par_iter()
                .map(|(id, patch)| match instances.get(id) {
                    Some(inst) => feedback_of(&run_instance(sb, mirrors, inst, "failforge", patch)),
                    None => ExecFeedback {
                        status: "error".into(),
                        error: Some(format!("{id}: no such instance in the run's data")),
                        ..ExecFeedback::default()
                    },
                })
                .collect()
        });
        for (k, fb) in todo.into_iter().zip(results) {
            self.cache.insert(k, fb);
        }
        Ok(keys
            .iter()
            .map(|k| k.as_ref().and_then(|k| self.cache.get(k).cloned()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unittest_logs_give_the_exception_and_the_innermost_frames() {
        let log = [
            "test_a (tests.test_m.T.test_a) ... FAIL",
            "======================================================================",
            "FAIL: test_a (tests.test_m.T.test_a)",
            "----------------------------------------------------------------------",
            "Traceback (most recent call last):",
            "  File \"/w/1/repo/tests/test_m.py\", line 9, in test_a",
            "    self.assertEqual(run(2), 4)",
            "  File \"/w/1/repo/pkg/api.py\", line 4, in run",
            "    return core.scale(x)",
            "  File \"/w/1/repo/pkg/core.py\", line 7, in scale",
            "    return helper(x) + 1",
            "  File \"/w/1/repo/pkg/util.py\", line 2, in helper",
            "    return x * 2",
            "AssertionError: 5 != 4",
            "",
            "----------------------------------------------------------------------",
            "Ran 1 test in 0.001s",
            "",
            "FAILED (failures=1)",
        ]
        .join("\n");
        let log = log.as_str();
        let (exc, frames) = parse_traceback(log);
        assert_eq!(exc.as_deref(), Some("AssertionError: 5 != 4"));
        assert_eq!(
            frames,
            vec![
                "pkg/api.py:4 in run",
                "pkg/core.py:7 in scale",
                "pkg/util.py:2 in helper"
            ]
        );
        let fb = ExecFeedback {
            exception: exc,
            ..ExecFeedback::default()
        };
        assert_eq!(fb.exception_type(), Some("AssertionError"));
    }

    #[test]
    fn the_last_of_several_tracebacks_wins_and_pytest_logs_are_read() {
        let log =
            "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'x'\n\
Traceback (most recent call last):\n  File \"b.py\", line 2, in g\nTypeError: bad operand\n";
        let (exc, frames) = parse_traceback(log);
        assert_eq!(exc.as_deref(), Some("TypeError: bad operand"));
        assert_eq!(frames, vec!["b.py:2 in g"]);
        let pytest = "______ test_scale ______\n\n    def test_scale():\n>       assert scale(3) == 9\nE       assert 6 == 9\n\ntests/test_core.py:4: AssertionError\n";
        let (exc, frames) = parse_traceback(pytest);
        assert_eq!(exc.as_deref(), Some("assert 6 == 9"));
        assert_eq!(frames, vec!["tests/test_core.py:4"]);
        assert_eq!(parse_traceback("all good\nOK\n"), (None, vec![]));
    }
}
