//! Answer grammars of the subtasks, for constrained decoding: the chain of thought is free, the
//! final answer after `</think>` may only name what the prompt showed (tree paths, skeleton
//! definitions, shown line numbers; SEARCH lines of shown windows, see
//! [`crate::swe::edit_grammar`]) in the answer format the prompt asks for. When the budget runs
//! low inside the chain of thought, `</think>` is forced so an answer always fits.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::model::constraint::{Allowed, ConstraintState, Mask, TokenConstraint};
use crate::model::token_trie::{feed, CharState, VocabIndex};
use crate::swe::edit_grammar::EditGrammar;
use crate::swe::subtask::{Subtask, SubtaskRecord};

/// End of the chain of thought.
pub const THINK_END: &str = "</think>";
/// What opens the answer block right after `</think>`.
pub const OPEN: &str = "\n```\n";
/// What closes the answer block.
pub const CLOSE: &str = "```";

/// A line-oriented answer grammar: `OPEN (LINE "\n")+ CLOSE`; a group starts with a path line,
/// then item lines from a finite set or of the form `key: identifier`; blank lines end groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnswerGrammar {
    /// Paths that may head a group.
    pub paths: BTreeSet<String>,
    /// Item lines allowed verbatim under a path.
    pub lines: BTreeSet<String>,
    /// Line keys (`"function: "`) followed by a dotted identifier.
    pub named: Vec<String>,
    /// Whether blank lines (group separators) are allowed.
    pub blank: bool,
    /// Whether every group needs at least one item line under its path.
    pub need_item: bool,
    /// Most answer lines.
    pub max_lines: usize,
    /// Tokens kept for the answer: with fewer left inside the chain of thought, `</think>` is forced.
    pub reserve: usize,
}

fn ident_prefix(s: &str) -> bool {
    s.chars().enumerate().all(|(i, c)| {
        c == '_' || c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || c == '.'))
    })
}

/// Tokens kept for a subtask's answer out of a budget of `max_new_tokens`.
pub fn reserve_for(subtask: Subtask, max_new_tokens: usize) -> usize {
    if subtask == Subtask::Edit {
        (max_new_tokens * 2 / 3).min(96)
    } else {
        (max_new_tokens / 2).min(40)
    }
}

/// The constraint of a record's answer (`None` with `on` false, or when the prompt showed nothing
/// to name); with `ground`, quotes in a localization thought must copy the prompt, and with
/// `faithful` the answer may only name what the thought quoted ([`crate::swe::grounding`]).
pub fn constraint_for(
    rec: &SubtaskRecord,
    max_new_tokens: usize,
    on: bool,
    ground: bool,
    faithful: bool,
) -> Option<std::sync::Arc<dyn TokenConstraint>> {
    if !on {
        return None;
    }
    let reserve = reserve_for(rec.subtask, max_new_tokens);
    if rec.subtask == Subtask::Edit {
        // Edit thoughts quote the code they are about to write, which the prompt never showed.
        return EditGrammar::new(&rec.shown.windows, reserve)
            .map(|g| std::sync::Arc::new(g) as std::sync::Arc<dyn TokenConstraint>);
    }
    let g = AnswerGrammar::for_record(rec, reserve)?;
    if !ground {
        return Some(std::sync::Arc::new(g));
    }
    Some(std::sync::Arc::new(
        crate::swe::grounding::GroundedThought {
            faithful: faithful
                .then(|| crate::swe::grounding::Faithful::of(rec, g.clone()))
                .flatten(),
            inner: std::sync::Arc::new(g),
            ground: crate::swe::grounding::ground_of(rec),
        },
    ))
}

impl AnswerGrammar {
    /// A file-list answer: up to `max_lines` distinct paths out of `paths`.
    pub fn files<S: Into<String>>(
        paths: impl IntoIterator<Item = S>,
        max_lines: usize,
        reserve: usize,
    ) -> Self {
        AnswerGrammar {
            paths: paths.into_iter().map(Into::into).collect(),
            lines: BTreeSet::new(),
            named: Vec::new(),
            blank: false,
            need_item: false,
            max_lines,
            reserve,
        }
    }

