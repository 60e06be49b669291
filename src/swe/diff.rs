//! Multi-file git unified diffs: parser, exact applier and writer.
//!
//! Handles modified, added, deleted, renamed and copied files, mode changes, binary markers
//! (`Binary files ... differ`, `GIT binary patch`), `\ No newline at end of file`, hunk headers with
//! omitted counts, and CRLF files: every [`Line`] keeps its own line terminator, so applying a patch
//! reproduces the post-patch bytes exactly.
//!
//! ```
//! use sorft::swe::diff::{Patch, unified_diff};
//! let text = unified_diff("m.py", "a = 1\nb = 2\n", "a = 1\nb = 3\n");
//! let patch = Patch::parse(&text).unwrap();
//! assert_eq!(patch.files[0].apply_text("a = 1\nb = 2\n").unwrap(), "a = 1\nb = 3\n");
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Errors parsing a diff.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A `@@ ... @@` line that is not a valid hunk header.
    #[error("line {line}: bad hunk header {text:?}")]
    BadHunkHeader {
        /// 1-based line number in the diff.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// A hunk line outside the counts of its header or with an unknown prefix.
    #[error("line {line}: malformed hunk line {text:?}")]
    BadHunkLine {
        /// 1-based line number in the diff.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// The diff ended inside a hunk.
    #[error(
        "line {line}: diff ends inside a hunk (expected {old} more old and {new} more new lines)"
    )]
    Truncated {
        /// 1-based line number where the diff ended.
        line: usize,
        /// Missing old-side lines.
        old: usize,
        /// Missing new-side lines.
        new: usize,
    },
    /// A hunk before any file header.
    #[error("line {line}: hunk without a file header")]
    HunkWithoutFile {
        /// 1-based line number in the diff.
        line: usize,
    },
    /// No file change at all in the text.
    #[error("no file changes found in the diff")]
    Empty,
}

/// Errors applying a diff.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A hunk's context and removed lines were not found.
    #[error("{path}: hunk {hunk} (old line {old_start}) does not apply")]
    HunkFailed {
        /// The file.
        path: String,
        /// 1-based hunk number within the file.
        hunk: usize,
        /// The hunk's old start line.
        old_start: usize,
    },
    /// The patch changes a file that does not exist.
    #[error("{path}: file does not exist")]
    Missing {
        /// The file.
        path: String,
    },
    /// The patch creates a file that already exists.
    #[error("{path}: file already exists")]
    Exists {
        /// The file.
        path: String,
    },
    /// The patch changes binary content, which a text diff cannot carry.
    #[error("{path}: binary change cannot be applied")]
    Binary {
        /// The file.
        path: String,
    },
    /// A deleted file still had content after removing the patch's lines.
    #[error("{path}: file deletion leaves content behind")]
    DeleteMismatch {
        /// The file.
        path: String,
    },
    /// Reading or writing a file failed, or it is not UTF-8.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
}

/// What a file patch does to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileStatus {
    /// Content or mode changed in place.
    Modified,
    /// New file.
    Added,
    /// File removed.
    Deleted,
    /// Moved (possibly with changes).
    Renamed,
    /// Copied (possibly with changes).
    Copied,
}

/// Kind of a hunk line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// Unchanged (` `).
    Context,
    /// Removed (`-`).
    Delete,
    /// Added (`+`).
    Insert,
}

/// One line of a hunk; `text` includes its line terminator (`\n`, `\r\n`), or none at end of file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Context, removed or added.
    pub kind: LineKind,
    /// The line content with its terminator.
    pub text: String,
}

/// One `@@ -a,b +c,d @@` hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// First old line (1-based; for an empty old range, the line after which the change goes).
    pub old_start: usize,
    /// Number of old lines (context + removed).
    pub old_lines: usize,
    /// First new line (same conventions).
    pub new_start: usize,
    /// Number of new lines (context + added).
    pub new_lines: usize,
    /// Text after the closing `@@` (function context), without the leading space.
    pub section: String,
    /// The lines.
    pub lines: Vec<Line>,
}

