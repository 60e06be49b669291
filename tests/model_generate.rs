//! Generation: greedy equals the argmax path of scoring, batching does not change results,
//! sampling is reproducible by seed, stop tokens and strings end sequences.

use std::path::Path;

use sorft::engine::{Backend, Cpu, SamplingParams};
use sorft::model::generate::{generate, FinishReason, GenOptions, GenRequest};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::{load_dir, Model, Tokenizer};

fn tiny(dir: &Path) -> (Model<Cpu>, Tokenizer) {
    init_model(Preset::Tiny, dir, 7, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    let (m, t) = load_dir(&Cpu, dir).unwrap();
    (m, t.unwrap())
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 50,
        top_p: 0.9,
        seed,
    }
}

#[test]
fn greedy_output_is_the_argmax_path_of_score() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let prompt = tok.encode("def median(values):\n    ordered = ").unwrap();
    let req = GenRequest {
        prompt: prompt.clone(),
        params: SamplingParams::greedy(),
        max_new_tokens: 24,
        ..Default::default()
    };
    let out = &generate(&model, Some(&tok), &[req], &GenOptions::default()).unwrap()[0];
    assert_eq!(out.ids.len(), 24);
    let mut all = prompt.clone();
    all.extend(&out.ids);
    let (lps, lsm) = model.score(&all).unwrap();
    let rows = Cpu.to_host_f32(&lsm).unwrap();
    let v = model.config.vocab_size;
    for (k, &id) in out.ids.iter().enumerate() {
        let pos = prompt.len() + k; // token index in `all`
        let row = &rows[(pos - 1) * v..pos * v];
        let argmax = (0..v)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(id as usize, argmax, "token {k} is not the argmax");
        assert!(
            (lps[pos - 1] - out.logprobs[k]).abs() < 1e-4,
            "logprob of token {k}"
        );
    }
}

fn requests(tok: &Tokenizer) -> Vec<GenRequest> {
    let prompts = [
        "class Inventory:",
        "def mean(values):\n    return",
        "Issue: median returns the wrong value",
        "import os",
        "x",
        "def clamp(value, lower, upper):\n    if lower > upper:\n        raise",
    ];
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| GenRequest {
            prompt: tok.encode(p).unwrap(),
            params: if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                sampled(100 + i as u64)
            },
            max_new_tokens: 10 + 3 * i,
            stop_ids: tok.stop_ids(),
            stop_strings: Vec::new(),
            constraint: None,
            min_allowed_mass: 0.0,
        })
        .collect()
}

#[test]
fn a_batch_gives_the_same_tokens_as_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let reqs = requests(&tok);
    let batched = generate(
        &model,
        Some(&tok),
        &reqs,
        &GenOptions {
            max_batch: 4,
            progress: false,
        },
    )
    .unwrap();
    for (i, r) in reqs.iter().enumerate() {
        let one = generate(
            &model,
            Some(&tok),
            std::slice::from_ref(r),
            &GenOptions::default(),
        )
        .unwrap();
        assert_eq!(batched[i].ids, one[0].ids, "request {i}");
        assert_eq!(batched[i].logprobs, one[0].logprobs, "request {i}");
    }
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let prompt = tok.encode("def parse_line(line):").unwrap();
    let run = |seed| {
        let r = GenRequest {
            prompt: prompt.clone(),
            params: SamplingParams {
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                seed,
            },
            max_new_tokens: 32,
            ..Default::default()
        };
        generate(&model, Some(&tok), &[r], &GenOptions::default()).unwrap()[0]
            .ids
            .clone()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn stop_tokens_and_stop_strings_end_sequences() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let prompt = tok.encode("def f():").unwrap();
    let free = generate(
        &model,
        Some(&tok),
        &[GenRequest {
            prompt: prompt.clone(),
            params: SamplingParams::greedy(),
            max_new_tokens: 16,
            ..Default::default()
        }],
        &GenOptions::default(),
    )
    .unwrap()
    .remove(0);
    assert_eq!(free.finish, FinishReason::Length);
    // Make the 4th greedy token a stop token: generation must end right there, keeping it.
    let stop = free.ids[3];
    let first = free.ids.iter().position(|&t| t == stop).unwrap();
    let out = generate(
        &model,
        Some(&tok),
        &[GenRequest {
            prompt: prompt.clone(),
            params: SamplingParams::greedy(),
            max_new_tokens: 16,
            stop_ids: vec![stop],
            ..Default::default()
        }],
        &GenOptions::default(),
    )
    .unwrap()
    .remove(0);
    assert_eq!(out.finish, FinishReason::Stop);
    assert_eq!(out.ids, free.ids[..=first].to_vec());
    // A stop string taken from the free text cuts the text before it.
    let text = free.text.clone();
    let chars: Vec<char> = text.chars().collect();
    if chars.len() >= 6 {
        let needle: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
        let out = generate(
            &model,
            Some(&tok),
            &[GenRequest {
                prompt,
                params: SamplingParams::greedy(),
                max_new_tokens: 16,
                stop_strings: vec![needle.clone()],
                ..Default::default()
            }],
            &GenOptions::default(),
        )
        .unwrap()
        .remove(0);
        assert_eq!(out.finish, FinishReason::StopString);
        assert!(!out.text.contains(&needle));
        assert!(text.starts_with(&out.text));
    }
}

