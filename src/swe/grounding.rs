//! Grounded chains of thought: inside the thought, text between backticks (a quoted name, call or
//! line of code) must be copied from what the prompt showed. A small model that writes "the
//! snippet runs `from pkg import money`" otherwise invents `pkg` and `money`; under this
//! constraint a quote can only continue the way some occurrence of it in the prompt continues, and
//! it starts and ends only where words of the prompt do, so a quoted name is the prompt's, whole,
//! or not written at all. Text outside quotes stays free, and
//! the answer after `</think>` keeps its own grammar.
//!
//! With `faithful` answers (as in Faithful Chain-of-Thought, where the answer follows from the
//! reasoning), a localization answer may only name the shown targets the thought quoted: a file
//! whose module name a quote mentions, a definition a quote names, a line whose code a quote
//! copies. A thought that quoted none of them leaves the whole answer grammar open.

use std::sync::Arc;

use crate::model::constraint::{Allowed, ConstraintState, Mask, TokenConstraint};
use crate::model::token_trie::VocabIndex;
use crate::swe::grammar::{AnswerGrammar, THINK_END};
use crate::swe::subtask::{Subtask, SubtaskRecord};

/// Wraps an answer grammar: quotes in the thought must be substrings of `ground`.
#[derive(Debug)]
pub struct GroundedThought {
    /// The answer grammar (and the thought's budget forcing).
    pub inner: Arc<dyn TokenConstraint>,
    /// What quotes may copy from: the prompt, plus qualified names of shown definitions.
    pub ground: String,
    /// With faithful answers: the localization grammar and what each answer line names.
    pub faithful: Option<Faithful>,
}

/// How a quote names an answer line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Naming {
    /// A quote holds this identifier (a module name, a definition's last name).
    Word(String),
    /// A quote copies part of this line of code.
    Code(String),
}

/// The answer lines of a localization grammar with what names them.
#[derive(Clone, Debug)]
pub struct Faithful {
    /// The full answer grammar.
    pub grammar: AnswerGrammar,
    /// (path, how a quote names it).
    pub paths: Vec<(String, Naming)>,
    /// (item line, its path, how a quote names it).
    pub items: Vec<(String, String, Naming)>,
}

/// Identifiers of a text (runs of letters, digits and `_`).
fn words(text: &str) -> std::collections::BTreeSet<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// The quotes of a thought (closed ones and a last open one), non-empty.
pub fn quotes(thought: &str) -> Vec<&str> {
    thought
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|q| !q.trim().is_empty())
        .collect()
}

impl Faithful {
    /// Whether a quote with identifiers `ws` (or text `q`) names it.
    fn names(how: &Naming, qs: &[&str], ws: &std::collections::BTreeSet<&str>) -> bool {
        match how {
            Naming::Word(w) => ws.contains(w.as_str()),
            Naming::Code(c) => qs.iter().any(|q| {
                let q = q.trim();
                q.len() >= 3 && c.contains(q)
            }),
        }
    }

    /// The grammar narrowed to what the quotes `qs` name (the full one when they name nothing).
    pub fn narrow(&self, qs: &[&str]) -> AnswerGrammar {
        let ws: std::collections::BTreeSet<&str> = qs.iter().flat_map(|q| words(q)).collect();
        let items: Vec<&(String, String, Naming)> = self
            .items
            .iter()
            .filter(|(_, _, how)| Self::names(how, qs, &ws))
            .collect();
        let mut paths: std::collections::BTreeSet<String> = self
            .paths
            .iter()
            .filter(|(p, how)| {
                Self::names(how, qs, &ws) || qs.iter().any(|q| q.contains(p.as_str()))
            })
            .map(|(p, _)| p.clone())
            .collect();
        paths.extend(items.iter().map(|(_, p, _)| p.clone()));
        let mut g = self.grammar.clone();
        if !items.is_empty() {
            g.lines = items.iter().map(|(l, _, _)| l.clone()).collect();
        }
        if !paths.is_empty() {
            g.paths = paths;
        }
        g
    }