    /// The grammar of a localization record's answer; `None` for edits (left free).
    pub fn for_record(rec: &SubtaskRecord, reserve: usize) -> Option<Self> {
        let mut g = AnswerGrammar {
            paths: BTreeSet::new(),
            lines: BTreeSet::new(),
            named: Vec::new(),
            blank: true,
            need_item: true,
            max_lines: 24,
            reserve,
        };
        match rec.subtask {
            Subtask::File => g = Self::files(rec.shown.files.iter().cloned(), 5, reserve),
            Subtask::Function => {
                g.paths.extend(rec.shown.files.iter().cloned());
                for f in &rec.shown.functions {
                    g.paths.insert(f.path.clone());
                    g.lines.insert(format!("{}: {}", f.kind.word(), f.name));
                }
            }
            Subtask::Line => {
                for w in &rec.shown.windows {
                    g.paths.insert(w.path.clone());
                    for n in w.start_line..w.start_line + w.len() {
                        g.lines.insert(format!("line: {n}"));
                    }
                }
                g.named = ["function: ", "method: ", "class: "]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            }
            Subtask::Edit => return None,
        }
        (!g.paths.is_empty()).then_some(g)
    }

    /// Whether `line` may come next; `in_group`: a path heads the current group.
    fn line_ok(&self, line: &str, in_group: bool) -> bool {
        if line.is_empty() {
            return self.blank && in_group;
        }
        if self.paths.contains(line) {
            return true;
        }
        if !in_group {
            return false;
        }
        self.lines.contains(line)
            || self.named.iter().any(|k| {
                line.strip_prefix(k.as_str())
                    .is_some_and(|rest| !rest.is_empty() && ident_prefix(rest))
            })
    }

    /// Whether `part` can grow into a line; `may_head`: a path (or blank line) may come now.
    fn line_prefix_ok(&self, part: &str, in_group: bool, may_head: bool) -> bool {
        let starts = |set: &BTreeSet<String>| {
            set.range(part.to_string()..)
                .next()
                .is_some_and(|l| l.starts_with(part))
        };
        if part.is_empty() || (may_head && starts(&self.paths)) {
            return true;
        }
        in_group
            && (starts(&self.lines)
                || self.named.iter().any(|k| {
                    k.starts_with(part) || part.strip_prefix(k.as_str()).is_some_and(ident_prefix)
                }))
    }

    /// Whether `answer` (the text after `</think>`) can still be completed; with `complete`, whether
    /// it is a whole answer.
    fn check(&self, answer: &str, complete: bool) -> bool {
        let Some(body) = answer.strip_prefix(OPEN) else {
            return !complete && OPEN.starts_with(answer);
        };
        let mut n = 0usize;
        let mut in_group = false;
        let mut items = 0usize;
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut rest = body;
        // Whether the current group may end here.
        let group_done = |in_group: bool, items: usize| !in_group || !self.need_item || items > 0;
        while let Some(i) = rest.find('\n') {
            let line = &rest[..i];
            let heads = line.is_empty() || self.paths.contains(line);
            if n >= self.max_lines
                || !self.line_ok(line, in_group)
                || (heads && !group_done(in_group, items))
                || (!line.is_empty() && !seen.insert(line))
            {
                return false;
            }
            n += 1;
            items = if heads { 0 } else { items + 1 };
            in_group = !line.is_empty();
            rest = &rest[i + 1..];
        }
        // A block may close after any complete line but a leading or doubled blank one, and only
        // once the last group has an item (where items are needed).
        let closable = n > 0 && group_done(in_group, items);
        if complete {
            return rest == CLOSE && closable;
        }
        (closable && CLOSE.starts_with(rest))
            || (n < self.max_lines
                && !seen.contains(rest)
                && self.line_prefix_ok(rest, in_group, group_done(in_group, items)))
    }

    /// Whether `answer` (after `</think>`) can be extended into a whole answer.
    pub fn prefix_ok(&self, answer: &str) -> bool {
        self.check(answer, false)
    }

    /// Whether `answer` (after `</think>`) is a whole answer.
    pub fn complete(&self, answer: &str) -> bool {
        self.check(answer, true)
    }
}

