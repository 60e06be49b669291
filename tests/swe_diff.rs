//! Diff parser / applier / writer: realistic git output and property tests.

use proptest::prelude::*;
use sorft::swe::diff::{FilePatch, FileStatus, LineKind, Patch};
use std::collections::BTreeMap;
use std::process::Command;

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@e")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@e")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn read_tree(dir: &std::path::Path) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in git(dir, &["ls-files"]).lines() {
        if let Ok(t) = std::fs::read_to_string(dir.join(line)) {
            m.insert(line.to_string(), t);
        }
    }
    m
}

/// A patch produced by real `git diff` with every feature at once applies back to the exact new tree.
#[test]
fn real_git_diff_with_all_features_applies_exactly() {
    let td = tempfile::tempdir().unwrap();
    let d = td.path();
    git(d, &["init", "-q"]);
    let long: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    std::fs::write(d.join("keep.py"), &long).unwrap();
    std::fs::write(d.join("gone.txt"), "bye\nbye\n").unwrap();
    std::fs::write(d.join("crlf.txt"), "one\r\ntwo\r\nthree\r\n").unwrap();
    std::fs::write(d.join("tail.txt"), "x\ny").unwrap();
    std::fs::create_dir(d.join("pkg")).unwrap();
    std::fs::write(d.join("pkg/old_name.py"), &long).unwrap();
    std::fs::write(d.join("run.sh"), "echo hi\n").unwrap();
    std::fs::write(d.join("blob.bin"), [0u8, 1, 2, 3, 0, 255]).unwrap();
    git(d, &["add", "-A"]);
    git(d, &["commit", "-qm", "base"]);
    let before = read_tree(d);

    let edited = long
        .replace("line 3\n", "line three\n")
        .replace("line 30\n", "line 30\nline 30.5\n");
    std::fs::write(d.join("keep.py"), edited).unwrap();
    std::fs::remove_file(d.join("gone.txt")).unwrap();
    std::fs::write(d.join("crlf.txt"), "one\r\nTWO\r\nthree\r\n").unwrap();
    std::fs::write(d.join("tail.txt"), "x\ny\nz\n").unwrap();
    std::fs::write(d.join("new file.md"), "# hello\n").unwrap();
    git(d, &["mv", "pkg/old_name.py", "pkg/new_name.py"]);
    std::fs::write(
        d.join("pkg/new_name.py"),
        long.replace("line 20\n", "line twenty\n"),
    )
    .unwrap();
    std::fs::write(d.join("blob.bin"), [9u8, 0, 9]).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    git(d, &["add", "-A"]);
    let text = git(d, &["diff", "--cached", "-M"]);
    let patch = Patch::parse(&text).unwrap();
    let by_path: BTreeMap<&str, &FilePatch> = patch.files.iter().map(|f| (f.path(), f)).collect();
    assert_eq!(by_path["gone.txt"].status, FileStatus::Deleted);
    assert_eq!(by_path["new file.md"].status, FileStatus::Added);
    assert_eq!(by_path["pkg/new_name.py"].status, FileStatus::Renamed);
    assert_eq!(
        by_path["pkg/new_name.py"].old_path.as_deref(),
        Some("pkg/old_name.py")
    );
    assert_eq!(by_path["run.sh"].new_mode.as_deref(), Some("100755"));
    assert!(by_path["run.sh"].hunks.is_empty());
    assert!(by_path["blob.bin"].binary);
    assert_eq!(by_path["keep.py"].hunks.len(), 2);

    // Everything but the binary file applies to the exact post-patch text.
    let text_only = Patch {
        files: patch.files.iter().filter(|f| !f.binary).cloned().collect(),
    };
    let mut tree = before.clone();
    text_only.apply_to_files(&mut tree).unwrap();
    let mut after = read_tree(d);
    after.remove("blob.bin");
    tree.remove("blob.bin");
    assert_eq!(tree, after);
    // The binary change is refused, not silently skipped.
    let mut t2 = before.clone();
    assert!(patch.apply_to_files(&mut t2).is_err());
    // Rendering and re-parsing gives the same structure.
    assert_eq!(Patch::parse(&patch.to_string()).unwrap(), patch);
}

