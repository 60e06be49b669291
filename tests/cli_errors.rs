//! Bad input gets a clear one-line error naming the file and the field, exit code 1, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use sorft::engine::DType;
use sorft::model::weights::{save_safetensors, HostTensor, WeightFiles};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(name)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Runs `sorft score` on a model dir; asserts failure with one `error:` line; returns it.
fn score_error(dir: &Path, ids: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["score", "--device", "cpu", "--model"])
        .arg(dir)
        .args(["--ids", ids])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

#[test]
fn a_missing_shard_is_named() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_mha_untied_sharded"), t.path());
    std::fs::remove_file(t.path().join("model-00002-of-00003.safetensors")).unwrap();
    let e = score_error(t.path(), "1,2,3");
    assert!(
        e.contains("model-00002-of-00003.safetensors is missing"),
        "{e}"
    );
    assert!(e.contains("model.safetensors.index.json"), "{e}");
}

#[test]
fn a_partial_shard_is_named() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_mha_untied_sharded"), t.path());
    std::fs::copy(
        t.path().join("model-00001-of-00003.safetensors"),
        t.path().join("model-00002-of-00003.safetensors"),
    )
    .unwrap();
    let e = score_error(t.path(), "1,2,3");
    assert!(e.contains("model-00002-of-00003.safetensors"), "{e}");
    assert!(e.contains("partial shard"), "{e}");
}

#[test]
fn a_truncated_safetensors_file_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_gqa_tied"), t.path());
    let p = t.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = score_error(t.path(), "1,2,3");
    assert!(
        e.contains("model.safetensors") && e.contains("not a valid safetensors file"),
        "{e}"
    );
}

fn rewrite_tensor(dir: &Path, name: &str, t: HostTensor) {
    let w = WeightFiles::open(dir).unwrap();
    let mut all = BTreeMap::new();
    for (n, e) in &w.tensors {
        let s = &w.shards[e.shard];
        all.insert(
            n.clone(),
            HostTensor {
                dtype: e.dtype,
                shape: e.shape.clone(),
                bytes: s.map[e.start..e.end].to_vec(),
            },
        );
    }
    all.insert(name.to_string(), t);
    drop(w);
    save_safetensors(&dir.join("model.safetensors"), &all).unwrap();
}

#[test]
fn a_tensor_with_the_wrong_shape_is_named() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_gqa_tied"), t.path());
    rewrite_tensor(
        t.path(),
        "model.layers.1.self_attn.k_proj.weight",
        HostTensor::f32(&[8, 32], &[0.5; 256]),
    );
    let e = score_error(t.path(), "1,2,3");
    assert!(e.contains("model.layers.1.self_attn.k_proj.weight"), "{e}");
    assert!(e.contains("shape [8, 32], expected [16, 32]"), "{e}");
}

#[test]
fn a_tensor_with_the_wrong_dtype_is_named() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_gqa_tied"), t.path());
    rewrite_tensor(
        t.path(),
        "model.norm.weight",
        HostTensor {
            dtype: DType::U32,
            shape: vec![32],
            bytes: vec![0; 128],
        },
    );
    let e = score_error(t.path(), "1,2,3");
    assert!(e.contains("model.norm.weight") && e.contains("U32"), "{e}");
}

#[test]
fn an_unsupported_architecture_is_refused() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_gqa_tied"), t.path());
    let p = t.path().join("config.json");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("\"qwen2\"", "\"gpt2\"");
    std::fs::write(&p, text).unwrap();
    let e = score_error(t.path(), "1,2,3");
    assert!(
        e.contains("config.json") && e.contains("unsupported architecture") && e.contains("gpt2"),
        "{e}"
    );
}

#[test]
fn a_config_field_of_the_wrong_type_is_named() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_gqa_tied"), t.path());
    let p = t.path().join("config.json");
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("\"hidden_size\": 32", "\"hidden_size\": \"big\"");
    std::fs::write(&p, text).unwrap();
    let e = score_error(t.path(), "1,2,3");
    assert!(e.contains("config.json: hidden_size"), "{e}");
}

#[test]
fn a_tokenizer_larger_than_the_vocabulary_is_refused() {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&fixture("qwen2_gqa_tied"), t.path());
    let m = tempfile::tempdir().unwrap();
    sorft::model::init::init_model(
        sorft::model::init::Preset::Tiny,
        m.path(),
        1,
        &[sorft::model::init::EMBEDDED_CORPUS.to_string()],
    )
    .unwrap();
    std::fs::copy(
        m.path().join("tokenizer.json"),
        t.path().join("tokenizer.json"),
    )
    .unwrap();
    let e = score_error(t.path(), "1,2,3");
    assert!(
        e.contains("tokenizer.json") && e.contains("vocab_size 96"),
        "{e}"
    );
}

#[test]
fn token_ids_out_of_range_and_malformed_ids_are_errors() {
    let dir = fixture("qwen2_gqa_tied");
    let e = score_error(&dir, "1,2,96");
    assert!(e.contains("token id 96 is out of range"), "{e}");
    let e = score_error(&dir, "1,x");
    assert!(e.contains("--ids"), "{e}");
}

#[test]
fn a_missing_model_directory_is_named() {
    let e = score_error(Path::new("/nonexistent/model"), "1,2");
    assert!(e.contains("/nonexistent/model"), "{e}");
}