#[test]
fn out_of_range_prompt_ids_are_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let r = GenRequest {
        prompt: vec![1, 2, 1_000_000],
        max_new_tokens: 4,
        ..Default::default()
    };
    let e = generate(&model, Some(&tok), &[r], &GenOptions::default()).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    assert!(model.score(&[0, 5_000_000]).is_err());
}

#[test]
fn tokenizer_and_init_are_deterministic() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, a.path(), 3, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    init_model(Preset::Tiny, b.path(), 3, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    for f in ["tokenizer.json", "model.safetensors", "config.json"] {
        let x = std::fs::read(a.path().join(f)).unwrap();
        let y = std::fs::read(b.path().join(f)).unwrap();
        assert!(x == y, "{f} differs between two runs with the same seed");
    }
    let size = std::fs::metadata(a.path().join("model.safetensors"))
        .unwrap()
        .len();
    assert!(size < 1_000_000, "tiny preset weights are {size} bytes");
}

#[test]
fn a_name_is_the_same_tokens_after_a_space_a_slash_or_a_line_start() {
    let d = tempfile::tempdir().unwrap();
    let (_, tok) = tiny(d.path());
    let name = tok.encode("wexdor42").unwrap();
    for text in [
        "from wexdor42 import money",
        "```\nwexdor42/money.py",
        "    wexdor42/\n",
        "/home/user/wexdor42/x.py",
    ] {
        let ids = tok.encode(text).unwrap();
        assert!(
            ids.windows(name.len()).any(|w| w == name.as_slice()),
            "{text:?} does not contain the tokens of the bare name"
        );
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "round trip");
    }
}

#[test]
fn constrained_answers_follow_the_grammar_and_keep_full_logprobs() {
    use sorft::swe::grammar::{AnswerGrammar, THINK_END};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let g = AnswerGrammar::files(["pkg/core.py", "pkg/util.py"], 1, 40);
    let prompt = tok.encode("Which file? <think>").unwrap();
    let reqs: Vec<GenRequest> = (0..6)
        .map(|s| GenRequest {
            prompt: prompt.clone(),
            params: sampled(s),
            max_new_tokens: 64,
            stop_ids: tok.stop_ids(),
            constraint: Some(Arc::new(g.clone())),
            ..Default::default()
        })
        .collect();
    let outs = generate(&model, Some(&tok), &reqs, &GenOptions::default()).unwrap();
    let mut whole = 0;
    for (o, r) in outs.iter().zip(&reqs) {
        // A random model never closes its thought by itself: the budget forces it.
        let i = o.text.find(THINK_END).expect("</think> is forced");
        let answer = &o.text[i + THINK_END.len()..];
        assert!(g.prefix_ok(answer), "{answer:?}");
        assert_eq!(o.forced.len(), o.ids.len());
        if o.finish == FinishReason::Stop {
            assert!(
                g.complete(answer),
                "stopped before a whole answer: {answer:?}"
            );
            // Once the answer is whole, the stop token is the only choice.
            assert_eq!(o.forced.last(), Some(&true));
            whole += 1;
        }
        // Log-probabilities are the unconstrained model's (what a teacher-forced pass recomputes).
        let mut all = r.prompt.clone();
        all.extend(&o.ids);
        let (lps, _) = model.score(&all).unwrap();
        for (k, lp) in o.logprobs.iter().enumerate() {
            let want = lps[r.prompt.len() + k - 1];
            assert!((want - lp).abs() < 1e-3, "token {k}: {lp} vs {want}");
        }
    }
    let answers: Vec<&str> = outs.iter().map(|o| o.text.as_str()).collect();
    assert!(
        whole >= 3,
        "only {whole} of 6 answers were completed: {answers:?}"
    );
    // Constrained decoding is reproducible and independent of the batch.
    let one = generate(&model, Some(&tok), &reqs[2..3], &GenOptions::default()).unwrap();
    assert_eq!(one[0], outs[2]);
}

/// Test-only thought shaper: outside a quote, after a few characters, a backtick must come next
/// (so a random model opens many quotes); the answer grammar decides everything else.
#[derive(Debug)]
struct QuoteOften(sorft::swe::grammar::AnswerGrammar);