impl AnswerGrammar {
    /// The mask inside the answer: pieces that keep it completable; stop once it is whole; with
    /// `remaining` tokens only enough for the closing fence, only that fence.
    pub fn allowed_in_answer(
        &self,
        answer: &str,
        remaining: usize,
        pieces: &[Option<String>],
    ) -> Allowed {
        let complete = self.complete(answer);
        // Budget forcing: when the answer could end here and only the closing fence (plus the
        // stop token and a small margin) still fits, only pieces of that fence may come.
        let close = ["", "`", "``", CLOSE, "\n```"]
            .into_iter()
            .find(|c| self.complete(&format!("{answer}{c}")));
        if let Some(c) = close.filter(|c| !c.is_empty() && remaining <= c.len() + 2) {
            return Allowed {
                pieces: pieces
                    .iter()
                    .map(|p| {
                        p.as_deref()
                            .is_some_and(|p| !p.is_empty() && c.starts_with(p))
                    })
                    .collect(),
                stop: false,
            };
        }
        Allowed {
            pieces: pieces
                .iter()
                .map(|p| {
                    p.as_deref()
                        .is_some_and(|p| !complete && self.prefix_ok(&format!("{answer}{p}")))
                })
                .collect(),
            stop: complete,
        }
    }
}

impl TokenConstraint for AnswerGrammar {
    fn allowed(&self, text: &str, remaining: usize, pieces: &[Option<String>]) -> Option<Allowed> {
        Some(think_then_answer(
            text,
            remaining,
            self.reserve,
            pieces,
            &|a| self.prefix_ok(a),
            &|a| self.allowed_in_answer(a, remaining, pieces),
        ))
    }

    fn start(&self) -> Option<Box<dyn ConstraintState>> {
        Some(Box::new(Incremental::new(
            LinesState::new(Arc::new(self.clone())),
            self.reserve,
        )))
    }
}

impl TokenConstraint for EditGrammar {
    fn allowed(&self, text: &str, remaining: usize, pieces: &[Option<String>]) -> Option<Allowed> {
        Some(think_then_answer(
            text,
            remaining,
            self.reserve,
            pieces,
            &|a| self.prefix_ok(a),
            &|a| self.allowed_in_answer(a, remaining, pieces),
        ))
    }

    fn start(&self) -> Option<Box<dyn ConstraintState>> {
        Some(Box::new(Incremental::new(
            crate::swe::edit_grammar::EditState::new(Arc::new(self.clone())),
            self.reserve,
        )))
    }
}

/// The shared shape of every answer grammar: a free chain of thought that may not stop, `</think>`
/// forced once only `reserve` tokens are left, then the answer's own mask.
fn think_then_answer(
    text: &str,
    remaining: usize,
    reserve: usize,
    pieces: &[Option<String>],
    prefix_ok: &dyn Fn(&str) -> bool,
    in_answer: &dyn Fn(&str) -> Allowed,
) -> Allowed {
    if let Some(i) = text.find(THINK_END) {
        return in_answer(&text[i + THINK_END.len()..]);
    }
    // Pieces that close the thought must leave a completable answer behind.
    let after_ok = |t: &str| {
        t.find(THINK_END)
            .is_none_or(|i| prefix_ok(&t[i + THINK_END.len()..]))
    };
    if remaining > reserve {
        return Allowed {
            pieces: pieces
                .iter()
                .map(|p| {
                    p.as_deref()
                        .is_some_and(|p| !p.contains('>') || after_ok(&format!("{text}{p}")))
                })
                .collect(),
            stop: false,
        };
    }
    // Budget forcing: only pieces that continue `</think>` (possibly into the answer).
    let k = (1..THINK_END.len())
        .rev()
        .find(|&k| text.ends_with(&THINK_END[..k]))
        .unwrap_or(0);
    let need = &THINK_END[k..];
    Allowed {
        pieces: pieces
            .iter()
            .map(|p| {
                p.as_deref().is_some_and(|p| {
                    need.starts_with(p) || p.strip_prefix(need).is_some_and(prefix_ok)
                })
            })
            .collect(),
        stop: false,
    }
}

