//! Agentless SEARCH/REPLACE edit blocks: tolerant parser, exact applier, conversion to unified diffs.
//!
//! ```text
//! ### path/to/file.py
//! <<<<<<< SEARCH
//! old lines
//! =======
//! new lines
//! >>>>>>> REPLACE
//! ```
//! A block without its own `### path` line uses the path of the block before it.

use crate::swe::diff::{FilePatch, Patch};
use std::collections::BTreeMap;
use std::fmt;

/// One SEARCH/REPLACE block. `search` and `replace` hold whole lines, each ending in `\n` (or empty).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EditBlock {
    /// Repository-relative path of the file to edit.
    pub path: String,
    /// Text to find verbatim.
    pub search: String,
    /// Text to put in its place.
    pub replace: String,
}

/// Why edit blocks could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
pub enum EditError {
    /// The text holds no complete block.
    #[error("no SEARCH/REPLACE block found")]
    NoBlocks,
    /// A block names a file that is not available.
    #[error("block {block}: file {path} is not available")]
    UnknownFile {
        /// 1-based block number.
        block: usize,
        /// The path the block names.
        path: String,
    },
    /// A block's SEARCH text is not in the file.
    #[error("block {block}: SEARCH text not found verbatim in {path}")]
    SearchNotFound {
        /// 1-based block number.
        block: usize,
        /// The file.
        path: String,
    },
    /// A block with an empty SEARCH on an existing file.
    #[error("block {block}: empty SEARCH for existing file {path}")]
    EmptySearch {
        /// 1-based block number.
        block: usize,
        /// The file.
        path: String,
    },
    /// The blocks apply but change nothing.
    #[error("the edit changes nothing")]
    NoChange,
}

fn marker(line: &str, ch: char, word: &str) -> bool {
    let t = line.trim();
    let n = t.chars().take_while(|&c| c == ch).count();
    n >= 5 && t[n..].trim() == word
}

fn is_search(line: &str) -> bool {
    marker(line, '<', "SEARCH")
}
fn is_divider(line: &str) -> bool {
    let t = line.trim();
    t.len() >= 5 && t.chars().all(|c| c == '=')
}
fn is_replace(line: &str) -> bool {
    marker(line, '>', "REPLACE")
}

/// Pulls a file path out of a `### path` line (tolerates backticks, quotes and a trailing colon).
fn path_of_header(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("###")?;
    let p = rest
        .trim()
        .trim_matches(|c| c == '`' || c == '"' || c == '\'' || c == '*')
        .trim_end_matches(':')
        .trim();
    if p.is_empty() || p.contains(' ') {
        None
    } else {
        Some(p.trim_start_matches("./").to_string())
    }
}

/// Parses every complete SEARCH/REPLACE block in free text; junk around blocks is ignored, never panics.
pub fn parse_blocks(text: &str) -> Vec<EditBlock> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<EditBlock> = Vec::new();
    let mut path: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(p) = path_of_header(line) {
            path = Some(p);
            i += 1;
            continue;
        }
        if !is_search(line) {
            i += 1;
            continue;
        }
        // SEARCH part up to the divider, REPLACE part up to the closing marker.
        let mut j = i + 1;
        let mut search = String::new();
        while j < lines.len() && !is_divider(lines[j]) && !is_search(lines[j]) {
            search.push_str(lines[j].trim_end_matches('\r'));
            search.push('\n');
            j += 1;
        }
        if j >= lines.len() || is_search(lines[j]) {
            i = j;
            continue; // unterminated: skip
        }
        let mut k = j + 1;
        let mut replace = String::new();
        while k < lines.len() && !is_replace(lines[k]) && !is_search(lines[k]) {
            replace.push_str(lines[k].trim_end_matches('\r'));
            replace.push('\n');
            k += 1;
        }
        if k >= lines.len() || is_search(lines[k]) {
            i = k;
            continue;
        }
        out.push(EditBlock {
            path: path.clone().unwrap_or_default(),
            search,
            replace,
        });
        i = k + 1;
    }
    out
}