impl sorft::model::constraint::TokenConstraint for QuoteOften {
    fn allowed(
        &self,
        text: &str,
        remaining: usize,
        pieces: &[Option<String>],
    ) -> Option<sorft::model::constraint::Allowed> {
        let mut a = self.0.allowed(text, remaining, pieces)?;
        let outside = text.matches('`').count() % 2 == 0;
        let since = text.rsplit('`').next().map_or(text.len(), str::len);
        if remaining > self.0.reserve && outside && since >= 4 && !text.contains("</") {
            for (ok, p) in a.pieces.iter_mut().zip(pieces) {
                *ok &= p.as_deref().is_some_and(|p| p.starts_with('`'));
            }
        }
        Some(a)
    }
}

#[test]
fn grounded_thoughts_quote_only_the_prompt_and_faithful_answers_follow_them() {
    use sorft::swe::grammar::{AnswerGrammar, THINK_END};
    use sorft::swe::grounding::{quotes, Faithful, GroundedThought, Naming};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let g = AnswerGrammar::files(["pkg/core.py", "pkg/util.py"], 1, 40);
    let ground = "from pkg import core\nvalues = core.median([1, 2])\npkg/util.py";
    let constraint = Arc::new(GroundedThought {
        inner: Arc::new(QuoteOften(g.clone())),
        ground: ground.to_string(),
        faithful: Some(Faithful {
            grammar: g.clone(),
            paths: vec![
                ("pkg/core.py".into(), Naming::Word("core".into())),
                ("pkg/util.py".into(), Naming::Word("util".into())),
            ],
            items: Vec::new(),
        }),
    });
    let prompt = tok
        .encode(&format!("{ground}\nWhich file? <think>"))
        .unwrap();
    let reqs: Vec<GenRequest> = (0..12)
        .map(|s| GenRequest {
            prompt: prompt.clone(),
            params: SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: s,
            },
            max_new_tokens: 64,
            stop_ids: tok.stop_ids(),
            constraint: Some(constraint.clone()),
            ..Default::default()
        })
        .collect();
    let outs = generate(&model, Some(&tok), &reqs, &GenOptions::default()).unwrap();
    let (mut quoted, mut narrowed) = (0, 0);
    for o in &outs {
        let i = o.text.find(THINK_END).expect("</think> is forced");
        let (thought, answer) = (&o.text[..i], &o.text[i + THINK_END.len()..]);
        let qs = quotes(thought);
        for q in &qs {
            assert!(
                ground.contains(q),
                "quote {q:?} is not in the prompt: {thought:?}"
            );
        }
        quoted += qs.len();
        assert!(g.prefix_ok(answer), "{answer:?}");
        let named: Vec<&str> = ["core", "util"]
            .into_iter()
            .filter(|w| {
                qs.iter()
                    .any(|q| q.split(|c: char| !c.is_alphanumeric()).any(|x| x == *w))
            })
            .collect();
        if let (Some(path), false) = (answer.lines().nth(2), named.is_empty()) {
            assert!(
                named.iter().any(|w| path == format!("pkg/{w}.py")),
                "{path:?} was not quoted in {thought:?}"
            );
            narrowed += 1;
        }
    }
    assert!(quoted >= 12, "too few quotes to test: {outs:?}");
    assert!(narrowed >= 1, "no answer followed a quote: {outs:?}");
}

/// Allows two fixed token ids and nothing else, never stops.
#[derive(Debug)]
struct TwoTokens(u32, u32);

impl sorft::model::constraint::TokenConstraint for TwoTokens {
    fn allowed(
        &self,
        _: &str,
        _: usize,
        pieces: &[Option<String>],
    ) -> Option<sorft::model::constraint::Allowed> {
        Some(sorft::model::constraint::Allowed {
            pieces: (0..pieces.len() as u32)
                .map(|i| i == self.0 || i == self.1)
                .collect(),
            stop: false,
        })
    }
}

#[test]
fn tokens_chosen_against_the_policy_count_as_forced() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (model, tok) = tiny(dir.path());
    let prompt = tok.encode("def f(x):").unwrap();
    let pieces = sorft::model::constraint::token_pieces(&tok);
    let ids: Vec<u32> = (0..pieces.len() as u32)
        .filter(|&i| pieces[i as usize].is_some())
        .take(2)
        .collect();
    let req = |min: f32| GenRequest {
        prompt: prompt.clone(),
        params: sampled(1),
        max_new_tokens: 8,
        constraint: Some(Arc::new(TwoTokens(ids[0], ids[1]))),
        min_allowed_mass: min,
        ..Default::default()
    };
    let outs = generate(
        &model,
        Some(&tok),
        &[req(0.0), req(0.5)],
        &GenOptions::default(),
    )
    .unwrap();
    // Same tokens either way; two choices are a decision unless the grammar held too little of
    // the policy's probability (two of 512 tokens of a random model: well under half).
    assert_eq!(outs[0].ids, outs[1].ids);
    assert!(outs[0].ids.iter().all(|i| ids.contains(i)));
    assert!(outs[0].forced.iter().all(|&f| !f));
    assert!(outs[1].forced.iter().all(|&f| f));
}
