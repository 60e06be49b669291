//! Ground truth from realistic gold patches.

use sorft::swe::codemap::DefKind;
use sorft::swe::diff::{FilePatch, Patch};
use sorft::swe::edit::apply_blocks;
use sorft::swe::repo::Snapshot;
use sorft::swe::truth::{ground_truth, modified_lines, FuncTarget, LineTarget};
use std::collections::BTreeMap;

const CORE: &str = r#"import math

TOLERANCE = 1e-9


def clamp(x, lo, hi):
    if x < lo:
        return lo
    return min(x, hi)


class Shape:
    """Base shape."""

    sides = 0

    @property
    def name(self):
        return type(self).__name__

    class Meta:
        def describe(self):
            return "meta"

    async def fetch(self, client):
        data = await client.get()
        def parse(d):
            return d.strip()
        return parse(data)
"#;

const UTIL: &str = "def helper(a):\n    return a * 2\n\n\ndef other():\n    return 1\n";
const README: &str = "# Title\n\nSome text.\n";
const TEST: &str =
    "import unittest\n\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n";

fn snapshot() -> Snapshot {
    Snapshot::from_texts([
        ("pkg/core.py", CORE),
        ("pkg/util.py", UTIL),
        ("README.md", README),
        ("tests/test_core.py", TEST),
    ])
}

fn patch_of(changes: &[(&str, &str, &str)]) -> String {
    Patch {
        files: changes
            .iter()
            .map(|(p, old, new)| FilePatch::from_texts(Some((p, old)), Some((p, new))))
            .collect(),
    }
    .to_string()
}

fn ft(path: &str, kind: DefKind, name: &str) -> FuncTarget {
    FuncTarget {
        path: path.into(),
        kind,
        name: name.into(),
    }
}

#[test]
fn multi_hunk_multi_file_with_nested_async_decorated_and_module_level() {
    let new_core = CORE
        .replace("TOLERANCE = 1e-9", "TOLERANCE = 1e-6")
        .replace("    return min(x, hi)", "    return max(lo, min(x, hi))")
        .replace("            return \"meta\"", "            return \"Meta\"")
        .replace(
            "            return d.strip()",
            "            return d.strip().lower()",
        )
        .replace(
            "    @property\n    def name",
            "    @property\n    @cached\n    def name",
        );
    let new_readme = README.replace("Some text.", "Other text.");
    let new_test = TEST.replace("pass", "self.assertTrue(True)");
    let patch = patch_of(&[
        ("pkg/core.py", CORE, &new_core),
        ("README.md", README, &new_readme),
        ("tests/test_core.py", TEST, &new_test),
    ]);
    assert!(Patch::parse(&patch).unwrap().files[0].hunks.len() >= 2);
    let gt = ground_truth(&patch, &snapshot()).unwrap();
    assert_eq!(gt.files, vec!["pkg/core.py", "README.md"]);
    assert_eq!(
        gt.functions,
        vec![
            ft("pkg/core.py", DefKind::Function, "clamp"),
            ft("pkg/core.py", DefKind::Method, "Shape.Meta.describe"),
            ft("pkg/core.py", DefKind::Method, "Shape.fetch"),
            ft("pkg/core.py", DefKind::Method, "Shape.name"),
        ]
    );
    assert_eq!(gt.module_level, vec!["pkg/core.py"]);
    let lines: Vec<(&str, usize)> = gt.lines.iter().map(|l| (l.path.as_str(), l.line)).collect();
    // TOLERANCE (3), clamp return (9), decorator insertion after line 17, "meta" (23), strip (28), README (3).
    assert_eq!(
        lines,
        vec![
            ("README.md", 3),
            ("pkg/core.py", 3),
            ("pkg/core.py", 9),
            ("pkg/core.py", 17),
            ("pkg/core.py", 23),
            ("pkg/core.py", 28)
        ]
    );
    // The SEARCH/REPLACE blocks reproduce the post-patch files.
    let files: BTreeMap<String, String> = [("pkg/core.py", CORE), ("README.md", README)]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let out = apply_blocks(&files, &gt.edits).unwrap();
    assert_eq!(out["pkg/core.py"], new_core);
    assert_eq!(out["README.md"], new_readme);
}

