//! Incremental constrained decoding: a trie over the vocabulary's decoded pieces (built once per
//! tokenizer) and character-level grammar states. The allowed set of one step is found by walking
//! the trie from the current grammar state, cutting every branch whose state is dead, so a step
//! costs what the grammar lets through (not the vocabulary times the response length, as
//! re-checking `text + piece` for every piece does).

use std::collections::HashMap;

use crate::model::constraint::TokenSet;

/// A grammar state advanced one character at a time.
pub trait CharState: Clone {
    /// The state after `c`; `None` when no continuation of the text can be accepted.
    fn push(&self, c: char) -> Option<Self>;
    /// Whether a piece may end here (the text so far keeps the grammar satisfiable).
    fn accepts(&self) -> bool;
}

/// One trie node: children by next character, and the ids whose piece ends here.
#[derive(Clone, Debug, Default)]
struct Node {
    children: Vec<(char, u32)>,
    ids: Vec<u32>,
}

/// A trie over decoded pieces.
#[derive(Clone, Debug)]
pub struct Trie {
    nodes: Vec<Node>,
}

impl Trie {
    /// The trie of every `Some` piece (ids are positions in `pieces`).
    pub fn new(pieces: &[Option<String>]) -> Self {
        let mut map: Vec<HashMap<char, u32>> = vec![HashMap::new()];
        let mut ids: Vec<Vec<u32>> = vec![Vec::new()];
        for (id, p) in pieces.iter().enumerate() {
            let Some(p) = p else { continue };
            let mut at = 0usize;
            for c in p.chars() {
                let next = map.len() as u32;
                let child = *map[at].entry(c).or_insert(next);
                if child == next {
                    map.push(HashMap::new());
                    ids.push(Vec::new());
                }
                at = child as usize;
            }
            ids[at].push(id as u32);
        }
        let nodes = map
            .into_iter()
            .zip(ids)
            .map(|(m, ids)| {
                let mut children: Vec<(char, u32)> = m.into_iter().collect();
                children.sort_unstable();
                Node { children, ids }
            })
            .collect();
        Self { nodes }
    }

    /// Number of nodes (the root included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the trie holds no piece.
    pub fn is_empty(&self) -> bool {
        self.nodes.len() == 1 && self.nodes[0].ids.is_empty()
    }

    fn child(&self, node: usize, c: char) -> Option<usize> {
        let ch = &self.nodes[node].children;
        ch.binary_search_by_key(&c, |&(k, _)| k)
            .ok()
            .map(|i| ch[i].1 as usize)
    }

    /// Sets every piece the walk from `start` accepts: a depth-first walk that stops at dead states.
    pub fn walk<S: CharState>(&self, start: &S, out: &mut TokenSet) {
        self.walk_from(0, start, out);
    }

    /// [`Trie::walk`] below `node`.
    fn walk_from<S: CharState>(&self, node: usize, start: &S, out: &mut TokenSet) {
        let mut stack = vec![(node, start.clone())];
        while let Some((n, s)) = stack.pop() {
            let node = &self.nodes[n];
            if !node.ids.is_empty() && s.accepts() {
                for &id in &node.ids {
                    out.insert(id);
                }
            }
            for &(c, child) in &node.children {
                if let Some(next) = s.push(c) {
                    stack.push((child as usize, next));
                }
            }
        }
    }

    /// Sets the pieces that are prefixes of `text` and at least `min_len` characters long; returns
    /// the node `text` ends at, when every character of it is in the trie.
    pub fn prefixes_of(&self, text: &str, min_len: usize, out: &mut TokenSet) -> Option<usize> {
        let mut at = 0usize;
        for (depth, c) in std::iter::once(None)
            .chain(text.chars().map(Some))
            .enumerate()
        {
            if let Some(c) = c {
                at = self.child(at, c)?;
            }
            if depth >= min_len {
                for &id in &self.nodes[at].ids {
                    out.insert(id);
                }
            }
        }
        Some(at)
    }

    /// Sets the pieces `text + rest` whose `rest` (possibly empty) the walk from `start` accepts:
    /// the pieces that begin with all of `text` and continue in the grammar.
    pub fn walk_after<S: CharState>(&self, text: &str, start: &S, out: &mut TokenSet) {
        let mut at = 0usize;
        for c in text.chars() {
            match self.child(at, c) {
                Some(n) => at = n,
                None => return,
            }
        }
        self.walk_from(at, start, out);
    }
}

/// Every piece of a vocabulary with its trie, and what a free step allows without a walk.
#[derive(Clone, Debug)]
pub struct VocabIndex {
    /// Every token's decoded piece (`None` for special tokens and partial characters).
    pub pieces: Vec<Option<String>>,
    /// The trie over the pieces.
    pub trie: Trie,
    /// Pieces with none of [`SPECIAL`]: free text wherever a grammar only reacts to those.
    pub plain: TokenSet,
    /// Ids of the pieces holding some character of [`SPECIAL`].
    pub special: Vec<u32>,
    /// Pieces without a line end: they never finish a line.
    pub flat: TokenSet,
    /// Ids of the pieces holding a line end.
    pub lined: Vec<u32>,
}

