//! Distractor modules: near-duplicate copies of a project's real modules under similar names
//! (`stats_legacy.py` beside `stats.py`). The tests never import them and bugs are never injected
//! into them, so a localizer that matches names or function bodies alone is misled.

use super::Project;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;

/// Name suffixes of distractor modules.
pub const SUFFIXES: [&str; 4] = ["legacy", "compat", "old", "v1"];

/// The path a distractor of module path `mpath` gets with `suffix` (`pkg/stats.py` ->
/// `pkg/stats_legacy.py`).
pub fn distractor_path(mpath: &str, suffix: &str) -> String {
    match mpath.strip_suffix(".py") {
        Some(stem) => format!("{stem}_{suffix}.py"),
        None => format!("{mpath}_{suffix}"),
    }
}

/// Adds `count` distractor modules (at most one per real module) to the project's files.
/// Returns their paths.
pub fn add_distractors<R: Rng>(proj: &mut Project, count: usize, rng: &mut R) -> Vec<String> {
    let mut order: Vec<usize> = (0..proj.modules.len()).collect();
    order.shuffle(rng);
    let mut added = Vec::new();
    for k in order.into_iter().take(count) {
        let mpath = proj.modules[k].0.clone();
        let Some(src) = proj.files.get(&mpath).cloned() else {
            continue;
        };
        let suffix = SUFFIXES.choose(rng).copied().unwrap_or("legacy");
        let path = distractor_path(&mpath, suffix);
        if proj.files.contains_key(&path) {
            continue;
        }
        let mut lines = src.lines();
        let first = lines.next().unwrap_or("");
        let doc = first.trim().trim_matches('"').trim_end_matches('.');
        let head = if first.trim_start().starts_with("\"\"\"") && first.trim().len() > 6 {
            format!(
                "\"\"\"{doc} (previous implementation, kept for backwards compatibility).\"\"\""
            )
        } else {
            format!(
                "\"\"\"Previous implementation, kept for backwards compatibility.\"\"\"\n{first}"
            )
        };
        let mut text = head;
        text.push('\n');
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        proj.files.insert(path.clone(), text);
        added.push(path);
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distractors_are_near_copies_under_similar_names() {
        let mut p = super::super::build_project(3, 0);
        let before = p.files.len();
        let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
        let added = add_distractors(&mut p, 2, &mut rng);
        assert_eq!(added.len(), 2);
        assert_eq!(p.files.len(), before + 2);
        for path in &added {
            let real = p
                .modules
                .iter()
                .find(|m| SUFFIXES.iter().any(|s| distractor_path(&m.0, s) == *path))
                .expect("a distractor sits beside a real module");
            let (a, b) = (&p.files[path], &p.files[&real.0]);
            assert_ne!(a, b);
            // Everything but the docstring line is the same code.
            assert_eq!(a.lines().skip(1).last(), b.lines().skip(1).last());
            assert!(!p.modules.iter().any(|m| &m.0 == path));
        }
    }
}