/// Renders blocks in the Agentless format, each inside a ```python-style fence chosen by extension.
pub fn render_blocks(blocks: &[EditBlock]) -> String {
    let mut s = String::new();
    for b in blocks {
        s.push_str(&b.to_string());
    }
    s
}

impl fmt::Display for EditBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "```{}", fence_lang(&self.path))?;
        writeln!(f, "### {}", self.path)?;
        writeln!(f, "<<<<<<< SEARCH")?;
        f.write_str(&self.search)?;
        if !self.search.is_empty() && !self.search.ends_with('\n') {
            f.write_str("\n")?;
        }
        writeln!(f, "=======")?;
        f.write_str(&self.replace)?;
        if !self.replace.is_empty() && !self.replace.ends_with('\n') {
            f.write_str("\n")?;
        }
        writeln!(f, ">>>>>>> REPLACE")?;
        writeln!(f, "```")
    }
}

/// Markdown fence language for a path.
pub fn fence_lang(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "py" => "python",
        "rs" => "rust",
        "js" | "mjs" | "cjs" => "javascript",
        "ts" | "tsx" => "typescript",
        "java" => "java",
        "go" => "go",
        _ => "",
    }
}

/// Finds `needle` in `hay`, also accepting a match at end of file without the final newline.
/// Returns (byte offset, matched length).
fn find_verbatim(hay: &str, needle: &str) -> Option<(usize, usize)> {
    if let Some(p) = hay.find(needle) {
        return Some((p, needle.len()));
    }
    let trimmed = needle.strip_suffix('\n')?;
    if hay.ends_with(trimmed) {
        return Some((hay.len() - trimmed.len(), trimmed.len()));
    }
    None
}

/// Converts `\n` to `\r\n` when the file uses CRLF line endings.
fn to_file_eol(text: &str, crlf: bool) -> String {
    if crlf {
        text.replace("\r\n", "\n").replace('\n', "\r\n")
    } else {
        text.to_string()
    }
}

/// Applies one block to a file's text: the first verbatim occurrence of SEARCH becomes REPLACE.
pub fn apply_block(text: &str, block: &EditBlock) -> Option<String> {
    let crlf = text.contains("\r\n");
    let search = to_file_eol(&block.search, crlf);
    let mut replace = to_file_eol(&block.replace, crlf);
    let (pos, len) = find_verbatim(text, &search)?;
    if len < search.len() && replace.ends_with('\n') {
        // Matched at EOF without newline: keep the file's missing final newline.
        replace.pop();
        if crlf && replace.ends_with('\r') {
            replace.pop();
        }
    }
    let mut out = String::with_capacity(text.len() + replace.len());
    out.push_str(&text[..pos]);
    out.push_str(&replace);
    out.push_str(&text[pos + len..]);
    Some(out)
}

/// Applies blocks in order to `files` (path -> text). Returns the new text of every changed file.
/// An empty SEARCH creates a file that does not exist. Errors say which block failed.
pub fn apply_blocks(
    files: &BTreeMap<String, String>,
    blocks: &[EditBlock],
) -> Result<BTreeMap<String, String>, EditError> {
    if blocks.is_empty() {
        return Err(EditError::NoBlocks);
    }
    let mut current: BTreeMap<String, String> = BTreeMap::new();
    for (i, b) in blocks.iter().enumerate() {
        let n = i + 1;
        let text = match current.get(&b.path).or_else(|| files.get(&b.path)) {
            Some(t) => t.clone(),
            None if b.search.trim().is_empty() && !b.path.is_empty() => {
                current.insert(b.path.clone(), b.replace.clone());
                continue;
            }
            None => {
                return Err(EditError::UnknownFile {
                    block: n,
                    path: b.path.clone(),
                })
            }
        };
        if b.search.trim().is_empty() {
            return Err(EditError::EmptySearch {
                block: n,
                path: b.path.clone(),
            });
        }
        let new = apply_block(&text, b).ok_or_else(|| EditError::SearchNotFound {
            block: n,
            path: b.path.clone(),
        })?;
        current.insert(b.path.clone(), new);
    }
    current.retain(|p, t| files.get(p) != Some(t));
    if current.is_empty() {
        return Err(EditError::NoChange);
    }
    Ok(current)
}