/// An answer grammar's character state that also knows its own mask (see
/// [`AnswerGrammar::allowed_in_answer`]).
pub trait AnswerState: CharState + std::fmt::Debug + Send {
    /// The mask inside the answer, this state being the answer so far.
    fn answer_mask(&self, remaining: usize, vocab: &VocabIndex) -> Mask;
}

/// The lines parsed so far of an [`AnswerGrammar`] answer (the loop state of its check).
#[derive(Clone, Debug, Default)]
struct LinesDone {
    n: usize,
    in_group: bool,
    items: usize,
    seen: BTreeSet<String>,
}

/// The incremental state of an [`AnswerGrammar`] answer: the opening fence matched so far, the
/// complete lines and the unfinished one.
#[derive(Clone, Debug)]
pub struct LinesState {
    g: Arc<AnswerGrammar>,
    opened: usize,
    done: Arc<LinesDone>,
    rest: String,
}

impl LinesState {
    /// The empty answer of `g`.
    pub fn new(g: Arc<AnswerGrammar>) -> Self {
        Self {
            g,
            opened: 0,
            done: Arc::new(LinesDone::default()),
            rest: String::new(),
        }
    }

    fn group_done(&self) -> bool {
        !self.done.in_group || !self.g.need_item || self.done.items > 0
    }

    fn closable(&self) -> bool {
        self.done.n > 0 && self.group_done()
    }

    /// Whether the answer so far is whole.
    pub fn complete(&self) -> bool {
        self.opened == OPEN.len() && self.rest == CLOSE && self.closable()
    }

    /// Whether `rest` can still grow into a line or the close, ignoring repeats (a repeated
    /// line may still grow into a new one).
    fn alive(&self) -> bool {
        (self.closable() && CLOSE.starts_with(&self.rest))
            || (self.done.n < self.g.max_lines
                && self
                    .g
                    .line_prefix_ok(&self.rest, self.done.in_group, self.group_done()))
    }

    fn end_line(&self) -> Option<Self> {
        let (g, d, line) = (&self.g, &self.done, self.rest.as_str());
        let heads = line.is_empty() || g.paths.contains(line);
        if d.n >= g.max_lines
            || !g.line_ok(line, d.in_group)
            || (heads && !self.group_done())
            || (!line.is_empty() && d.seen.contains(line))
        {
            return None;
        }
        let mut done = (**d).clone();
        done.n += 1;
        done.items = if heads { 0 } else { d.items + 1 };
        done.in_group = !line.is_empty();
        if !line.is_empty() {
            done.seen.insert(line.to_string());
        }
        Some(Self {
            g: g.clone(),
            opened: self.opened,
            done: Arc::new(done),
            rest: String::new(),
        })
    }
}

impl CharState for LinesState {
    fn push(&self, c: char) -> Option<Self> {
        if self.opened < OPEN.len() {
            let mut s = self.clone();
            s.opened += OPEN[self.opened..].starts_with(c).then_some(1)?;
            return Some(s);
        }
        if c == '\n' {
            return self.end_line();
        }
        let mut s = self.clone();
        s.rest.push(c);
        s.alive().then_some(s)
    }

    fn accepts(&self) -> bool {
        if self.opened < OPEN.len() {
            return true;
        }
        (self.closable() && CLOSE.starts_with(&self.rest))
            || (self.done.n < self.g.max_lines
                && !self.done.seen.contains(&self.rest)
                && self
                    .g
                    .line_prefix_ok(&self.rest, self.done.in_group, self.group_done()))
    }
}

impl AnswerState for LinesState {
    fn answer_mask(&self, remaining: usize, vocab: &VocabIndex) -> Mask {
        let complete = self.complete();
        let close = ["", "`", "``", CLOSE, "\n```"]
            .into_iter()
            .find(|c| feed(self, c).is_some_and(|s| s.complete()));
        let mut pieces = vocab.empty();
        if let Some(c) = close.filter(|c| !c.is_empty() && remaining <= c.len() + 2) {
            vocab.trie.prefixes_of(c, 1, &mut pieces);
            return Mask {
                pieces,
                stop: false,
            };
        }
        if !complete {
            vocab.trie.walk(self, &mut pieces);
        }
        Mask {
            pieces,
            stop: complete,
        }
    }
}

