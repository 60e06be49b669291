//! The incremental masks (a grammar state advanced by each piece, walked over the vocabulary's
//! trie) give the same allowed sets as the reference rescan (`TokenConstraint::allowed` on the
//! whole text) for every grammar: localization answers, edits, grounded thoughts and faithful
//! answers, over random grammars, vocabularies and walks.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sorft::model::constraint::{ConstraintState, TokenConstraint};
use sorft::model::token_trie::VocabIndex;
use sorft::swe::edit_grammar::EditGrammar;
use sorft::swe::grammar::AnswerGrammar;
use sorft::swe::grounding::{Faithful, GroundedThought, Naming};
use sorft::swe::reward::Window;

const PATHS: [&str; 6] = [
    "pkg/a.py",
    "pkg/ab.py",
    "pkg/money.py",
    "src/lib.rs",
    "setup.py",
    "pkg/text.py",
];
const CODE: [&str; 8] = [
    "def f(x):",
    "    y = x + 1",
    "    return y",
    "from pkg import money",
    "print(money.Money(1))",
    "class Shape:",
    "    def area(self):",
    "fn g() -> u8 {",
];

fn pick<'a>(rng: &mut ChaCha8Rng, v: &[&'a str]) -> &'a str {
    v[rng.random_range(0..v.len())]
}

/// Random cuts of `text` into pieces of 1..=5 characters.
fn cuts(rng: &mut ChaCha8Rng, text: &str, out: &mut Vec<String>) {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let n = rng.random_range(1..=5).min(chars.len() - i);
        out.push(chars[i..i + n].iter().collect());
        i += n;
    }
}

