//! The answer grammar of the edit subtask, for constrained decoding: one SEARCH/REPLACE block
//! whose header names a shown file and whose SEARCH part is a run of consecutive lines of one shown
//! window of that file (so the edit always applies); the REPLACE part is free. Near the end of the
//! budget the block is closed.

use std::sync::Arc;

use crate::model::constraint::{Allowed, Mask};
use crate::model::token_trie::{CharState, VocabIndex};
use crate::swe::edit::fence_lang;
use crate::swe::grammar::AnswerState;
use crate::swe::reward::Window;

const SEARCH: &str = "<<<<<<< SEARCH";
const DIVIDER: &str = "=======";
const REPLACE: &str = ">>>>>>> REPLACE";
const FENCE: &str = "```";

/// Tokens that closing an open REPLACE part takes at most (`\n>>>>>>> REPLACE\n```).
const CLOSE_TOKENS: usize = 12;

/// One SEARCH/REPLACE block over the shown windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditGrammar {
    /// (path, lines without line ends) of every shown window.
    pub windows: Vec<(String, Vec<String>)>,
    /// Tokens kept for the answer: with fewer left inside the chain of thought, `</think>` is forced.
    pub reserve: usize,
}

/// The line starts that end a REPLACE part or make its line illegal.
const MARKERS: [&str; 4] = ["<<<<<<<", DIVIDER, ">>>>>>>", FENCE];

/// Characters of an unfinished REPLACE line that can still matter: past them the line can neither
/// become [`REPLACE`] nor a marker, so only whether it is settled counts.
const REPLACE_KEEP: usize = REPLACE.len() + 1;

/// Whether a REPLACE line would end the block or start another part.
fn marker_like(line: &str) -> bool {
    MARKERS.iter().any(|m| line.starts_with(m))
}

/// Whether an unfinished REPLACE line stays allowed whatever characters other than a line end
/// follow: it is neither a marker nor on the way to one (nor to [`REPLACE`]).
fn settled(rest: &str) -> bool {
    MARKERS
        .iter()
        .all(|m| !m.starts_with(rest) && !rest.starts_with(m))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    /// Before the newline that follows `</think>`.
    Start,
    Fence,
    Header,
    SearchMark,
    /// Candidate (window, next line index) positions of the SEARCH lines so far, and their count.
    Search(Arc<Vec<(usize, usize)>>, usize),
    Replace,
    Close,
}

impl EditGrammar {
    /// The grammar of an edit record's shown windows (`None` when it shows none).
    pub fn new(windows: &[Window], reserve: usize) -> Option<Self> {
        let windows: Vec<(String, Vec<String>)> = windows
            .iter()
            .map(|w| {
                (
                    w.path.clone(),
                    w.text.lines().map(str::to_string).collect::<Vec<_>>(),
                )
            })
            .filter(|(_, l)| !l.is_empty())
            .collect();
        (!windows.is_empty()).then_some(Self { windows, reserve })
    }

