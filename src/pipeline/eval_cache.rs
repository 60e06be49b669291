//! Evaluations a resumed run reuses: each evaluated checkpoint's result is saved as
//! `eval_<stage>.json` with a fingerprint of what it measured (the checkpoint's weights and
//! tokenizer, the evaluation settings); `repro --resume` evaluates again only the checkpoints
//! whose fingerprint changed, so a rerun of stage 2 alone does not pay for the other two.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::cuda::registry::fnv1a64;

/// Files of a checkpoint folder whose bytes the fingerprint covers.
const CHECKPOINT_FILES: [&str; 3] = [
    "model.safetensors",
    "adapter_model.safetensors",
    "tokenizer.json",
];

/// The file of a stage's cached evaluation in a run folder.
pub fn cache_path(run: &Path, stage: &str) -> PathBuf {
    run.join(format!("eval_{}.json", stage.replace('+', "_")))
}

/// Content hash of a checkpoint folder and the settings it is evaluated with.
pub fn fingerprint(checkpoint: &Path, settings: &impl Serialize) -> anyhow::Result<String> {
    let mut parts: Vec<Vec<u8>> = vec![serde_json::to_vec(settings)?];
    for f in CHECKPOINT_FILES {
        let p = checkpoint.join(f);
        if p.is_file() {
            parts.push(f.as_bytes().to_vec());
            parts.push(std::fs::read(&p).with_context(|| p.display().to_string())?);
        }
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    Ok(format!("{:016x}", fnv1a64(&refs)))
}

/// The cached result of `stage` when its fingerprint is `fp`; `None` when absent, stale or
/// unreadable (then the checkpoint is evaluated again).
pub fn load<T: DeserializeOwned>(run: &Path, stage: &str, fp: &str) -> Option<T> {
    let text = std::fs::read_to_string(cache_path(run, stage)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if v.get("fingerprint")?.as_str()? != fp {
        return None;
    }
    serde_json::from_value(v.get("result")?.clone()).ok()
}

/// Saves `result` as the evaluation of `stage` with fingerprint `fp`.
pub fn store<T: Serialize>(run: &Path, stage: &str, fp: &str, result: &T) -> anyhow::Result<()> {
    let p = cache_path(run, stage);
    let text = serde_json::to_string(&serde_json::json!({"fingerprint": fp, "result": result}))?;
    std::fs::write(&p, text).with_context(|| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_checkpoint_or_setting_misses_the_cache() {
        let run = tempfile::tempdir().unwrap();
        let ck = tempfile::tempdir().unwrap();
        std::fs::write(ck.path().join("model.safetensors"), b"weights").unwrap();
        let fp = fingerprint(ck.path(), &("eval", 1)).unwrap();
        store(run.path(), "sft+rl", &fp, &vec![1.5, 2.0]).unwrap();
        assert_eq!(
            load::<Vec<f64>>(run.path(), "sft+rl", &fp),
            Some(vec![1.5, 2.0])
        );
        assert_eq!(load::<Vec<f64>>(run.path(), "sft", &fp), None);
        assert_ne!(fp, fingerprint(ck.path(), &("eval", 2)).unwrap());
        std::fs::write(ck.path().join("model.safetensors"), b"weightz").unwrap();
        let fp2 = fingerprint(ck.path(), &("eval", 1)).unwrap();
        assert_ne!(fp, fp2);
        assert_eq!(load::<Vec<f64>>(run.path(), "sft+rl", &fp2), None);
        std::fs::write(cache_path(run.path(), "sft+rl"), "{truncated").unwrap();
        assert_eq!(load::<Vec<f64>>(run.path(), "sft+rl", &fp), None);
    }
}