    /// The answer lines of a localization record and what names them (`None` for edits).
    pub fn of(rec: &SubtaskRecord, grammar: AnswerGrammar) -> Option<Self> {
        let stem = |p: &str| {
            let name = p.rsplit('/').next().unwrap_or(p);
            Naming::Word(name.split('.').next().unwrap_or(name).to_string())
        };
        let mut items = Vec::new();
        match rec.subtask {
            Subtask::Edit => return None,
            Subtask::File => {}
            Subtask::Function => {
                for f in &rec.shown.functions {
                    let last = f.name.rsplit('.').next().unwrap_or(&f.name);
                    items.push((
                        format!("{}: {}", f.kind.word(), f.name),
                        f.path.clone(),
                        Naming::Word(last.to_string()),
                    ));
                }
            }
            Subtask::Line => {
                for w in &rec.shown.windows {
                    for (k, line) in w.text.lines().enumerate() {
                        if !line.trim().is_empty() {
                            items.push((
                                format!("line: {}", w.start_line + k),
                                w.path.clone(),
                                Naming::Code(line.to_string()),
                            ));
                        }
                    }
                }
            }
        }
        let paths = grammar.paths.iter().map(|p| (p.clone(), stem(p))).collect();
        Some(Self {
            grammar,
            paths,
            items,
        })
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether an occurrence of `s` at byte `i` of `ground` starts where a word does (or `s` starts
/// with punctuation): quotes copy whole names, never the tail of one.
fn starts_word(ground: &str, i: usize, s: &str) -> bool {
    !s.starts_with(is_word_char) || !ground[..i].ends_with(is_word_char)
}

/// Whether quoted text `q` + `part`, followed in the prompt by `after`, ends where a word does.
fn ends_word(q: &str, part: &str, after: &str) -> bool {
    let last = part.chars().last().or_else(|| q.chars().last());
    !last.is_some_and(is_word_char) || !after.starts_with(is_word_char)
}

/// Whether `s` occurs in `ground` starting at a word boundary (and, with `whole`, also ending at
/// one).
fn occurs(ground: &str, s: &str, whole: bool) -> bool {
    if s.is_empty() {
        return true;
    }
    occurrences(ground, s)
        .any(|i| starts_word(ground, i, s) && (!whole || ends_word("", s, &ground[i + s.len()..])))
}

/// Every start of `s` in `ground`, overlapping ones included (`match_indices` skips those, and
/// an overlapping occurrence may be the one that starts a word).
fn occurrences<'a>(ground: &'a str, s: &'a str) -> impl Iterator<Item = usize> + 'a {
    ground
        .char_indices()
        .map(|(i, _)| i)
        .filter(move |&i| ground[i..].starts_with(s))
}

/// Where the thought stands: outside any quote, or inside one with this much quoted text.
enum Quote<'a> {
    Outside,
    Inside(&'a str),
}

/// The quote state at the end of `thought` (text before `</think>`).
fn quote_state(thought: &str) -> Quote<'_> {
    match thought.rfind('`') {
        Some(i) if thought.matches('`').count() % 2 == 1 => Quote::Inside(&thought[i + 1..]),
        _ => Quote::Outside,
    }
}

impl GroundedThought {
    /// Whether `piece` may follow a thought whose open quote is `quoted` (`None`: outside quotes),
    /// given the continuations `next` of every occurrence of a non-empty `quoted` in the ground;
    /// with `ends`, the thought ends right after the piece and must not end inside a quote.
    fn piece_ok(&self, quoted: Option<&str>, next: &[&str], piece: &str, ends: bool) -> bool {
        let mut rest = piece;
        let mut inside = quoted;
        let mut first = true;
        loop {
            let Some(q) = inside else {
                match rest.find('`') {
                    Some(j) => {
                        rest = &rest[j + 1..];
                        inside = Some("");
                        first = false;
                        continue;
                    }
                    None => return true,
                }
            };
            if ends && !rest.contains('`') {
                return false;
            }
            let (part, closes) = match rest.find('`') {
                Some(j) => (&rest[..j], true),
                None => (rest, false),
            };
            // A quote closes only around something, and only where a word of the prompt ends.
            let ok = if first && !q.is_empty() {
                next.iter().any(|n| {
                    n.starts_with(part) && (!closes || ends_word(q, part, &n[part.len()..]))
                })
            } else {
                occurs(&self.ground, part, closes)
            };
            if !ok || (closes && q.is_empty() && part.is_empty()) {
                return false;
            }
            if !closes {
                return true;
            }
            rest = &rest[part.len() + 1..];
            inside = None;
            first = false;
        }
    }

    /// The mask the grounding allows after `thought` (text with no `</think>` yet): the part of
    /// each piece before a `</think>` it completes must keep every quote a copy.
    fn mask(&self, thought: &str, pieces: &[Option<String>]) -> Vec<bool> {
        let quoted = match quote_state(thought) {
            Quote::Inside(q) => Some(q),
            Quote::Outside => None,
        };
        let next: Vec<&str> = match quoted {
            Some(q) if !q.is_empty() => self
                .ground
                .char_indices()
                .map(|(i, _)| i)
                .filter(|&i| self.ground[i..].starts_with(q) && starts_word(&self.ground, i, q))
                .map(|i| &self.ground[i + q.len()..])
                .collect(),
            _ => Vec::new(),
        };
        // Where a `</think>` would start that began in the thought's tail.
        let tail = (1..THINK_END.len())
            .rev()
            .find(|&k| thought.ends_with(&THINK_END[..k]))
            .unwrap_or(0);
        pieces
            .iter()
            .map(|p| {
                p.as_deref().is_some_and(|p| {
                    let (own, ends) = if tail > 0 && p.starts_with(&THINK_END[tail..]) {
                        ("", true)
                    } else {
                        p.find(THINK_END).map_or((p, false), |i| (&p[..i], true))
                    };
                    self.piece_ok(quoted, &next, own, ends)
                })
            })
            .collect()
    }
}

impl TokenConstraint for GroundedThought {
    fn allowed(&self, text: &str, remaining: usize, pieces: &[Option<String>]) -> Option<Allowed> {
        if let Some(i) = text.find(THINK_END) {
            return match &self.faithful {
                Some(f) => f
                    .narrow(&quotes(&text[..i]))
                    .allowed(text, remaining, pieces),
                None => self.inner.allowed(text, remaining, pieces),
            };
        }
        let inner = self.inner.allowed(text, remaining, pieces)?;
        let ground = self.mask(text, pieces);
        let both: Vec<bool> = inner
            .pieces
            .iter()
            .zip(&ground)
            .map(|(a, b)| *a && *b)
            .collect();
        // Never leave nothing to sample (budget forcing of `</think>` inside a quote): then the
        // answer grammar alone decides.
        if !inner.stop && !both.iter().any(|&b| b) {
            return Some(inner);
        }
        Some(Allowed {
            pieces: both,
            stop: inner.stop,
        })
    }

    fn start(&self) -> Option<Box<dyn ConstraintState>> {
        Some(Box::new(GroundedState {
            inner: self.inner.start()?,
            ground: GroundChar {
                index: Arc::new(GroundIndex::new(&self.ground)),
                quote: None,
                k: 0,
                ended: false,
            },
            faithful: self.faithful.clone(),
            narrowed: None,
            text: String::new(),
            k: 0,
        }))
    }
}

/// Byte offsets of one character in the ground: everywhere, and where a word may start.
type Positions = (Arc<Vec<u32>>, Arc<Vec<u32>>);

/// Where each character occurs in the ground: everywhere, and where a word may start.
#[derive(Debug)]
struct GroundIndex {
    text: String,
    starts: std::collections::HashMap<char, Positions>,
}

impl GroundIndex {
    fn new(text: &str) -> Self {
        let mut map: std::collections::HashMap<char, (Vec<u32>, Vec<u32>)> = Default::default();
        let mut prev_word = false;
        for (i, c) in text.char_indices() {
            let e = map.entry(c).or_default();
            e.0.push(i as u32);
            if !prev_word {
                e.1.push(i as u32);
            }
            prev_word = is_word_char(c);
        }
        Self {
            text: text.to_string(),
            starts: map
                .into_iter()
                .map(|(c, (a, w))| (c, (Arc::new(a), Arc::new(w))))
                .collect(),
        }
    }
}

/// An open quote: where its text occurs in the ground (at word starts where it starts with a
/// word character), its length in bytes and whether it ends with a word character.
#[derive(Clone, Debug)]
struct OpenQuote {
    at: Arc<Vec<u32>>,
    len: usize,
    last_word: bool,
}

/// The grounding's character state of a thought: the open quote, if any, and how much of
/// `</think>` the text ends with; once the thought ends, what follows is the answer's business.
#[derive(Clone, Debug)]
struct GroundChar {
    index: Arc<GroundIndex>,
    quote: Option<OpenQuote>,
    k: usize,
    ended: bool,
}

impl GroundChar {
    /// The open quote after `c`; `None` inside: `c` closed it. With `strict`, a quote that stops
    /// being a copy (or closes where no word ends) is refused (`Err`); without, the state follows
    /// the text anyway (an empty `at` then refuses everything, as the reference does).
    fn quote_push(&self, q: &OpenQuote, c: char, strict: bool) -> Result<Option<OpenQuote>, ()> {
        let text = &self.index.text;
        if c == '`' {
            // A quote closes around something, where a word of the prompt ends.
            let closes = q.len > 0
                && q.at.iter().any(|&i| {
                    !q.last_word || !text[i as usize + q.len..].starts_with(is_word_char)
                });
            return if closes || !strict { Ok(None) } else { Err(()) };
        }
        let at = if q.len == 0 {
            match self.index.starts.get(&c) {
                Some((_, words)) if is_word_char(c) => words.clone(),
                Some((all, _)) => all.clone(),
                None => Arc::new(Vec::new()),
            }
        } else {
            Arc::new(
                q.at.iter()
                    .copied()
                    .filter(|&i| text[i as usize + q.len..].starts_with(c))
                    .collect(),
            )
        };
        if strict && at.is_empty() {
            return Err(());
        }
        Ok(Some(OpenQuote {
            at,
            len: q.len + c.len_utf8(),
            last_word: is_word_char(c),
        }))
    }

    /// The state after `c` (see [`GroundChar::quote_push`] for `strict`).
    fn step(&self, c: char, strict: bool) -> Option<Self> {
        if self.ended {
            return Some(self.clone());
        }
        let mut s = self.clone();
        s.quote = match &self.quote {
            Some(q) => self.quote_push(q, c, strict).ok()?,
            None if c == '`' => Some(OpenQuote {
                at: Arc::new(Vec::new()),
                len: 0,
                last_word: false,
            }),
            None => None,
        };
        s.k = crate::swe::grammar::think_step(self.k, c);
        if s.k == THINK_END.len() {
            // The thought may end outside a quote only.
            if strict && s.quote.is_some() {
                return None;
            }
            s.ended = true;
        }
        Some(s)
    }
}

impl crate::model::token_trie::CharState for GroundChar {
    fn push(&self, c: char) -> Option<Self> {
        self.step(c, true)
    }

    fn accepts(&self) -> bool {
        // An open quote that no longer copies the ground refuses even the empty piece.
        self.quote
            .as_ref()
            .is_none_or(|q| q.len == 0 || !q.at.is_empty())
    }
}

/// The incremental state of a [`GroundedThought`].
#[derive(Debug)]
struct GroundedState {
    inner: Box<dyn ConstraintState>,
    ground: GroundChar,
    faithful: Option<Faithful>,
    /// The answer grammar narrowed to the thought's quotes, once the thought ended.
    narrowed: Option<Box<dyn ConstraintState>>,
    text: String,
    k: usize,
}

impl ConstraintState for GroundedState {
    fn advance(&mut self, piece: &str) {
        self.inner.advance(piece);
        if let Some(n) = &mut self.narrowed {
            n.advance(piece);
            return;
        }
        let before = self.text.len();
        self.text.push_str(piece);
        let ended = self.k == THINK_END.len();
        if ended {
            return;
        }
        for c in piece.chars() {
            if let Some(g) = self.ground.step(c, false) {
                self.ground = g;
            }
        }
        for (j, c) in piece.char_indices() {
            self.k = crate::swe::grammar::think_step(self.k, c);
            if self.k == THINK_END.len() {
                let end = before + j + c.len_utf8() - THINK_END.len();
                if let Some(f) = &self.faithful {
                    let g = f.narrow(&quotes(&self.text[..end]));
                    self.narrowed = g.start().map(|mut s| {
                        s.advance(&self.text);
                        s
                    });
                }
                return;
            }
        }
    }

    fn mask(&self, remaining: usize, vocab: &VocabIndex) -> Option<Mask> {
        if self.k == THINK_END.len() {
            return match &self.narrowed {
                Some(n) => n.mask(remaining, vocab),
                None => self.inner.mask(remaining, vocab),
            };
        }
        let inner = self.inner.mask(remaining, vocab)?;
        let mut both = inner.pieces.clone();
        let g = &self.ground;
        if g.quote.is_none() {
            both.intersect(&vocab.free_step(g));
        } else {
            let mut ground = vocab.empty();
            vocab.trie.walk(g, &mut ground);
            both.intersect(&ground);
        }
        // Never leave nothing to sample: then the answer grammar alone decides.
        if !inner.stop && both.is_empty() {
            return Some(inner);
        }
        Some(Mask {
            pieces: both,
            stop: inner.stop,
        })
    }
}

/// What a record's thought may quote: its prompt and the qualified names of the definitions it
/// showed (`Money._check`), one per line.
pub fn ground_of(rec: &SubtaskRecord) -> String {
    let mut g = rec.prompt.clone();
    for f in &rec.shown.functions {
        g.push('\n');
        g.push_str(&f.name);
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allows everything, never stops.
    #[derive(Debug)]
    struct Free;
    impl TokenConstraint for Free {
        fn allowed(&self, _: &str, _: usize, pieces: &[Option<String>]) -> Option<Allowed> {
            Some(Allowed {
                pieces: vec![true; pieces.len()],
                stop: false,
            })
        }
    }

    fn pieces(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some(s.to_string())).collect()
    }

    fn allowed(g: &GroundedThought, text: &str, v: &[&str]) -> Vec<String> {
        let p = pieces(v);
        let a = g.allowed(text, 100, &p).expect("a mask");
        v.iter()
            .zip(a.pieces)
            .filter(|(_, ok)| *ok)
            .map(|(s, _)| s.to_string())
            .collect()
    }

    fn grounded() -> GroundedThought {
        GroundedThought {
            inner: Arc::new(Free),
            ground: "from qzx41 import money\nprint(money.Money(1))\nmoney.py".into(),
            faithful: None,
        }
    }

    #[test]
    fn quotes_continue_only_the_way_the_prompt_does() {
        let g = grounded();
        let v = [
            "qzx", "41", "q", "zz", " import", "`", "`,", "money", "cash", "from", "x`", ">",
        ];
        // Outside a quote everything is free but a piece opening a quote with no copy in it.
        assert_eq!(
            allowed(&g, "<think>The snippet runs ", &v),
            ["qzx", "41", "q", "zz", " import", "`", "money", "cash", "from", "x`", ">"]
        );
        // Inside: a fresh quote takes any text of the prompt that starts a word (not `41` of
        // `qzx41`); an empty quote cannot close, nor can one end inside a word (`x` of `qzx41`).
        assert_eq!(
            allowed(&g, "<think>runs `", &v),
            ["qzx", "q", " import", "money", "from"]
        );
        // Then only the continuations of an occurrence, or the closing backtick at a word's end.
        assert_eq!(
            allowed(&g, "<think>runs `from ", &v),
            ["qzx", "q", "`", "`,"]
        );
        assert_eq!(allowed(&g, "<think>runs `from qzx", &v), ["41"]);
        assert_eq!(
            allowed(&g, "<think>runs `from qzx41 import money", &v),
            ["`", "`,"]
        );
        // `money` occurs three times; none continues with a piece here.
        assert_eq!(allowed(&g, "<think>see `money", &v), ["`", "`,"]);
        // A closed quote leaves the thought free again.
        assert_eq!(
            allowed(&g, "<think>see `money` and ", &v).len(),
            v.len() - 1
        );
        // The thought may end outside a quote, not inside one.
        assert_eq!(allowed(&g, "<think>see `money` </think", &[">"]), [">"]);
        assert!(allowed(&g, "<think>see `mon", &["</think>", "ey`</think>"]) == ["ey`</think>"]);
    }

    #[test]
    fn a_piece_that_opens_a_quote_must_start_a_substring() {
        let g = grounded();
        let v = ["`money", "`cash", " `from", "` ", "``"];
        assert_eq!(
            allowed(&g, "<think>It runs", &v),
            ["`money", " `from", "` "]
        );
    }

    #[test]
    fn the_answer_after_the_thought_is_left_to_the_inner_grammar() {
        let g = grounded();
        let v = ["cash", "`", "`cash"];
        assert_eq!(allowed(&g, "<think>a `b</think>\n```\n", &v).len(), 3);
    }

    fn file_faithful() -> Faithful {
        let grammar = AnswerGrammar::files(["pkg/cache.py", "pkg/money.py", "pkg/text.py"], 5, 8);
        let paths = grammar
            .paths
            .iter()
            .map(|p| {
                let stem = p.trim_start_matches("pkg/").trim_end_matches(".py");
                (p.clone(), Naming::Word(stem.to_string()))
            })
            .collect();
        Faithful {
            grammar,
            paths,
            items: Vec::new(),
        }
    }

    #[test]
    fn faithful_answers_name_only_what_the_thought_quoted() {
        let f = file_faithful();
        let g = f.narrow(&quotes(
            "<think>The snippet runs `from pkg import money`, so",
        ));
        assert_eq!(g.paths.iter().collect::<Vec<_>>(), ["pkg/money.py"]);
        // A word inside a longer identifier does not count; a quoted path does.
        let g = f.narrow(&["moneybag", "see pkg/text.py here"]);
        assert_eq!(g.paths.iter().collect::<Vec<_>>(), ["pkg/text.py"]);
        // Quotes that name nothing leave the answer open.
        assert_eq!(f.narrow(&["print(1)"]).paths.len(), 3);
        assert_eq!(f.narrow(&[]).paths.len(), 3);
        // Items: a definition by its last name, a line by the code it copies.
        let mut f = file_faithful();
        f.grammar.need_item = true;
        f.items = vec![
            (
                "function: Money.split".into(),
                "pkg/money.py".into(),
                Naming::Word("split".into()),
            ),
            (
                "function: title".into(),
                "pkg/text.py".into(),
                Naming::Word("title".into()),
            ),
            (
                "line: 7".into(),
                "pkg/text.py".into(),
                Naming::Code("    return s.title()".into()),
            ),
        ];
        f.grammar.lines = f.items.iter().map(|(l, _, _)| l.clone()).collect();
        let g = f.narrow(&["Money.split"]);
        assert_eq!(g.paths.iter().collect::<Vec<_>>(), ["pkg/money.py"]);
        assert_eq!(
            g.lines.iter().collect::<Vec<_>>(),
            ["function: Money.split"]
        );
        let g = f.narrow(&["return s.title()"]);
        assert_eq!(
            g.lines.iter().collect::<Vec<_>>(),
            ["function: title", "line: 7"]
        );
        // Too short a code quote names no line.
        assert_eq!(f.narrow(&["s."]).lines.len(), 3);
    }

    #[test]
    fn after_the_thought_the_narrowed_grammar_decides() {
        let f = file_faithful();
        let g = GroundedThought {
            inner: Arc::new(f.grammar.clone()),
            ground: "from pkg import money\npkg/\n    cache.py\n    money.py\n    text.py".into(),
            faithful: Some(f),
        };
        let v = ["pkg/", "money", "cache", "text", ".py"];
        let a = allowed(
            &g,
            "<think>It runs `from pkg import money`.</think>\n```\npkg/",
            &v,
        );
        assert_eq!(a, ["money"]);
        let a = allowed(&g, "<think>No idea.</think>\n```\npkg/", &v);
        assert_eq!(a, ["money", "cache", "text"]);
    }
}