    fn fences(&self) -> impl Iterator<Item = String> + '_ {
        self.windows
            .iter()
            .map(|(p, _)| format!("{FENCE}{}", fence_lang(p)))
    }

    fn headers(&self) -> impl Iterator<Item = String> + '_ {
        self.windows.iter().map(|(p, _)| format!("### {p}"))
    }

    /// The state after one more complete line, or `None` when the line is not allowed.
    fn feed(&self, part: &Part, path: &mut String, line: &str) -> Option<Part> {
        Some(match part {
            Part::Start => line.is_empty().then_some(Part::Fence)?,
            Part::Fence => self.fences().any(|f| f == line).then_some(Part::Header)?,
            Part::Header => {
                let p = line.strip_prefix("### ")?;
                self.windows.iter().any(|(w, _)| w == p).then_some(())?;
                *path = p.to_string();
                Part::SearchMark
            }
            Part::SearchMark => (line == SEARCH).then(|| {
                let all = self
                    .windows
                    .iter()
                    .enumerate()
                    .filter(|(_, (p, _))| p == path)
                    .flat_map(|(i, (_, l))| (0..l.len()).map(move |k| (i, k)))
                    .collect();
                Part::Search(Arc::new(all), 0)
            })?,
            Part::Search(cands, n) => {
                if line == DIVIDER {
                    return (*n > 0).then_some(Part::Replace);
                }
                let next: Vec<(usize, usize)> = cands
                    .iter()
                    .filter(|&&(w, k)| self.windows[w].1.get(k).is_some_and(|l| l == line))
                    .map(|&(w, k)| (w, k + 1))
                    .collect();
                (!next.is_empty()).then_some(Part::Search(Arc::new(next), n + 1))?
            }
            Part::Replace => {
                if line == REPLACE {
                    Part::Close
                } else if marker_like(line) {
                    return None;
                } else {
                    Part::Replace
                }
            }
            Part::Close => return None,
        })
    }

    /// Whether `rest` (an unfinished line) can still become an allowed line.
    fn partial_ok(&self, part: &Part, rest: &str) -> bool {
        match part {
            Part::Start => rest.is_empty(),
            Part::Fence => self.fences().any(|f| f.starts_with(rest)),
            Part::Header => self.headers().any(|h| h.starts_with(rest)),
            Part::SearchMark => SEARCH.starts_with(rest),
            Part::Search(cands, n) => {
                (*n > 0 && DIVIDER.starts_with(rest))
                    || cands.iter().any(|&(w, k)| {
                        self.windows[w]
                            .1
                            .get(k)
                            .is_some_and(|l| l.starts_with(rest))
                    })
            }
            Part::Replace => REPLACE.starts_with(rest) || !marker_like(rest),
            Part::Close => FENCE.starts_with(rest),
        }
    }

    /// Parses the complete lines of `answer` (text after `</think>`): the state, the file named so
    /// far and the unfinished last line, or `None` when some line is not allowed.
    fn parse<'a>(&self, answer: &'a str) -> Option<(Part, String, &'a str)> {
        self.feed_all(Part::Start, String::new(), answer)
    }

    fn feed_all<'a>(
        &self,
        mut part: Part,
        mut path: String,
        text: &'a str,
    ) -> Option<(Part, String, &'a str)> {
        let mut rest = text;
        while let Some(i) = rest.find('\n') {
            part = self.feed(&part, &mut path, &rest[..i])?;
            rest = &rest[i + 1..];
        }
        Some((part, path, rest))
    }

    /// Whether `answer` (after `</think>`) can be extended into a whole block.
    pub fn prefix_ok(&self, answer: &str) -> bool {
        self.parse(answer)
            .is_some_and(|(part, _, rest)| self.partial_ok(&part, rest))
    }

    /// Whether `answer` (after `</think>`) is a whole block.
    pub fn complete(&self, answer: &str) -> bool {
        self.parse(answer)
            .is_some_and(|(part, _, rest)| part == Part::Close && rest == FENCE)
    }

    /// The mask inside the answer; with at most twice [`CLOSE_TOKENS`] left between SEARCH lines,
    /// only the divider; with at most [`CLOSE_TOKENS`] left in the REPLACE part, only pieces that
    /// close the block.
    pub fn allowed_in_answer(
        &self,
        answer: &str,
        remaining: usize,
        pieces: &[Option<String>],
    ) -> Allowed {
        let complete = self.complete(answer);
        let parsed = self.parse(answer);
        let close = format!("{REPLACE}\n{FENCE}");
        let ok = |p: &str| -> bool {
            let Some((part, path, rest)) = &parsed else {
                return false;
            };
            if remaining <= CLOSE_TOKENS && *part == Part::Replace {
                return if close.starts_with(*rest) {
                    close.starts_with(&format!("{rest}{p}"))
                } else {
                    p.strip_prefix('\n').is_some_and(|q| close.starts_with(q))
                };
            }
            let tail = format!("{rest}{p}");
            if remaining <= 2 * CLOSE_TOKENS
                && matches!(part, Part::Search(_, n) if *n > 0)
                && rest.is_empty()
            {
                // Low budget between SEARCH lines: the divider comes next.
                let div = format!("{DIVIDER}\n");
                if !(div.starts_with(&tail) || tail.starts_with(&div)) {
                    return false;
                }
            }
            self.feed_all(part.clone(), path.clone(), &tail)
                .is_some_and(|(part, _, rest)| self.partial_ok(&part, rest))
        };
        Allowed {
            pieces: pieces
                .iter()
                .map(|p| p.as_deref().is_some_and(|p| !complete && ok(p)))
                .collect(),
            stop: complete,
        }
    }
}

/// The incremental state of an [`EditGrammar`] answer: the part, the file named and the
/// unfinished line.
#[derive(Clone, Debug)]
pub struct EditState {
    g: Arc<EditGrammar>,
    part: Part,
    path: String,
    rest: String,
}

