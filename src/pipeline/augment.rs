//! Package-name augmentation: copies of a training text with the repository's package name
//! replaced, consistently, by a fresh made-up name. Held-out repositories have package names the
//! model never saw, so answering them (every answer names a path) takes copying the name from the
//! prompt; renamed copies make memorising names useless and copying the only way to lower the loss.

use regex::Regex;

use crate::engine::rng::SplitMix;
use crate::rft::rl::RlItem;

/// A made-up package name: 4-8 random lowercase letters and a number (always a valid Python
/// identifier, never a keyword). Letters are uniform so that no prior over names can predict
/// one: the only way to lower the loss on a renamed name is to copy it from the context.
pub fn fresh_name(rng: &mut SplitMix) -> String {
    let n = 4 + rng.below(5) as usize;
    let mut s: String = (0..n)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect();
    s.push_str(&rng.below(100).to_string());
    s
}

/// A made-up package name shaped like the synthetic repositories' own (`umber3`, `quokka48`):
/// a pronounceable word of two or three syllables and a number under 60. The held-out
/// repositories' names are words, which the tokenizer splits into a few word pieces; renamed
/// training copies under names of the same shape train copying those pieces, where
/// [`fresh_name`]'s random letters train copying letter runs. Never one of the synthetic
/// package words, so no held-out name is drawn on purpose.
pub fn package_name(rng: &mut SplitMix) -> String {
    const ONSETS: [&str; 32] = [
        "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "v", "w",
        "y", "z", "br", "ch", "cr", "fl", "gr", "kl", "pl", "sh", "sp", "st", "th", "tr",
    ];
    const VOWELS: [&str; 9] = ["a", "e", "i", "o", "u", "ee", "oo", "ai", "ou"];
    const CODAS: [&str; 16] = [
        "", "", "", "", "r", "l", "n", "m", "ck", "t", "s", "x", "rk", "mb", "ll", "ss",
    ];
    let pick = |rng: &mut SplitMix, xs: &[&'static str]| xs[rng.below(xs.len() as u64) as usize];
    loop {
        let mut word = String::new();
        for i in 0..2 + rng.below(2) {
            // A word may start with a vowel (`umber`), later syllables usually have an onset.
            let onset = if i == 0 {
                rng.below(5) > 0
            } else {
                rng.below(10) > 1
            };
            if onset {
                word.push_str(pick(rng, &ONSETS));
            }
            word.push_str(pick(rng, &VOWELS));
            word.push_str(pick(rng, &CODAS));
        }
        if !is_synthetic_word(&word) {
            word.push_str(&rng.below(60).to_string());
            return word;
        }
    }
}

/// Whether `word` is one of the synthetic repositories' package words (held-out names included).
fn is_synthetic_word(word: &str) -> bool {
    crate::swe::synth::templates::PACKAGE_WORDS.contains(&word)
}

/// A renamer of one package: whole-word occurrences only (`umber3` in `umber3/graph.py` and
/// `from umber3 import graph`, never inside `umber31`).
pub struct Renamer {
    re: Regex,
}

impl Renamer {
    /// For `package`; `None` when the name is empty.
    pub fn new(package: &str) -> Option<Self> {
        if package.is_empty() {
            return None;
        }
        Regex::new(&format!(r"\b{}\b", regex::escape(package)))
            .ok()
            .map(|re| Self { re })
    }

    /// `text` with the package renamed to `to`.
    pub fn apply(&self, text: &str, to: &str) -> String {
        self.re.replace_all(text, regex::NoExpand(to)).into_owned()
    }
}

/// `v` with the package renamed in every string and object key.
fn rename_value(v: serde_json::Value, r: &Renamer, to: &str) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(r.apply(&s, to)),
        Value::Array(a) => Value::Array(a.into_iter().map(|x| rename_value(x, r, to)).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, x)| (r.apply(&k, to), rename_value(x, r, to)))
                .collect(),
        ),
        other => other,
    }
}