impl Hunk {
    /// Pre-patch line numbers (1-based) of the removed lines.
    pub fn deleted_old_lines(&self) -> Vec<usize> {
        let mut n = self.old_start.max(1);
        let mut out = Vec::new();
        for l in &self.lines {
            match l.kind {
                LineKind::Context => n += 1,
                LineKind::Delete => {
                    out.push(n);
                    n += 1;
                }
                LineKind::Insert => {}
            }
        }
        out
    }
}

/// The changes to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// Pre-patch path; `None` for an added file.
    pub old_path: Option<String>,
    /// Post-patch path; `None` for a deleted file.
    pub new_path: Option<String>,
    /// What happens to the file.
    pub status: FileStatus,
    /// Old mode (`old mode` / `deleted file mode`), e.g. `100644`.
    pub old_mode: Option<String>,
    /// New mode (`new mode` / `new file mode`).
    pub new_mode: Option<String>,
    /// `similarity index` percentage of a rename or copy.
    pub similarity: Option<u32>,
    /// The `index` line's value, kept for rendering.
    pub index: Option<String>,
    /// Binary content change (no text hunks).
    pub binary: bool,
    /// Text hunks, in order.
    pub hunks: Vec<Hunk>,
}

impl FilePatch {
    /// The file's path: the new path, or the old one for a deletion.
    pub fn path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or("")
    }

    /// Number of added and removed lines.
    pub fn line_counts(&self) -> (usize, usize) {
        let mut add = 0;
        let mut del = 0;
        for l in self.hunks.iter().flat_map(|h| &h.lines) {
            match l.kind {
                LineKind::Insert => add += 1,
                LineKind::Delete => del += 1,
                LineKind::Context => {}
            }
        }
        (add, del)
    }

    /// Applies the hunks to `original` exactly (offsets allowed, no fuzz).
    pub fn apply_text(&self, original: &str) -> Result<String, ApplyError> {
        if self.binary {
            return Err(ApplyError::Binary {
                path: self.path().to_string(),
            });
        }
        apply_hunks(original, &self.hunks).map_err(|(hunk, old_start)| ApplyError::HunkFailed {
            path: self.path().to_string(),
            hunk,
            old_start,
        })
    }

    /// Builds the patch turning `old` into `new` (`None` side = file absent), with 3 lines of context.
    pub fn from_texts(old: Option<(&str, &str)>, new: Option<(&str, &str)>) -> FilePatch {
        let old_text = old.map(|o| o.1).unwrap_or("");
        let new_text = new.map(|n| n.1).unwrap_or("");
        let old_path = old.map(|o| o.0.to_string());
        let new_path = new.map(|n| n.0.to_string());
        let status = match (&old_path, &new_path) {
            (None, _) => FileStatus::Added,
            (_, None) => FileStatus::Deleted,
            (Some(a), Some(b)) if a != b => FileStatus::Renamed,
            _ => FileStatus::Modified,
        };
        FilePatch {
            old_mode: (status == FileStatus::Deleted).then(|| "100644".to_string()),
            new_mode: (status == FileStatus::Added).then(|| "100644".to_string()),
            similarity: (status == FileStatus::Renamed).then(|| similarity(old_text, new_text)),
            old_path,
            new_path,
            status,
            index: None,
            binary: false,
            hunks: diff_hunks(old_text, new_text, 3),
        }
    }
}

fn similarity(a: &str, b: &str) -> u32 {
    let r = similar::TextDiff::from_lines(a, b).ratio();
    (r * 100.0).round() as u32
}

/// A multi-file patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Patch {
    /// File patches, in the order of the diff.
    pub files: Vec<FilePatch>,
}