/// The next state of the longest suffix of the text that starts `</think>` (its only `<` is its
/// first character, so no shorter match needs remembering).
pub fn think_step(k: usize, c: char) -> usize {
    if k < THINK_END.len() && THINK_END[k..].starts_with(c) {
        k + 1
    } else {
        usize::from(c == '<')
    }
}

/// The character state of a thought followed by an answer: how much of `</think>` the thought
/// ends with, then the answer's own state.
#[derive(Clone, Debug)]
pub struct Think<A> {
    k: usize,
    answer: Option<A>,
    fresh: A,
}

impl<A: Clone> Think<A> {
    /// An empty thought whose answer starts as `fresh`.
    pub fn new(fresh: A) -> Self {
        Self {
            k: 0,
            answer: None,
            fresh,
        }
    }

    /// Whether the thought is over.
    pub fn in_answer(&self) -> bool {
        self.answer.is_some()
    }
}

impl<A: CharState> CharState for Think<A> {
    fn push(&self, c: char) -> Option<Self> {
        let mut s = self.clone();
        match &self.answer {
            Some(a) => s.answer = Some(a.push(c)?),
            None => {
                s.k = think_step(self.k, c);
                if s.k == THINK_END.len() {
                    s.answer = Some(self.fresh.clone());
                }
            }
        }
        Some(s)
    }

    fn accepts(&self) -> bool {
        self.answer.as_ref().is_none_or(|a| a.accepts())
    }
}

/// [`think_then_answer`] on an incremental state.
fn think_mask<A: AnswerState + Clone>(
    s: &Think<A>,
    remaining: usize,
    reserve: usize,
    vocab: &VocabIndex,
) -> Mask {
    if let Some(a) = &s.answer {
        return a.answer_mask(remaining, vocab);
    }
    if remaining > reserve {
        return Mask {
            pieces: vocab.free_step(s),
            stop: false,
        };
    }
    // Budget forcing: pieces that continue `</think>`, possibly into the answer.
    let need = &THINK_END[s.k..];
    let mut pieces = vocab.empty();
    vocab.trie.prefixes_of(need, 0, &mut pieces);
    vocab.trie.walk_after(need, &s.fresh, &mut pieces);
    Mask {
        pieces,
        stop: false,
    }
}

/// The incremental state of a thought-then-answer grammar (no state once the text left it).
#[derive(Debug)]
pub struct Incremental<A> {
    state: Option<Think<A>>,
    reserve: usize,
}

impl<A: AnswerState + Clone> Incremental<A> {
    /// A fresh sequence whose answer starts as `fresh`.
    pub fn new(fresh: A, reserve: usize) -> Self {
        Self {
            state: Some(Think::new(fresh)),
            reserve,
        }
    }
}

impl<A: AnswerState + Clone> ConstraintState for Incremental<A> {
    fn advance(&mut self, piece: &str) {
        self.state = self.state.take().and_then(|s| feed(&s, piece));
    }