impl EditState {
    /// The empty answer of `g`.
    pub fn new(g: Arc<EditGrammar>) -> Self {
        Self {
            g,
            part: Part::Start,
            path: String::new(),
            rest: String::new(),
        }
    }

    /// Whether the answer so far is a whole block.
    pub fn complete(&self) -> bool {
        self.part == Part::Close && self.rest == FENCE
    }
}

impl CharState for EditState {
    fn push(&self, c: char) -> Option<Self> {
        let mut s = self.clone();
        if c == '\n' {
            s.part = self.g.feed(&self.part, &mut s.path, &self.rest)?;
            s.rest.clear();
        } else if self.part != Part::Replace || self.rest.len() < REPLACE_KEEP {
            s.rest.push(c);
        }
        // `partial_ok` only shrinks as the line grows: a dead line stays dead.
        s.accepts().then_some(s)
    }

    fn accepts(&self) -> bool {
        self.g.partial_ok(&self.part, &self.rest)
    }
}

/// An edit state that must first spell the divider (low budget between SEARCH lines).
#[derive(Clone)]
struct DividerFirst {
    inner: EditState,
    at: usize,
}

impl CharState for DividerFirst {
    fn push(&self, c: char) -> Option<Self> {
        let div = "=======\n";
        let at = if self.at < div.len() {
            div[self.at..].starts_with(c).then_some(self.at + 1)?
        } else {
            self.at
        };
        Some(Self {
            inner: self.inner.push(c)?,
            at,
        })
    }

    fn accepts(&self) -> bool {
        self.inner.accepts()
    }
}

