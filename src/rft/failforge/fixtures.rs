//! Hand-made records and failures for the tests of this module.

use crate::rft::failforge::feedback::{collect_failures, Failure};
use crate::rft::teacher::TeacherItem;
use crate::swe::codemap::DefKind;
use crate::swe::edit::EditBlock;
use crate::swe::reward::Window;
use crate::swe::subtask::{EditReward, Shown, Subtask, SubtaskRecord};
use crate::swe::truth::{FuncTarget, GroundTruth, LineTarget};

/// The code every record shows: `pkg/core.py`, lines 1-3; the bug is on line 3.
pub const CODE: &str = "def scale(x):\n    y = x + 1\n    return y * 2\n";

fn func(kind: DefKind, name: &str) -> FuncTarget {
    FuncTarget {
        path: "pkg/core.py".into(),
        kind,
        name: name.into(),
    }
}

/// The ground truth: `pkg/core.py`, `Parser.parse`, line 3, `return y * 3`.
pub fn truth() -> GroundTruth {
    GroundTruth {
        files: vec!["pkg/core.py".into()],
        functions: vec![func(DefKind::Method, "Parser.parse")],
        module_level: vec![],
        lines: vec![LineTarget {
            path: "pkg/core.py".into(),
            line: 3,
        }],
        edits: vec![EditBlock {
            path: "pkg/core.py".into(),
            search: "    return y * 2\n".into(),
            replace: "    return y * 3\n".into(),
        }],
    }
}

/// A record of `subtask` for instance `id`.
pub fn record(subtask: Subtask, id: &str) -> SubtaskRecord {
    let windows = vec![Window {
        path: "pkg/core.py".into(),
        start_line: 1,
        text: CODE.into(),
    }];
    let shown = match subtask {
        Subtask::File => Shown {
            files: vec![
                "pkg/core.py".into(),
                "pkg/util.py".into(),
                "tests/test_core.py".into(),
            ],
            ..Shown::default()
        },
        Subtask::Function => Shown {
            files: vec!["pkg/core.py".into()],
            functions: vec![
                func(DefKind::Class, "Parser"),
                func(DefKind::Method, "Parser.parse"),
                func(DefKind::Function, "helper"),
            ],
            ..Shown::default()
        },
        Subtask::Line | Subtask::Edit => Shown {
            windows,
            ..Shown::default()
        },
    };
    SubtaskRecord {
        instance_id: id.into(),
        repo: "acme/pkg".into(),
        subtask,
        prompt: format!("Prompt of {} for {id}.\n", subtask.name()),
        shown,
        truth: truth(),
        gold_patch: String::new(),
        meta: Default::default(),
    }
}

/// A `path: line` answer.
pub fn line_answer(line: usize) -> String {
    format!("<think>t</think>\n```\npkg/core.py\nline: {line}\n```")
}

/// A SEARCH/REPLACE answer on `path`.
pub fn edit_answer(path: &str, search: &str, replace: &str) -> String {
    format!(
        "<think>t</think>\n```python\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```"
    )
}

/// The failure of `rec` answered with `answers` under issue `problem` (panics when one passes).
pub fn failure(rec: &SubtaskRecord, problem: &str, answers: &[&str]) -> Failure {
    let items = [TeacherItem {
        record: rec,
        problem,
    }];
    let samples = vec![answers.iter().map(|s| s.to_string()).collect()];
    let mut f = collect_failures(&items, &samples, EditReward::LineFbeta, None);
    assert_eq!(f.len(), 1, "an answer passed");
    f.remove(0)
}