    fn mask(&self, remaining: usize, vocab: &VocabIndex) -> Option<Mask> {
        Some(match &self.state {
            Some(s) => think_mask(s, remaining, self.reserve, vocab),
            None => Mask {
                pieces: vocab.empty(),
                stop: false,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_grammar() -> AnswerGrammar {
        AnswerGrammar::files(["pkg/a.py", "pkg/ab.py", "setup.py"], 2, 4)
    }

    #[test]
    fn answer_prefixes_follow_the_shown_paths() {
        let g = file_grammar();
        for ok in [
            "",
            "\n`",
            "\n```\n",
            "\n```\npkg/a",
            "\n```\npkg/a.py\n",
            "\n```\npkg/a.py\n``",
        ] {
            assert!(g.prefix_ok(ok), "{ok:?}");
        }
        for bad in [
            "x",
            "\n```\nother/a.py",
            "\n```\n```",
            "\n```\npkg/a.pyx",
            "\n```\npkg/a.py\npkg/ab.py\nsetup.py\n",
            "\n```\npkg/a.py\n```x",
            "\n```\n\n",
        ] {
            assert!(!g.prefix_ok(bad), "{bad:?}");
        }
        assert!(g.complete("\n```\npkg/a.py\n```"));
        assert!(!g.complete("\n```\npkg/a.py\n"));
        assert!(!g.complete("\n```\n```"));
    }

    #[test]
    fn named_lines_take_identifiers_only() {
        let g = AnswerGrammar {
            paths: ["a.py".to_string()].into_iter().collect(),
            lines: ["line: 3".to_string()].into_iter().collect(),
            named: vec!["function: ".into()],
            blank: true,
            need_item: true,
            max_lines: 8,
            reserve: 4,
        };
        assert!(g.complete("\n```\na.py\nfunction: Shape.area\nline: 3\n\n```"));
        assert!(g.prefix_ok("\n```\na.py\nfunc"));
        assert!(!g.prefix_ok("\n```\na.py\nfunction: 9x"));
        assert!(!g.prefix_ok("\n```\na.py\nline: 4\n"));
        assert!(
            !g.complete("\n```\n\n```"),
            "an answer needs a non-blank line"
        );
        assert!(
            !g.prefix_ok("\n```\nline: 3\n"),
            "items need a path above them"
        );
        assert!(
            !g.prefix_ok("\n```\nfunction: f"),
            "items need a path above them"
        );
        assert!(
            !g.prefix_ok("\n```\na.py\n\nline: 3\n"),
            "a blank line ends the group"
        );
        assert!(
            !g.prefix_ok("\n```\na.py\nline: 3\n\na.py\n"),
            "no repeated lines"
        );
        assert!(!g.complete("\n```\na.py\n```"), "a group needs an item");
        assert!(!g.prefix_ok("\n```\na.py\n\n"), "a group needs an item");
        assert!(
            !g.prefix_ok("\n```\na.py\nline: 3\nline: 3\n"),
            "no repeated lines"
        );
        assert!(!g.prefix_ok("\n```\na.py\n\n\n"), "no doubled blank lines");
    }

    fn pieces(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn the_mask_frees_thinking_forces_the_close_and_stops_only_when_whole() {
        let g = file_grammar();
        let p = pieces(&[
            "</", "think", ">", "\n```\n", "pkg/", "a.py", "\n", "```", "zzz",
        ]);
        let free = g.allowed("<think>so", 50, &p).expect("always constrained");
        assert!(free.pieces.iter().all(|&b| b) && !free.stop);
        let forced = g.allowed("<think>so", 3, &p).expect("forced");
        let names = |a: &Allowed| -> Vec<&str> {
            p.iter()
                .zip(&a.pieces)
                .filter(|(_, &b)| b)
                .filter_map(|(s, _)| s.as_deref())
                .collect()
        };
        assert_eq!(names(&forced), vec!["</"]);
        assert_eq!(
            names(&g.allowed("<think>so</", 2, &p).expect("forced")),
            vec!["think"]
        );
        let ans = g
            .allowed("<think>so</think>\n```\n", 9, &p)
            .expect("answer");
        assert_eq!(names(&ans), vec!["pkg/"]);
        let after = g
            .allowed("<think>so</think>\n```\npkg/a.py\n", 9, &p)
            .expect("answer");
        assert_eq!(names(&after), vec!["pkg/", "```"]);
        assert!(!after.stop);
        let done = g
            .allowed("<think>so</think>\n```\npkg/a.py\n```", 9, &p)
            .expect("answer");
        assert!(done.stop && done.pieces.iter().all(|&b| !b));
        // Little budget left: an answer that could end now may only close.
        let short = g
            .allowed("<think>so</think>\n```\npkg/a.py\n", 5, &p)
            .expect("answer");
        assert_eq!(names(&short), vec!["```"]);
        let short = g
            .allowed("<think>so</think>\n```\npkg/a.py", 6, &p)
            .expect("answer");
        assert_eq!(names(&short), vec!["\n"]);
    }
}