impl AnswerState for EditState {
    fn answer_mask(&self, remaining: usize, vocab: &VocabIndex) -> Mask {
        let complete = self.complete();
        let mut pieces = vocab.empty();
        if complete {
            return Mask { pieces, stop: true };
        }
        if remaining <= CLOSE_TOKENS && self.part == Part::Replace {
            let close = format!("{REPLACE}\n{FENCE}");
            match close.strip_prefix(self.rest.as_str()) {
                Some(more) => vocab.trie.prefixes_of(more, 0, &mut pieces),
                None => vocab
                    .trie
                    .prefixes_of(&format!("\n{close}"), 1, &mut pieces),
            };
        } else if remaining <= 2 * CLOSE_TOKENS
            && matches!(self.part, Part::Search(_, n) if n > 0)
            && self.rest.is_empty()
        {
            let gate = DividerFirst {
                inner: self.clone(),
                at: 0,
            };
            vocab.trie.walk(&gate, &mut pieces);
        } else if self.part == Part::Replace && settled(&self.rest) {
            pieces = vocab.line_step(self);
        } else {
            vocab.trie.walk(self, &mut pieces);
        }
        Mask {
            pieces,
            stop: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grammar() -> EditGrammar {
        let w = |path: &str, start_line, text: &str| Window {
            path: path.into(),
            start_line,
            text: text.into(),
        };
        EditGrammar::new(
            &[
                w("pkg/a.py", 10, "def f(x):\n    y = x + 1\n    return y\n"),
                w("pkg/b.rs", 1, "fn g() -> u8 {\n    1\n}\n"),
            ],
            32,
        )
        .expect("windows")
    }

    const GOOD: &str = "\n```python\n### pkg/a.py\n<<<<<<< SEARCH\n    y = x + 1\n    return y\n=======\n    y = x - 1\n    return y\n>>>>>>> REPLACE\n```";

    #[test]
    fn a_whole_block_over_consecutive_shown_lines_is_accepted() {
        let g = grammar();
        assert!(g.complete(GOOD));
        for k in 0..GOOD.len() {
            assert!(g.prefix_ok(&GOOD[..k]), "prefix {:?}", &GOOD[..k]);
            assert!(!g.complete(&GOOD[..k]));
        }
        let applied = crate::swe::answer::parse_edit(GOOD);
        assert_eq!(applied.len(), 1);
    }

    #[test]
    fn search_lines_must_be_shown_consecutive_lines_of_the_named_file() {
        let g = grammar();
        let head = "\n```python\n### pkg/a.py\n<<<<<<< SEARCH\n";
        assert!(
            !g.prefix_ok(&format!("{head}    return y\n    y = x + 1\n")),
            "out of order"
        );
        assert!(
            !g.prefix_ok(&format!("{head}def f(x):\n    return y\n")),
            "a gap"
        );
        assert!(
            !g.prefix_ok(&format!("{head}    1\n")),
            "a line of another file"
        );
        assert!(!g.prefix_ok(&format!("{head}=======\n")), "an empty SEARCH");
        assert!(
            !g.prefix_ok("\n```python\n### pkg/c.py\n"),
            "a file not shown"
        );
        assert!(!g.prefix_ok("\n```java\n"), "a fence no shown file uses");
        assert!(!g.prefix_ok("x"), "text before the block");
        assert!(g.prefix_ok("\n```rust\n### pkg/b.rs\n<<<<<<< SEARCH\n    1\n=======\n"));
        assert!(!g.prefix_ok(&format!("{GOOD}\n")), "text after the block");
    }

    #[test]
    fn near_the_end_of_the_budget_the_replace_part_is_closed() {
        let g = grammar();
        let open = "\n```python\n### pkg/a.py\n<<<<<<< SEARCH\n    return y\n=======\n    return";
        let pieces: Vec<Option<String>> = [" y", "\n", "\n>>>>>>>", " REPLACE", "\n```", "x"]
            .iter()
            .map(|s| Some(s.to_string()))
            .collect();
        let names = |a: &Allowed| -> Vec<&str> {
            pieces
                .iter()
                .zip(&a.pieces)
                .filter(|(_, &b)| b)
                .filter_map(|(p, _)| p.as_deref())
                .collect()
        };
        assert_eq!(
            names(&g.allowed_in_answer(open, 40, &pieces)),
            vec![" y", "\n", "\n>>>>>>>", " REPLACE", "x"]
        );
        assert_eq!(
            names(&g.allowed_in_answer(open, 4, &pieces)),
            vec!["\n", "\n>>>>>>>"]
        );
        let marked = format!("{open}\n>>>>>>>");
        assert_eq!(
            names(&g.allowed_in_answer(&marked, 3, &pieces)),
            vec![" REPLACE"]
        );
        let closed = format!("{open}\n>>>>>>> REPLACE");
        assert_eq!(
            names(&g.allowed_in_answer(&closed, 2, &pieces)),
            vec!["\n", "\n```"]
        );
        let search = "\n```python\n### pkg/a.py\n<<<<<<< SEARCH\n    y = x + 1\n";
        let more: Vec<Option<String>> = ["    return y\n", "=======\n", "==="]
            .iter()
            .map(|s| Some(s.to_string()))
            .collect();
        assert_eq!(
            g.allowed_in_answer(search, 40, &more).pieces,
            vec![true, true, true]
        );
        assert_eq!(
            g.allowed_in_answer(search, 20, &more).pieces,
            vec![false, true, true]
        );
        let done = g.allowed_in_answer(&format!("{closed}\n```"), 1, &pieces);
        assert!(done.stop && names(&done).is_empty());
    }
    #[test]
    fn long_and_marker_like_replace_lines_get_the_rescans_mask() {
        let g = Arc::new(grammar());
        let pieces: Vec<Option<String>> = [
            "a",
            " ",
            "x = 1",
            "\n",
            "\n>>>>>>>",
            ">>>",
            ">>>>>>> REPLACE\n```",
            " REPLACE",
            "=",
            "=======",
            "<<<<<<<",
            "```",
            "\n```",
            "é",
            "long line text ",
            "x\ny",
            "\n\n",
        ]
        .iter()
        .map(|s| Some(s.to_string()))
        .chain([None])
        .collect();
        let vocab = VocabIndex::new(pieces.clone());
        let open = "\n```python\n### pkg/a.py\n<<<<<<< SEARCH\n    return y\n=======\n";
        let long = "    z = some_function(with, many, arguments) + another_one(é)".repeat(3);
        for body in [
            long.as_str(),
            "x >>>>>>> REPLACE",
            ">>>>>>> REPLACE",
            ">>",
            "=====",
            "``",
            "",
            "ok\n>>>",
        ] {
            let text = format!("{open}{body}");
            let mut state = Some(EditState::new(g.clone()));
            for c in text.chars() {
                state = state.and_then(|s| s.push(c));
            }
            let state = state.expect("an allowed prefix");
            for remaining in [100, 30, 5] {
                let want = g.allowed_in_answer(&text, remaining, &pieces);
                let got = state.answer_mask(remaining, &vocab);
                let got: Vec<bool> = (0..pieces.len() as u32)
                    .map(|i| got.pieces.contains(i))
                    .collect();
                assert_eq!(got, want.pieces, "{body:?} with {remaining} left");
            }
        }
        assert!(settled("    z") && !settled(">>") && !settled("") && !settled("=======x"));
    }
}