/// The characters free text reacts to: backticks open and close quotes, `>` ends `</think>`.
pub const SPECIAL: [char; 2] = ['`', '>'];

impl VocabIndex {
    /// The index of `pieces`.
    pub fn new(pieces: Vec<Option<String>>) -> Self {
        let trie = Trie::new(&pieces);
        let has_special = |p: &str| p.contains(SPECIAL);
        let plain = TokenSet::from_fn(pieces.len(), |i| {
            pieces[i as usize]
                .as_deref()
                .is_some_and(|p| !has_special(p))
        });
        let special = (0..pieces.len() as u32)
            .filter(|&i| pieces[i as usize].as_deref().is_some_and(has_special))
            .collect();
        let flat = TokenSet::from_fn(pieces.len(), |i| {
            pieces[i as usize]
                .as_deref()
                .is_some_and(|p| !p.contains('\n'))
        });
        let lined = (0..pieces.len() as u32)
            .filter(|&i| {
                pieces[i as usize]
                    .as_deref()
                    .is_some_and(|p| p.contains('\n'))
            })
            .collect();
        Self {
            pieces,
            trie,
            plain,
            special,
            flat,
            lined,
        }
    }

    /// The allowed set of a state that every piece without a line end keeps alive (a settled,
    /// free line): every such piece, plus the pieces with a line end that `start` accepts. The
    /// caller vouches for the premise; the result then equals a walk of the trie.
    pub fn line_step<S: CharState>(&self, start: &S) -> TokenSet {
        self.safe_plus_accepted(&self.flat, &self.lined, start)
    }

    /// `safe` plus the pieces of `risky` that `start` accepts when fed character by character.
    fn safe_plus_accepted<S: CharState>(
        &self,
        safe: &TokenSet,
        risky: &[u32],
        start: &S,
    ) -> TokenSet {
        let mut out = safe.clone();
        for &id in risky {
            if self.pieces[id as usize]
                .as_deref()
                .is_some_and(|p| feed(start, p).is_some_and(|s| s.accepts()))
            {
                out.insert(id);
            }
        }
        out
    }

    /// Number of ids.
    pub fn vocab(&self) -> usize {
        self.pieces.len()
    }

    /// An empty set over this vocabulary.
    pub fn empty(&self) -> TokenSet {
        TokenSet::from_fn(self.vocab(), |_| false)
    }

    /// The set of a free step from `start`: every plain piece, and the special pieces `start`
    /// accepts when fed character by character. Right only for states that plain characters
    /// leave unchanged and accepting.
    pub fn free_step<S: CharState>(&self, start: &S) -> TokenSet {
        self.safe_plus_accepted(&self.plain, &self.special, start)
    }
}

/// `start` after every character of `text` (`None` once dead).
pub fn feed<S: CharState>(start: &S, text: &str) -> Option<S> {
    let mut s = start.clone();
    for c in text.chars() {
        s = s.push(c)?;
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts prefixes of one word.
    #[derive(Clone)]
    struct Word(&'static str, usize);
    impl CharState for Word {
        fn push(&self, c: char) -> Option<Self> {
            self.0[self.1..]
                .starts_with(c)
                .then(|| Word(self.0, self.1 + c.len_utf8()))
        }
        fn accepts(&self) -> bool {
            true
        }
    }

    fn pieces(v: &[&str]) -> Vec<Option<String>> {
        v.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn the_walk_finds_exactly_the_pieces_that_keep_the_word() {
        let p = pieces(&["ab", "a", "abc", "b", "abd", "ab", "é", "aé"]);
        let idx = VocabIndex::new(p);
        let mut out = idx.empty();
        idx.trie.walk(&Word("abcé", 0), &mut out);
        let got: Vec<u32> = (0..8).filter(|&i| out.contains(i)).collect();
        assert_eq!(got, vec![0, 1, 2, 5]);
        let mut pre = idx.empty();
        assert!(idx.trie.prefixes_of("abx", 2, &mut pre).is_none());
        assert_eq!((0..8).filter(|&i| pre.contains(i)).count(), 2);
    }

    #[test]
    fn free_steps_keep_plain_pieces_and_check_special_ones() {
        let idx = VocabIndex::new(pieces(&["a", "`", "b>", "c"]));
        assert_eq!(idx.special, vec![1, 2]);
        let s = idx.free_step(&Word("`", 0));
        assert_eq!(
            (0..4).filter(|&i| s.contains(i)).collect::<Vec<_>>(),
            [0, 1, 3]
        );
    }
}