#[test]
fn added_definitions_count_for_their_enclosing_scope() {
    // A new method inside Shape (after `name`), a new top-level function at the end of util.py,
    // and a statement appended at the end of `helper`'s body.
    let new_core = CORE.replace(
        "        return type(self).__name__\n",
        "        return type(self).__name__\n\n    def area(self):\n        return 0\n",
    );
    let new_util = UTIL
        .replace("    return a * 2\n", "    a = a or 0\n    return a * 2\n")
        .to_string()
        + "\n\ndef added():\n    return 2\n";
    let patch = patch_of(&[
        ("pkg/core.py", CORE, &new_core),
        ("pkg/util.py", UTIL, &new_util),
    ]);
    let gt = ground_truth(&patch, &snapshot()).unwrap();
    assert_eq!(
        gt.functions,
        vec![
            ft("pkg/core.py", DefKind::Class, "Shape"),
            ft("pkg/util.py", DefKind::Function, "helper"),
        ]
    );
    assert_eq!(gt.module_level, vec!["pkg/util.py"]);
    assert!(gt
        .functions
        .iter()
        .all(|f| f.name != "added" && f.name != "Shape.area"));
    // Pure insertions map to the line they follow.
    assert!(gt.lines.contains(&LineTarget {
        path: "pkg/util.py".into(),
        line: 1
    }));
    assert!(gt.lines.contains(&LineTarget {
        path: "pkg/util.py".into(),
        line: 6
    }));
}

#[test]
fn hand_written_rename_delete_and_add() {
    let patch = "\
diff --git a/pkg/util.py b/pkg/helpers.py
similarity index 80%
rename from pkg/util.py
rename to pkg/helpers.py
index 1111111..2222222 100644
--- a/pkg/util.py
+++ b/pkg/helpers.py
@@ -4,3 +4,3 @@ def helper(a):
 
 def other():
-    return 1
+    return 2
diff --git a/README.md b/README.md
deleted file mode 100644
index 3333333..0000000
--- a/README.md
+++ /dev/null
@@ -1,3 +0,0 @@
-# Title
-
-Some text.
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1 @@
+X = 1
";
    let gt = ground_truth(patch, &snapshot()).unwrap();
    assert_eq!(gt.files, vec!["pkg/util.py", "README.md"]);
    assert_eq!(
        gt.functions,
        vec![ft("pkg/util.py", DefKind::Function, "other")]
    );
    assert_eq!(gt.lines.len(), 4);
    assert_eq!(gt.edits.len(), 1);
    assert_eq!(gt.edits[0].path, "pkg/util.py");
}

#[test]
fn non_python_files_use_their_grammar() {
    let rs = "struct A;\n\nimpl A {\n    fn f(&self) -> i32 {\n        1\n    }\n}\n";
    let new = rs.replace("        1\n", "        2\n");
    let snap = Snapshot::from_texts([("src/a.rs", rs)]);
    let gt = ground_truth(&patch_of(&[("src/a.rs", rs, &new)]), &snap).unwrap();
    assert_eq!(gt.functions, vec![ft("src/a.rs", DefKind::Method, "A.f")]);
    assert_eq!(
        gt.lines,
        vec![LineTarget {
            path: "src/a.rs".into(),
            line: 5
        }]
    );
}

#[test]
fn patch_that_does_not_apply_is_an_error() {
    let patch = "--- a/pkg/util.py\n+++ b/pkg/util.py\n@@ -1 +1 @@\n-nothing like this\n+x\n";
    let err = ground_truth(patch, &snapshot()).unwrap_err();
    assert!(err.to_string().contains("pkg/util.py"), "{err}");
    let err = ground_truth(
        "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n",
        &snapshot(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("nope.py"), "{err}");
}

#[test]
fn modified_lines_of_replacements_and_insertions() {
    let old = "a\nb\nc\nd\n";
    assert_eq!(
        modified_lines(old, "a\nB\nc\nd\n")
            .into_iter()
            .collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(
        modified_lines(old, "a\nb\nx\nc\nd\n")
            .into_iter()
            .collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(
        modified_lines(old, "x\na\nb\nc\nd\n")
            .into_iter()
            .collect::<Vec<_>>(),
        vec![1]
    );
    assert_eq!(
        modified_lines(old, "a\nd\n")
            .into_iter()
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(modified_lines(old, old).is_empty());
}