impl Patch {
    /// Parses a git (or plain) unified diff. Text outside file sections (commit messages) is ignored.
    pub fn parse(text: &str) -> Result<Patch, ParseError> {
        let patch = Parser::new(text).run()?;
        if patch.files.is_empty() {
            return Err(ParseError::Empty);
        }
        Ok(patch)
    }

    /// Paths touched (new path, or old path for deletions), in diff order.
    pub fn paths(&self) -> Vec<&str> {
        self.files.iter().map(|f| f.path()).collect()
    }

    /// Applies the patch to an in-memory tree of text files (path -> contents).
    /// On error the map may be partially changed.
    pub fn apply_to_files(&self, files: &mut BTreeMap<String, String>) -> Result<(), ApplyError> {
        for fp in &self.files {
            let old = match &fp.old_path {
                Some(p) => {
                    let text = files
                        .get(p)
                        .ok_or_else(|| ApplyError::Missing { path: p.clone() })?;
                    Some(text.clone())
                }
                None => None,
            };
            if fp.binary {
                // A pure rename or mode change of a binary file carries no content change.
                return Err(ApplyError::Binary {
                    path: fp.path().to_string(),
                });
            }
            let new_text = fp.apply_text(old.as_deref().unwrap_or(""))?;
            if fp.status == FileStatus::Renamed {
                if let Some(p) = &fp.old_path {
                    files.remove(p);
                }
            }
            match &fp.new_path {
                Some(p) => {
                    if fp.old_path.is_none() && files.contains_key(p) {
                        return Err(ApplyError::Exists { path: p.clone() });
                    }
                    files.insert(p.clone(), new_text);
                }
                None => {
                    if !new_text.is_empty() {
                        return Err(ApplyError::DeleteMismatch {
                            path: fp.path().to_string(),
                        });
                    }
                    if let Some(p) = &fp.old_path {
                        files.remove(p);
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies the patch to the files under `dir` (text files only), setting executable modes.
    pub fn apply_to_dir(&self, dir: &Path) -> Result<(), ApplyError> {
        let mut files = BTreeMap::new();
        for fp in &self.files {
            for p in [&fp.old_path, &fp.new_path].into_iter().flatten() {
                let full = dir.join(p);
                if full.is_file() {
                    let bytes = std::fs::read(&full).map_err(|e| ApplyError::Io {
                        path: full.clone(),
                        msg: e.to_string(),
                    })?;
                    let text = String::from_utf8(bytes).map_err(|_| ApplyError::Io {
                        path: full.clone(),
                        msg: "not UTF-8 text".into(),
                    })?;
                    files.insert(p.clone(), text);
                }
            }
        }
        let before: Vec<String> = files.keys().cloned().collect();
        self.apply_to_files(&mut files)?;
        for p in before {
            if !files.contains_key(&p) {
                let full = dir.join(&p);
                std::fs::remove_file(&full).map_err(|e| ApplyError::Io {
                    path: full,
                    msg: e.to_string(),
                })?;
            }
        }
        for fp in &self.files {
            let Some(p) = &fp.new_path else { continue };
            let Some(text) = files.get(p) else { continue };
            let full = dir.join(p);
            let io = |e: std::io::Error| ApplyError::Io {
                path: full.clone(),
                msg: e.to_string(),
            };
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::write(&full, text).map_err(io)?;
            #[cfg(unix)]
            if let Some(mode) = &fp.new_mode {
                use std::os::unix::fs::PermissionsExt;
                let bits = if mode.ends_with("755") { 0o755 } else { 0o644 };
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(bits))
                    .map_err(io)?;
            }
        }
        Ok(())
    }
}

/// Applies hunks to text; on failure returns (1-based hunk number, its old start).
fn apply_hunks(original: &str, hunks: &[Hunk]) -> Result<String, (usize, usize)> {
    let lines: Vec<&str> = original.split_inclusive('\n').collect();
    let mut out = String::with_capacity(original.len() + 64);
    let mut cursor = 0usize;
    for (hi, h) in hunks.iter().enumerate() {
        let expected: Vec<&str> = h
            .lines
            .iter()
            .filter(|l| l.kind != LineKind::Insert)
            .map(|l| l.text.as_str())
            .collect();
        let preferred = if h.old_lines == 0 || expected.is_empty() {
            h.old_start
        } else {
            h.old_start.saturating_sub(1)
        };
        let fits = |pos: usize| -> bool {
            pos >= cursor
                && pos + expected.len() <= lines.len()
                && lines[pos..pos + expected.len()] == expected[..]
        };
        let pos = if expected.is_empty() {
            let p = preferred.clamp(cursor, lines.len());
            Some(p)
        } else {
            let mut found = None;
            let span = lines.len() + 1;
            for d in 0..span {
                if fits(preferred + d) {
                    found = Some(preferred + d);
                    break;
                }
                if d > 0 && d <= preferred && fits(preferred - d) {
                    found = Some(preferred - d);
                    break;
                }
            }
            found
        };
        let Some(pos) = pos else {
            return Err((hi + 1, h.old_start));
        };
        for l in &lines[cursor..pos] {
            out.push_str(l);
        }
        for l in &h.lines {
            if l.kind != LineKind::Delete {
                out.push_str(&l.text);
            }
        }
        cursor = pos + expected.len();
    }
    for l in &lines[cursor.min(lines.len())..] {
        out.push_str(l);
    }
    Ok(out)
}

/// Hunks turning `old` into `new` with `context` lines of context (empty when equal).
pub fn diff_hunks(old: &str, new: &str, context: usize) -> Vec<Hunk> {
    let diff = similar::TextDiff::from_lines(old, new);
    let old_lines: Vec<&str> = old.split_inclusive('\n').collect();
    let new_lines: Vec<&str> = new.split_inclusive('\n').collect();
    let mut hunks = Vec::new();
    for group in diff.grouped_ops(context) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let o0 = first.old_range().start;
        let o1 = last.old_range().end;
        let n0 = first.new_range().start;
        let n1 = last.new_range().end;
        let mut lines = Vec::new();
        for op in &group {
            let (tag, or, nr) = op.as_tag_tuple();
            match tag {
                similar::DiffTag::Equal => {
                    for i in or {
                        lines.push(Line {
                            kind: LineKind::Context,
                            text: old_lines[i].to_string(),
                        });
                    }
                }
                _ => {
                    for i in or {
                        lines.push(Line {
                            kind: LineKind::Delete,
                            text: old_lines[i].to_string(),
                        });
                    }
                    for i in nr {
                        lines.push(Line {
                            kind: LineKind::Insert,
                            text: new_lines[i].to_string(),
                        });
                    }
                }
            }
        }
        let old_count = o1 - o0;
        let new_count = n1 - n0;
        hunks.push(Hunk {
            old_start: if old_count == 0 { o0 } else { o0 + 1 },
            old_lines: old_count,
            new_start: if new_count == 0 { n0 } else { n0 + 1 },
            new_lines: new_count,
            section: String::new(),
            lines,
        });
    }
    hunks
}

/// A git-style unified diff of one file modified in place (empty string when the texts are equal).
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    let fp = FilePatch::from_texts(Some((path, old)), Some((path, new)));
    if fp.hunks.is_empty() {
        return String::new();
    }
    Patch { files: vec![fp] }.to_string()
}

fn quote_path(prefix: &str, p: &str) -> String {
    let needs = p
        .chars()
        .any(|c| c == '"' || c == '\\' || c.is_control() || c == '\t');
    if !needs {
        return format!("{prefix}{p}");
    }
    let mut s = String::from("\"");
    s.push_str(prefix);
    for c in p.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn write_count(f: &mut fmt::Formatter<'_>, start: usize, count: usize) -> fmt::Result {
    if count == 1 {
        write!(f, "{start}")
    } else {
        write!(f, "{start},{count}")
    }
}

impl fmt::Display for Hunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("@@ -")?;
        write_count(f, self.old_start, self.old_lines)?;
        f.write_str(" +")?;
        write_count(f, self.new_start, self.new_lines)?;
        f.write_str(" @@")?;
        if !self.section.is_empty() {
            write!(f, " {}", self.section)?;
        }
        f.write_str("\n")?;
        for l in &self.lines {
            let c = match l.kind {
                LineKind::Context => ' ',
                LineKind::Delete => '-',
                LineKind::Insert => '+',
            };
            write!(f, "{c}{}", l.text)?;
            if !l.text.ends_with('\n') {
                f.write_str("\n\\ No newline at end of file\n")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for FilePatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self.old_path.as_deref().unwrap_or(self.path());
        let b = self.new_path.as_deref().unwrap_or(self.path());
        writeln!(
            f,
            "diff --git {} {}",
            quote_path("a/", a),
            quote_path("b/", b)
        )?;
        match self.status {
            FileStatus::Added => writeln!(
                f,
                "new file mode {}",
                self.new_mode.as_deref().unwrap_or("100644")
            )?,
            FileStatus::Deleted => writeln!(
                f,
                "deleted file mode {}",
                self.old_mode.as_deref().unwrap_or("100644")
            )?,
            _ => {
                if let (Some(o), Some(n)) = (&self.old_mode, &self.new_mode) {
                    writeln!(f, "old mode {o}\nnew mode {n}")?;
                }
            }
        }
        if matches!(self.status, FileStatus::Renamed | FileStatus::Copied) {
            let word = if self.status == FileStatus::Renamed {
                "rename"
            } else {
                "copy"
            };
            if let Some(s) = self.similarity {
                writeln!(f, "similarity index {s}%")?;
            }
            writeln!(f, "{word} from {a}\n{word} to {b}")?;
        }
        if let Some(ix) = &self.index {
            writeln!(f, "index {ix}")?;
        }
        let old_name = match &self.old_path {
            Some(p) => quote_path("a/", p),
            None => "/dev/null".into(),
        };
        let new_name = match &self.new_path {
            Some(p) => quote_path("b/", p),
            None => "/dev/null".into(),
        };
        if self.binary {
            writeln!(f, "Binary files {old_name} and {new_name} differ")?;
        } else if !self.hunks.is_empty() {
            writeln!(f, "--- {old_name}\n+++ {new_name}")?;
            for h in &self.hunks {
                write!(f, "{h}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Patch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for fp in &self.files {
            write!(f, "{fp}")?;
        }
        Ok(())
    }
}

/// Removes a C-style quoted path's quotes and escapes; returns the rest after the closing quote.
fn unquote(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut out: Vec<u8> = Vec::new();
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                return Some((String::from_utf8_lossy(&out).into_owned(), &body[i + 1..]));
            }
            b'\\' if i + 1 < bytes.len() => {
                let c = bytes[i + 1];
                i += 2;
                match c {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'a' => out.push(7),
                    b'b' => out.push(8),
                    b'f' => out.push(12),
                    b'v' => out.push(11),
                    b'0'..=b'7' => {
                        let mut v = u32::from(c - b'0');
                        let mut k = 0;
                        while k < 2 && i < bytes.len() && (b'0'..=b'7').contains(&bytes[i]) {
                            v = v * 8 + u32::from(bytes[i] - b'0');
                            i += 1;
                            k += 1;
                        }
                        out.push((v & 0xff) as u8);
                    }
                    other => out.push(other),
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

fn strip_prefix_component(p: &str) -> String {
    for pre in ["a/", "b/"] {
        if let Some(rest) = p.strip_prefix(pre) {
            return rest.to_string();
        }
    }
    p.to_string()
}

/// Parses the path on a `---` / `+++` line: `None` for `/dev/null`.
fn parse_marker_path(rest: &str) -> Option<String> {
    let rest = rest.trim_end_matches(['\n', '\r']);
    let raw = if rest.starts_with('"') {
        unquote(rest)
            .map(|(p, _)| p)
            .unwrap_or_else(|| rest.to_string())
    } else {
        // Drop a tab-separated timestamp.
        rest.split('\t').next().unwrap_or("").trim_end().to_string()
    };
    if raw == "/dev/null" {
        None
    } else {
        Some(strip_prefix_component(&raw))
    }
}

/// Parses the two paths of a `diff --git` line.
fn parse_git_paths(rest: &str) -> (Option<String>, Option<String>) {
    let rest = rest.trim_end_matches(['\n', '\r']);
    if rest.starts_with('"') {
        if let Some((a, tail)) = unquote(rest) {
            let tail = tail.trim_start();
            let b = if tail.starts_with('"') {
                unquote(tail).map(|(b, _)| b)
            } else {
                Some(tail.to_string())
            };
            return (
                Some(strip_prefix_component(&a)),
                b.map(|b| strip_prefix_component(&b)),
            );
        }
    }
    // Unquoted: prefer the split where both sides name the same file.
    let n = rest.len();
    if n % 2 == 1 && rest.is_char_boundary(n / 2) && rest.as_bytes()[n / 2] == b' ' {
        let (a, b) = (&rest[..n / 2], &rest[n / 2 + 1..]);
        let (sa, sb) = (strip_prefix_component(a), strip_prefix_component(b));
        if sa == sb {
            return (Some(sa), Some(sb));
        }
    }
    if let Some(i) = rest.rfind(" b/") {
        let a = &rest[..i];
        let b = &rest[i + 1..];
        if a.starts_with('"') {
            if let Some((aq, _)) = unquote(a) {
                return (
                    Some(strip_prefix_component(&aq)),
                    Some(strip_prefix_component(b)),
                );
            }
        }
        return (
            Some(strip_prefix_component(a)),
            Some(strip_prefix_component(b)),
        );
    }
    match rest.split_once(' ') {
        Some((a, b)) => (
            Some(strip_prefix_component(a)),
            Some(strip_prefix_component(b)),
        ),
        None => (None, None),
    }
}

fn parse_range(s: &str) -> Option<(usize, usize)> {
    match s.split_once(',') {
        Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
        None => Some((s.parse().ok()?, 1)),
    }
}

/// Parses `@@ -a[,b] +c[,d] @@[ section]`.
fn parse_hunk_header(line: &str) -> Option<(usize, usize, usize, usize, String)> {
    let line = line.trim_end_matches(['\n', '\r']);
    let rest = line.strip_prefix("@@ -")?;
    let (old, rest) = rest.split_once(" +")?;
    let (new, rest) = rest.split_once(" @@")?;
    let (os, ol) = parse_range(old)?;
    let (ns, nl) = parse_range(new)?;
    let section = rest.strip_prefix(' ').unwrap_or(rest).to_string();
    Some((os, ol, ns, nl, section))
}

/// Recognised git extended-header prefixes.
const HEADER_PREFIXES: [&str; 11] = [
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "similarity index ",
    "dissimilarity index ",
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
    "index ",
];

struct Parser<'a> {
    lines: Vec<&'a str>,
    i: usize,
    files: Vec<FilePatch>,
    cur: Option<FilePatch>,
    /// Inside a `diff --git` header (before `---`/hunks).
    in_header: bool,
    rename_seen: bool,
    copy_seen: bool,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            lines: text.split_inclusive('\n').collect(),
            i: 0,
            files: Vec::new(),
            cur: None,
            in_header: false,
            rename_seen: false,
            copy_seen: false,
        }
    }

    fn finish(&mut self) {
        if let Some(mut fp) = self.cur.take() {
            fp.status = if fp.old_path.is_none() {
                FileStatus::Added
            } else if fp.new_path.is_none() {
                FileStatus::Deleted
            } else if self.rename_seen {
                FileStatus::Renamed
            } else if self.copy_seen {
                FileStatus::Copied
            } else {
                FileStatus::Modified
            };
            self.files.push(fp);
        }
        self.rename_seen = false;
        self.copy_seen = false;
        self.in_header = false;
    }

    fn start(&mut self, old: Option<String>, new: Option<String>) {
        self.finish();
        self.cur = Some(FilePatch {
            old_path: old,
            new_path: new,
            status: FileStatus::Modified,
            old_mode: None,
            new_mode: None,
            similarity: None,
            index: None,
            binary: false,
            hunks: Vec::new(),
        });
    }

    fn run(mut self) -> Result<Patch, ParseError> {
        while self.i < self.lines.len() {
            let line = self.lines[self.i];
            let bare = line.trim_end_matches(['\n', '\r']);
            if let Some(rest) = line.strip_prefix("diff --git ") {
                let (a, b) = parse_git_paths(rest);
                self.start(a, b);
                self.in_header = true;
                self.i += 1;
                continue;
            }
            if self.in_header {
                if let Some(p) = HEADER_PREFIXES.iter().find(|p| bare.starts_with(*p)) {
                    let value = bare[p.len()..].trim().to_string();
                    self.header_line(p, value);
                    self.i += 1;
                    continue;
                }
                if bare.starts_with("Binary files ") || bare == "GIT binary patch" {
                    if let Some(fp) = self.cur.as_mut() {
                        fp.binary = true;
                    }
                    self.i += 1;
                    if bare == "GIT binary patch" {
                        // Skip the base85 payload up to the next file.
                        while self.i < self.lines.len()
                            && !self.lines[self.i].starts_with("diff --git ")
                        {
                            self.i += 1;
                        }
                    }
                    continue;
                }
            }
            if bare.starts_with("--- ")
                && self
                    .lines
                    .get(self.i + 1)
                    .is_some_and(|n| n.starts_with("+++ "))
            {
                let old = parse_marker_path(&line[4..]);
                let new = parse_marker_path(&self.lines[self.i + 1][4..]);
                let continuing =
                    self.in_header && self.cur.as_ref().is_some_and(|c| c.hunks.is_empty());
                if continuing {
                    if let Some(fp) = self.cur.as_mut() {
                        fp.old_path = old.or(None);
                        fp.new_path = new;
                    }
                } else {
                    self.start(old, new);
                }
                self.in_header = false;
                self.i += 2;
                continue;
            }
            if line.starts_with("@@ ") {
                self.hunk()?;
                continue;
            }
            // Anything else (commit message, trailing junk) is not part of a file section.
            self.i += 1;
        }
        self.finish();
        Ok(Patch { files: self.files })
    }

    fn header_line(&mut self, prefix: &str, value: String) {
        let Some(fp) = self.cur.as_mut() else { return };
        match prefix {
            "old mode " => fp.old_mode = Some(value),
            "new mode " => fp.new_mode = Some(value),
            "deleted file mode " => {
                fp.old_mode = Some(value);
                fp.new_path = None;
            }
            "new file mode " => {
                fp.new_mode = Some(value);
                fp.old_path = None;
            }
            "similarity index " => {
                fp.similarity = value.trim_end_matches('%').parse().ok();
            }
            "rename from " | "copy from " => {
                fp.old_path = Some(unquote(&value).map(|(p, _)| p).unwrap_or(value));
                if prefix == "rename from " {
                    self.rename_seen = true;
                } else {
                    self.copy_seen = true;
                }
            }
            "rename to " | "copy to " => {
                fp.new_path = Some(unquote(&value).map(|(p, _)| p).unwrap_or(value));
                if prefix == "rename to " {
                    self.rename_seen = true;
                } else {
                    self.copy_seen = true;
                }
            }
            "index " => fp.index = Some(value),
            _ => {}
        }
    }

    fn hunk(&mut self) -> Result<(), ParseError> {
        let header_line = self.i + 1;
        let line = self.lines[self.i];
        let (old_start, old_lines, new_start, new_lines, section) = parse_hunk_header(line)
            .ok_or_else(|| ParseError::BadHunkHeader {
                line: header_line,
                text: line.trim_end().to_string(),
            })?;
        if self.cur.is_none() {
            return Err(ParseError::HunkWithoutFile { line: header_line });
        }
        self.in_header = false;
        self.i += 1;
        let (mut old_rem, mut new_rem) = (old_lines, new_lines);
        let mut lines: Vec<Line> = Vec::new();
        while old_rem > 0 || new_rem > 0 {
            let Some(&l) = self.lines.get(self.i) else {
                return Err(ParseError::Truncated {
                    line: self.lines.len(),
                    old: old_rem,
                    new: new_rem,
                });
            };
            let bad = || ParseError::BadHunkLine {
                line: self.i + 1,
                text: l.trim_end().to_string(),
            };
            let (kind, text) = match l.as_bytes().first() {
                Some(b' ') => (LineKind::Context, &l[1..]),
                Some(b'-') => (LineKind::Delete, &l[1..]),
                Some(b'+') => (LineKind::Insert, &l[1..]),
                Some(b'\\') => {
                    strip_newline(&mut lines);
                    self.i += 1;
                    continue;
                }
                // An empty line inside a hunk is a blank context line whose space was stripped.
                Some(b'\n') | Some(b'\r') if l.trim_end_matches(['\n', '\r']).is_empty() => {
                    (LineKind::Context, l)
                }
                _ => return Err(bad()),
            };
            match kind {
                LineKind::Context if old_rem > 0 && new_rem > 0 => {
                    old_rem -= 1;
                    new_rem -= 1;
                }
                LineKind::Delete if old_rem > 0 => old_rem -= 1,
                LineKind::Insert if new_rem > 0 => new_rem -= 1,
                _ => return Err(bad()),
            }
            lines.push(Line {
                kind,
                text: text.to_string(),
            });
            self.i += 1;
        }
        if self.lines.get(self.i).is_some_and(|l| l.starts_with('\\')) {
            strip_newline(&mut lines);
            self.i += 1;
        }
        if let Some(fp) = self.cur.as_mut() {
            fp.hunks.push(Hunk {
                old_start,
                old_lines,
                new_start,
                new_lines,
                section,
                lines,
            });
        }
        Ok(())
    }
}

fn strip_newline(lines: &mut [Line]) {
    if let Some(last) = lines.last_mut() {
        if last.text.ends_with('\n') {
            last.text.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omitted_counts_and_no_newline() {
        let d = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n";
        let p = Patch::parse(d).unwrap();
        let fp = &p.files[0];
        assert_eq!(fp.status, FileStatus::Modified);
        assert_eq!(fp.apply_text("old").unwrap(), "new\n");
        assert!(fp.apply_text("old\n").is_err());
    }

    #[test]
    fn git_header_path_splitting() {
        assert_eq!(
            parse_git_paths("a/x y.py b/x y.py"),
            (Some("x y.py".into()), Some("x y.py".into()))
        );
        assert_eq!(
            parse_git_paths("\"a/t\\303\\251.py\" \"b/t\\303\\251.py\""),
            (Some("té.py".into()), Some("té.py".into()))
        );
        assert_eq!(
            parse_git_paths("a/old.py b/new.py"),
            (Some("old.py".into()), Some("new.py".into()))
        );
    }

    #[test]
    fn writer_round_trips_through_parser() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n";
        let new = "a\nB\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl";
        let text = unified_diff("p.txt", old, new);
        let p = Patch::parse(&text).unwrap();
        assert_eq!(p.files[0].hunks.len(), 2);
        assert_eq!(p.files[0].apply_text(old).unwrap(), new);
        assert_eq!(p.to_string(), text);
    }
}
