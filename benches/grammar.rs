//! Cost of one constrained decoding step at response positions 16, 128 and 512: the rescan
//! reference (`TokenConstraint::allowed` on the whole text) against the incremental mask (a
//! state advanced by each piece, walked over the vocabulary's trie), in the same run, for a
//! grounded localization thought and for an edit answer's REPLACE part.
//! `cargo bench --bench grammar` (add `--profile dev` to skip the optimised build).

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sorft::model::constraint::TokenConstraint;
use sorft::model::token_trie::VocabIndex;
use sorft::swe::edit_grammar::EditGrammar;
use sorft::swe::grammar::AnswerGrammar;
use sorft::swe::grounding::GroundedThought;
use sorft::swe::reward::Window;

const VOCAB: usize = 32_768;

/// Random pieces of 1..=8 characters over code-like characters, plus the grammars' markers.
fn vocab(rng: &mut ChaCha8Rng) -> VocabIndex {
    let chars: Vec<char> = "abcdefghijklmnopqrstuvwxyz_ABCDEFXYZ0123456789 .,:;()[]=+-*/\n`>#<"
        .chars()
        .collect();
    let mut v: Vec<String> = [
        "</think>",
        "</",
        "think",
        ">",
        "\n```\n",
        "```",
        "\n",
        "`",
        "=======\n",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    while v.len() < VOCAB {
        let n = rng.random_range(1..=8);
        v.push(
            (0..n)
                .map(|_| chars[rng.random_range(0..chars.len())])
                .collect(),
        );
    }
    VocabIndex::new(v.into_iter().map(Some).collect())
}

/// `n` pieces of free text (letters and spaces: no quotes, no `</think>`).
fn free_pieces(rng: &mut ChaCha8Rng, idx: &VocabIndex, n: usize) -> Vec<String> {
    let ok: Vec<&String> = idx
        .pieces
        .iter()
        .flatten()
        .filter(|p| p.chars().all(|c| c.is_ascii_lowercase() || c == ' '))
        .collect();
    (0..n)
        .map(|_| ok[rng.random_range(0..ok.len())].clone())
        .collect()
}

/// Mean seconds per step of both implementations after `prefix` + `body[..pos]`.
fn time_at(
    c: &dyn TokenConstraint,
    idx: &VocabIndex,
    prefix: &str,
    body: &[String],
    pos: usize,
    remaining: usize,
) -> (f64, f64) {
    let text: String = std::iter::once(prefix)
        .chain(body[..pos].iter().map(String::as_str))
        .collect();
    let mut state = c.start().expect("incremental");
    state.advance(&text);
    let reps = 5;
    let t0 = Instant::now();
    let mut n_old = 0;
    for _ in 0..reps {
        let a = c.allowed(&text, remaining, &idx.pieces).expect("mask");
        n_old = a.pieces.iter().filter(|&&b| b).count();
    }
    let old = t0.elapsed().as_secs_f64() / reps as f64;
    let t0 = Instant::now();
    let mut n_new = 0;
    for _ in 0..reps {
        n_new = state.mask(remaining, idx).expect("mask").pieces.count();
    }
    let new = t0.elapsed().as_secs_f64() / reps as f64;
    assert_eq!(n_old, n_new, "the two implementations disagree");
    (old, new)
}

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let idx = vocab(&mut rng);
    let body = free_pieces(&mut rng, &idx, 512);
    let paths = ["pkg/money.py", "pkg/text.py", "setup.py"];
    let grounded = GroundedThought {
        inner: Arc::new(AnswerGrammar::files(paths, 5, 40)),
        ground: "from pkg import money\nprint(money.Money(1))\npkg/money.py\n".repeat(20),
        faithful: None,
    };
    let edit = EditGrammar::new(
        &[Window {
            path: "pkg/money.py".into(),
            start_line: 1,
            text: "def f(x):\n    y = x + 1\n    return y\n".into(),
        }],
        96,
    )
    .expect("window");
    let open =
        "<think>ok</think>\n```python\n### pkg/money.py\n<<<<<<< SEARCH\n    return y\n=======\n";
    println!(
        "vocabulary {VOCAB} pieces, trie {} nodes; mean time per step (ms)",
        idx.trie.len()
    );
    println!("| grammar | position | rescan | incremental |");
    println!("|---|---:|---:|---:|");
    for (name, c, prefix) in [
        (
            "grounded thought",
            &grounded as &dyn TokenConstraint,
            "<think>",
        ),
        ("edit REPLACE", &edit as &dyn TokenConstraint, open),
    ] {
        for pos in [16, 128, 512] {
            let (old, new) = time_at(c, &idx, prefix, &body, pos, 1000);
            println!("| {name} | {pos} | {:.2} | {:.2} |", old * 1e3, new * 1e3);
        }
    }
}