/// A copy of a stage-2 prompt whose package is called `to` everywhere: prompt, shown views,
/// ground truth, gold patch and issue text (line numbers do not move: a name never spans lines).
pub fn rename_item(item: &RlItem, to: &str) -> anyhow::Result<RlItem> {
    let Some(r) = Renamer::new(package_of(&item.record.repo)) else {
        return Ok(item.clone());
    };
    let record = serde_json::from_value(rename_value(serde_json::to_value(&item.record)?, &r, to))?;
    Ok(RlItem {
        record,
        problem: r.apply(&item.problem, to),
    })
}

/// `n` renamed copies of each stage-2 prompt, fresh names drawn from `seed` (so that RL, like
/// stage 1, cannot profit from memorising the training repositories' names); `n == 0` gives the
/// originals.
pub fn renamed_items(items: &[RlItem], n: usize, seed: u64) -> anyhow::Result<Vec<RlItem>> {
    if n == 0 {
        return Ok(items.to_vec());
    }
    let mut rng = SplitMix::new(seed);
    let mut out = Vec::with_capacity(items.len() * n);
    for item in items {
        for _ in 0..n {
            out.push(rename_item(item, &package_name(&mut rng))?);
        }
    }
    Ok(out)
}

/// The package name of a repository `owner/name`: its last path part.
pub fn package_of(repo: &str) -> &str {
    repo.rsplit('/').next().unwrap_or(repo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_whole_words_consistently_and_names_are_deterministic_by_seed() {
        let r = Renamer::new("umber3").unwrap();
        let t =
            "from umber3 import graph\nFile \"/home/u/umber3/umber3/graph.py\"\number31 umber3x";
        let out = r.apply(t, "kalo7");
        assert_eq!(
            out,
            "from kalo7 import graph\nFile \"/home/u/kalo7/kalo7/graph.py\"\number31 umber3x"
        );
        let mut a = SplitMix::new(5);
        let mut b = SplitMix::new(5);
        let names: Vec<String> = (0..20).map(|_| fresh_name(&mut a)).collect();
        assert_eq!(
            names,
            (0..20).map(|_| fresh_name(&mut b)).collect::<Vec<_>>()
        );
        assert!(
            names
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 15
        );
        assert!(Renamer::new("").is_none());
        assert_eq!(package_of("synth/umber3"), "umber3");
    }

    #[test]
    fn package_names_look_like_the_synthetic_ones_and_never_are_one() {
        let mut rng = SplitMix::new(11);
        let names: Vec<String> = (0..20_000).map(|_| package_name(&mut rng)).collect();
        for n in &names {
            let word = n.trim_end_matches(|c: char| c.is_ascii_digit());
            let num: u64 = n[word.len()..].parse().unwrap();
            assert!(num < 60, "{n}");
            assert!(
                word.len() >= 2 && word.chars().all(|c| c.is_ascii_lowercase()),
                "{n}"
            );
            assert!(!is_synthetic_word(word), "{n} is a synthetic package word");
            // Pronounceable: at most a coda and an onset between two vowels.
            let run = word
                .chars()
                .fold((0, 0), |(cur, best), c| {
                    let cur = if "aeiou".contains(c) { 0 } else { cur + 1 };
                    (cur, best.max(cur))
                })
                .1;
            assert!(run <= 4, "{n}");
        }
        // The draw is redrawn on a package word (too rare to show up in a sample).
        assert!(is_synthetic_word("umber") && is_synthetic_word("quokka"));
        assert!(!is_synthetic_word("umbero"));
        let distinct: std::collections::BTreeSet<_> = names.iter().collect();
        assert!(distinct.len() > 15_000);
        let mut again = SplitMix::new(11);
        assert!(names
            .iter()
            .take(50)
            .all(|n| *n == package_name(&mut again)));
    }
}