#[test]
fn apply_to_dir_creates_deletes_and_renames() {
    let td = tempfile::tempdir().unwrap();
    let d = td.path();
    std::fs::write(d.join("a.py"), "x = 1\n").unwrap();
    std::fs::write(d.join("b.py"), "y = 2\n").unwrap();
    let patch = Patch {
        files: vec![
            FilePatch::from_texts(Some(("a.py", "x = 1\n")), Some(("sub/c.py", "x = 10\n"))),
            FilePatch::from_texts(Some(("b.py", "y = 2\n")), None),
            FilePatch::from_texts(None, Some(("new.py", "z = 3\n"))),
        ],
    };
    let text = patch.to_string();
    let parsed = Patch::parse(&text).unwrap();
    parsed.apply_to_dir(d).unwrap();
    assert!(!d.join("a.py").exists());
    assert!(!d.join("b.py").exists());
    assert_eq!(
        std::fs::read_to_string(d.join("sub/c.py")).unwrap(),
        "x = 10\n"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("new.py")).unwrap(),
        "z = 3\n"
    );
}

#[test]
fn hunk_applies_at_an_offset_but_not_with_wrong_context() {
    let text = "--- a/f.py\n+++ b/f.py\n@@ -2,3 +2,3 @@ def f():\n a\n-b\n+B\n c\n";
    let p = Patch::parse(text).unwrap();
    assert_eq!(p.files[0].hunks[0].section, "def f():");
    assert_eq!(p.files[0].hunks[0].deleted_old_lines(), vec![3]);
    // Two extra lines on top: found at an offset.
    assert_eq!(
        p.files[0].apply_text("0\n1\n2\na\nb\nc\n").unwrap(),
        "0\n1\n2\na\nB\nc\n"
    );
    let err = p.files[0].apply_text("a\nX\nc\n").unwrap_err();
    assert!(err.to_string().contains("f.py: hunk 1"), "{err}");
}

#[test]
fn malformed_diffs_are_errors_not_panics() {
    for bad in [
        "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n",
        "--- a/f\n+++ b/f\n@@ -x +1 @@\n",
        "@@ -1 +1 @@\n-a\n+b\n",
        "just words\n",
        "",
        "--- a/f\n+++ b/f\n@@ -1 +1 @@\n*a\n+b\n",
    ] {
        assert!(Patch::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn plain_diff_with_timestamps_and_blank_context() {
    let text = "--- f.txt\t2024-01-01 00:00:00\n+++ f.txt\t2024-01-02 00:00:00\n@@ -1,3 +1,3 @@\n a\n\n-c\n+C\n";
    let p = Patch::parse(text).unwrap();
    assert_eq!(p.files[0].path(), "f.txt");
    assert_eq!(p.files[0].hunks[0].lines[1].kind, LineKind::Context);
    assert_eq!(p.files[0].apply_text("a\n\nc\n").unwrap(), "a\n\nC\n");
}

fn text_strategy() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("".to_string()),
        Just("  indent".to_string()),
        "[a-c ]{0,4}",
        "[-+ \\\\@]{1,3}[a-z]{0,2}",
    ];
    (
        prop::collection::vec(line, 0..30),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(lines, crlf, trailing)| {
            let sep = if crlf { "\r\n" } else { "\n" };
            let mut s = lines.join(sep);
            if trailing && !s.is_empty() {
                s.push_str(sep);
            }
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A diff of two random texts parses and applies back exactly.
    #[test]
    fn diff_of_random_texts_round_trips(old in text_strategy(), new in text_strategy()) {
        let fp = FilePatch::from_texts(Some(("x/f.txt", &old)), Some(("x/f.txt", &new)));
        let text = Patch { files: vec![fp] }.to_string();
        if old == new {
            prop_assert!(Patch::parse(&text).unwrap().files[0].hunks.is_empty());
        } else {
            let p = Patch::parse(&text).unwrap();
            prop_assert_eq!(p.files.len(), 1);
            prop_assert_eq!(p.files[0].apply_text(&old).unwrap(), new.clone());
            prop_assert_eq!(p.to_string(), text);
        }
        // Added and deleted files too.
        let add = Patch { files: vec![FilePatch::from_texts(None, Some(("n.txt", &new)))] };
        let mut tree = BTreeMap::new();
        Patch::parse(&add.to_string()).unwrap().apply_to_files(&mut tree).unwrap();
        prop_assert_eq!(tree.get("n.txt").cloned().unwrap_or_default(), new.clone());
    }

    /// The parser never panics on arbitrary text.
    #[test]
    fn parser_never_panics(s in "(diff --git a/x b/y\n|--- a/x\n|\\+\\+\\+ b/x\n|@@ -1,2 \\+1 @@\n|[-+ \\\\][a-z]*\n|rename from x\n|new file mode 1\n|Binary files\n|.{0,10}\n){0,20}") {
        let _ = Patch::parse(&s);
    }
}