/// Applies blocks and returns the git unified diff of the change (one file patch per changed file).
pub fn blocks_to_patch(
    files: &BTreeMap<String, String>,
    blocks: &[EditBlock],
) -> Result<Patch, EditError> {
    let changed = apply_blocks(files, blocks)?;
    let mut patch = Patch::default();
    for (path, new) in &changed {
        let fp = match files.get(path) {
            Some(old) => FilePatch::from_texts(Some((path, old)), Some((path, new))),
            None => FilePatch::from_texts(None, Some((path, new))),
        };
        patch.files.push(fp);
    }
    Ok(patch)
}

/// SEARCH/REPLACE blocks that turn `old` into `new` for one file, each SEARCH unique in `old`.
/// Blocks start from hunks with `context` lines of context, grown until their SEARCH is unique.
/// A block touching a last line without newline keeps that exactly (rendering adds the newline back).
pub fn blocks_from_texts(path: &str, old: &str, new: &str, context: usize) -> Vec<EditBlock> {
    let old_lines: Vec<&str> = old.split_inclusive('\n').collect();
    let new_lines: Vec<&str> = new.split_inclusive('\n').collect();
    let hunks = crate::swe::diff::diff_hunks(old, new, context);
    let mut blocks = Vec::new();
    for h in hunks {
        // Old range [o0, o1), new range [n0, n1) of the hunk (0-based).
        let o0 = if h.old_lines == 0 {
            h.old_start
        } else {
            h.old_start - 1
        };
        let n0 = if h.new_lines == 0 {
            h.new_start
        } else {
            h.new_start - 1
        };
        let (mut a, mut b) = (o0, o0 + h.old_lines);
        let (mut c, mut d) = (n0, n0 + h.new_lines);
        loop {
            let search: String = old_lines[a..b].concat();
            let unique = !search.trim().is_empty() && old.matches(&search).count() == 1;
            let can_grow = a > 0 || b < old_lines.len();
            if unique || !can_grow {
                blocks.push(EditBlock {
                    path: path.to_string(),
                    search,
                    replace: new_lines[c..d].concat(),
                });
                break;
            }
            if a > 0 {
                a -= 1;
                c -= 1;
            }
            if b < old_lines.len() {
                b += 1;
                d += 1;
            }
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_blocks_in_free_text_and_applies() {
        let answer = "Reasoning...\n```python\n### pkg/m.py\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n>>>>>>> REPLACE\n```\nand\n<<<<<<< SEARCH\nX = 1\n=======\nX = 2\n>>>>>>> REPLACE\n<<<<<<< SEARCH\nunterminated\n";
        let blocks = parse_blocks(answer);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].path, "pkg/m.py");
        let files = BTreeMap::from([(
            "pkg/m.py".to_string(),
            "X = 1\ndef add(a, b):\n    return a - b\n".to_string(),
        )]);
        let out = apply_blocks(&files, &blocks).unwrap();
        assert_eq!(out["pkg/m.py"], "X = 2\ndef add(a, b):\n    return a + b\n");
        let bad = vec![EditBlock {
            path: "pkg/m.py".into(),
            search: "nope\n".into(),
            replace: "x\n".into(),
        }];
        assert_eq!(
            apply_blocks(&files, &bad).unwrap_err().to_string(),
            "block 1: SEARCH text not found verbatim in pkg/m.py"
        );
    }

    #[test]
    fn blocks_from_texts_reproduce_the_new_text() {
        let old = "a\nx\nb\nx\nc\n";
        let new = "a\nx\nb\ny\nc\nd";
        let blocks = blocks_from_texts("f", old, new, 0);
        let files = BTreeMap::from([("f".to_string(), old.to_string())]);
        let out = apply_blocks(&files, &blocks).unwrap();
        assert_eq!(out["f"], new);
    }
}