/// A vocabulary of single characters, fixed markers and random cuts of what the grammars
/// accept, with one special token (`None`).
fn vocab(rng: &mut ChaCha8Rng, texts: &[String]) -> Vec<Option<String>> {
    let mut v: Vec<String> = [
        "</",
        "think",
        ">",
        "</think>",
        "\n```\n",
        "```",
        "\n",
        "`",
        "``",
        "\n```",
        " ",
        "x`",
        "`money",
        " `from",
        "<<<<<<< SEARCH\n",
        "=======\n",
        "===",
        ">>>>>>> REPLACE",
        "\n>>>>>>>",
        " REPLACE",
        "line: ",
        "function: ",
        "é",
        "ok`</think>",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for t in texts {
        for c in t.chars() {
            v.push(c.to_string());
        }
        cuts(rng, t, &mut v);
    }
    v.sort();
    v.dedup();
    let mut out: Vec<Option<String>> = v.into_iter().map(Some).collect();
    out.push(None);
    out
}

fn lines_grammar(rng: &mut ChaCha8Rng) -> AnswerGrammar {
    let paths: Vec<&str> = (0..rng.random_range(1..4))
        .map(|_| pick(rng, &PATHS))
        .collect();
    let mut g = AnswerGrammar::files(paths, rng.random_range(1..6), rng.random_range(2..12));
    if rng.random_bool(0.6) {
        g.blank = rng.random_bool(0.5);
        g.need_item = rng.random_bool(0.5);
        for _ in 0..rng.random_range(1..5) {
            g.lines.insert(format!("line: {}", rng.random_range(1..30)));
        }
        g.lines.insert("function: Shape.area".into());
        if rng.random_bool(0.5) {
            g.named = vec!["function: ".into(), "class: ".into()];
        }
    }
    g
}

fn edit_grammar(rng: &mut ChaCha8Rng) -> EditGrammar {
    let windows: Vec<Window> = (0..rng.random_range(1..3))
        .map(|_| {
            let n = rng.random_range(1..5);
            let text: String = (0..n).map(|_| format!("{}\n", pick(rng, &CODE))).collect();
            Window {
                path: pick(rng, &PATHS).to_string(),
                start_line: rng.random_range(1..20),
                text,
            }
        })
        .collect();
    EditGrammar::new(&windows, rng.random_range(4..30)).expect("windows")
}

fn grounded(rng: &mut ChaCha8Rng) -> GroundedThought {
    let g = lines_grammar(rng);
    let ground: String = (0..rng.random_range(2..6))
        .map(|_| format!("{}\n", pick(rng, &CODE)))
        .chain(g.paths.iter().map(|p| format!("{p}\n")))
        .collect();
    let faithful = rng.random_bool(0.5).then(|| Faithful {
        grammar: g.clone(),
        paths: g
            .paths
            .iter()
            .map(|p| {
                let stem = p.rsplit('/').next().unwrap_or(p).split('.').next();
                (p.clone(), Naming::Word(stem.unwrap_or(p).to_string()))
            })
            .collect(),
        items: g
            .lines
            .iter()
            .zip(&g.paths)
            .map(|(l, p)| (l.clone(), p.clone(), Naming::Code(pick(rng, &CODE).into())))
            .collect(),
    });
    GroundedThought {
        inner: Arc::new(g),
        ground,
        faithful,
    }
}

/// What the grammar accepts, for the vocabulary's cuts.
fn texts_of(c: &Scenario) -> Vec<String> {
    let mut t: Vec<String> = PATHS.iter().chain(&CODE).map(|s| s.to_string()).collect();
    match c {
        Scenario::Lines(g) => t.extend(g.lines.iter().cloned()),
        Scenario::Edit(_) => {}
        Scenario::Grounded(g) => t.push(g.ground.clone()),
    }
    t
}

enum Scenario {
    Lines(AnswerGrammar),
    Edit(EditGrammar),
    Grounded(GroundedThought),
}

impl Scenario {
    fn constraint(self) -> Arc<dyn TokenConstraint> {
        match self {
            Scenario::Lines(g) => Arc::new(g),
            Scenario::Edit(g) => Arc::new(g),
            Scenario::Grounded(g) => Arc::new(g),
        }
    }
}

/// One random walk: at every step both implementations' sets must agree; the next piece is
/// drawn from the allowed ones (any piece when none is, as an unconstrained fallback would).
fn walk(rng: &mut ChaCha8Rng, c: &dyn TokenConstraint, idx: &VocabIndex) -> usize {
    let mut state: Box<dyn ConstraintState> = c.start().expect("an incremental state");
    let budget = rng.random_range(8..70);
    let mut text = String::new();
    let mut checked = 0;
    for step in 0..budget {
        let remaining = budget - step;
        let old = c.allowed(&text, remaining, &idx.pieces).expect("a mask");
        let new = state.mask(remaining, idx).expect("a mask");
        for (i, &b) in old.pieces.iter().enumerate() {
            assert_eq!(
                new.pieces.contains(i as u32),
                b,
                "piece {:?} after {text:?} with {remaining} left",
                idx.pieces[i]
            );
        }
        assert_eq!(new.stop, old.stop, "stop after {text:?}");
        checked += 1;
        if old.stop && rng.random_bool(0.5) {
            break;
        }
        let allowed: Vec<usize> = (0..old.pieces.len()).filter(|&i| old.pieces[i]).collect();
        let id = if allowed.is_empty() || rng.random_bool(0.02) {
            rng.random_range(0..idx.pieces.len() - 1)
        } else {
            allowed[rng.random_range(0..allowed.len())]
        };
        let piece = idx.pieces[id].clone().unwrap_or_default();
        text.push_str(&piece);
        state.advance(&piece);
    }
    checked
}

#[test]
fn incremental_masks_equal_the_rescan_for_every_grammar() {
    let mut steps = [0usize; 3];
    for seed in 0..90u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let kind = (seed % 3) as usize;
        let sc = match kind {
            0 => Scenario::Lines(lines_grammar(&mut rng)),
            1 => Scenario::Edit(edit_grammar(&mut rng)),
            _ => Scenario::Grounded(grounded(&mut rng)),
        };
        let texts = texts_of(&sc);
        let idx = VocabIndex::new(vocab(&mut rng, &texts));
        let c = sc.constraint();
        for _ in 0..4 {
            steps[kind] += walk(&mut rng, c.as_ref(), &idx);
        }
    }
    // Every grammar was exercised over many steps.
    assert!(steps.iter().all(|&n| n > 1500), "{steps:?}");
}

/// A checker that could not fail would pass this too: a planted fault (a state that ignores
/// the last piece) is caught.
#[test]
fn a_state_that_misses_a_piece_is_caught() {
    let g = AnswerGrammar::files(["pkg/a.py", "setup.py"], 2, 4);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let idx = VocabIndex::new(vocab(&mut rng, &["pkg/a.py".into(), "setup.py".into()]));
    let mut state = g.start().expect("incremental");
    let text = "<think>so</think>\n```\npkg/";
    // Fed all but the last piece: its mask differs from the reference on the full text.
    state.advance("<think>so</think>\n```\n");
    let old = g.allowed(text, 20, &idx.pieces).expect("mask");
    let new = state.mask(20, &idx).expect("mask");
    let same = (0..idx.pieces.len()).all(|i| new.pieces.contains(i as u32) == old.pieces[i]);
    assert!(!same);
    state.advance("pkg/");
    let new = state.mask(20, &idx).expect("mask");
    assert!((0..idx.pieces.len()).all(|i| new.pieces.contains(i as u32) == old.pieces[i]));
}
