//! BM25 retrieval over repository files and functions (the SWE-bench paper's retrieval baseline),
//! with code-aware tokens: identifiers are split on `snake_case` and `camelCase` boundaries and the
//! whole identifier is kept too.

use crate::swe::codemap::{self, Lang};
use crate::swe::repo::Snapshot;
use std::collections::HashMap;

/// Term-frequency saturation.
pub const K1: f64 = 1.2;
/// Length normalisation.
pub const B: f64 = 0.75;

/// Splits text into lower-case code tokens: `parseHTTPResponse_v2` -> `parsehttpresponse_v2`,
/// `parse`, `http`, `response`, `v2`.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if word.is_empty() {
            continue;
        }
        let mut parts: Vec<String> = Vec::new();
        for piece in word.split('_').filter(|p| !p.is_empty()) {
            let chars: Vec<char> = piece.chars().collect();
            let mut cur = String::new();
            for (i, &c) in chars.iter().enumerate() {
                let prev = if i > 0 { Some(chars[i - 1]) } else { None };
                let next = chars.get(i + 1).copied();
                let boundary = match prev {
                    Some(p) => {
                        (p.is_lowercase() && c.is_uppercase())
                            || (p.is_uppercase()
                                && c.is_uppercase()
                                && next.is_some_and(|n| n.is_lowercase()))
                    }
                    None => false,
                };
                if boundary && !cur.is_empty() {
                    parts.push(cur.to_lowercase());
                    cur.clear();
                }
                cur.push(c);
            }
            if !cur.is_empty() {
                parts.push(cur.to_lowercase());
            }
        }
        let whole = word.to_lowercase();
        if parts.len() > 1 || parts.first() != Some(&whole) {
            out.push(whole);
        }
        out.extend(parts);
    }
    out
}

/// A BM25 index over named documents.
#[derive(Debug, Clone, Default)]
pub struct Bm25Index {
    ids: Vec<String>,
    doc_len: Vec<f64>,
    postings: HashMap<String, Vec<(u32, u32)>>,
    avg_len: f64,
}

impl Bm25Index {
    /// Indexes `(id, text)` documents.
    pub fn new<I, S, T>(docs: I) -> Bm25Index
    where
        I: IntoIterator<Item = (S, T)>,
        S: Into<String>,
        T: AsRef<str>,
    {
        let mut idx = Bm25Index::default();
        for (id, text) in docs {
            let d = idx.ids.len() as u32;
            idx.ids.push(id.into());
            let toks = tokenize(text.as_ref());
            idx.doc_len.push(toks.len() as f64);
            let mut tf: HashMap<String, u32> = HashMap::new();
            for t in toks {
                *tf.entry(t).or_default() += 1;
            }
            for (t, n) in tf {
                idx.postings.entry(t).or_default().push((d, n));
            }
        }
        let n = idx.ids.len().max(1) as f64;
        idx.avg_len = idx.doc_len.iter().sum::<f64>() / n;
        idx
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The `k` best documents for `query` as (id, score), best first; ties by id. Zero scores are left out.
    pub fn search(&self, query: &str, k: usize) -> Vec<(String, f64)> {
        let n = self.ids.len() as f64;
        let mut scores = vec![0.0f64; self.ids.len()];
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        for t in terms {
            let Some(post) = self.postings.get(&t) else {
                continue;
            };
            let df = post.len() as f64;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for &(d, tf) in post {
                let tf = f64::from(tf);
                let len = self.doc_len[d as usize];
                let norm = K1 * (1.0 - B + B * len / self.avg_len.max(1e-9));
                scores[d as usize] += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
        let mut ranked: Vec<(usize, f64)> = scores
            .into_iter()
            .enumerate()
            .filter(|(_, s)| *s > 0.0)
            .collect();
        ranked.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| self.ids[a.0].cmp(&self.ids[b.0]))
        });
        ranked
            .into_iter()
            .take(k)
            .map(|(d, s)| (self.ids[d].clone(), s))
            .collect()
    }
}

/// Index over the non-test source files of a snapshot (id = path; the path is part of the text).
pub fn file_index(snap: &Snapshot) -> Bm25Index {
    Bm25Index::new(
        snap.paths()
            .filter(|p| codemap::is_source_path(p) && !codemap::is_test_path(p))
            .filter_map(|p| snap.text(p).map(|t| (p.to_string(), format!("{p}\n{t}")))),
    )
}

/// Index over the localization units of the non-test files (id = `path::Qualified.name`).
pub fn function_index(snap: &Snapshot) -> Bm25Index {
    let mut docs = Vec::new();
    for p in snap.paths() {
        if codemap::is_test_path(p) {
            continue;
        }
        let (Some(lang), Some(src)) = (Lang::from_path(p), snap.text(p)) else {
            continue;
        };
        let defs = codemap::definitions(lang, src);
        for d in codemap::units(&defs) {
            let text = codemap::raw_window(src, d.start_line, d.end_line);
            docs.push((format!("{p}::{}", d.name), format!("{} {text}", d.name)));
        }
    }
    Bm25Index::new(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_identifiers() {
        assert_eq!(
            tokenize("parseHTTPResponse(snake_case)"),
            vec![
                "parsehttpresponse",
                "parse",
                "http",
                "response",
                "snake_case",
                "snake",
                "case"
            ]
        );
        assert_eq!(tokenize("x = 1"), vec!["x", "1"]);
    }

    #[test]
    fn ranks_the_relevant_document_first() {
        let idx = Bm25Index::new([
            (
                "a.py",
                "def clamp(value, low, high): return min(max(value, low), high)",
            ),
            ("b.py", "def slugify(title): return title.lower()"),
            ("c.py", "def median(values): ordered = sorted(values)"),
        ]);
        let r = idx.search("clamp gives a value above high", 3);
        assert_eq!(r[0].0, "a.py");
        assert!(idx.search("zzz", 3).is_empty());
        let r = idx.search("sortedValues median", 1);
        assert_eq!(r[0].0, "c.py");
    }
}
