//! SWE-bench prediction files: JSONL (or a JSON array) of
//! `{instance_id, model_name_or_path, model_patch}`.

use crate::sandbox::error::{Result, SandboxError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One prediction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Prediction {
    /// The instance it answers.
    pub instance_id: String,
    /// The producer.
    #[serde(default)]
    pub model_name_or_path: String,
    /// The change (unified diff or SEARCH/REPLACE blocks); null means empty.
    #[serde(default)]
    pub model_patch: Option<String>,
}

/// Reads predictions; errors name the file and line.
pub fn read_predictions(path: &Path) -> Result<Vec<Prediction>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| SandboxError::io(format!("reading {}", path.display()), e))?;
    let input_err = |message: String| SandboxError::Input {
        file: path.to_path_buf(),
        message,
    };
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(&text).map_err(|e| input_err(e.to_string()));
    }
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(line).map_err(|e| input_err(format!("line {}: {e}", i + 1)))?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_and_array_and_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.jsonl");
        std::fs::write(
            &p,
            "{\"instance_id\":\"a\",\"model_name_or_path\":\"m\",\"model_patch\":\"x\"}\n\n{\"instance_id\":\"b\",\"model_patch\":null}\n",
        )
        .unwrap();
        let v = read_predictions(&p).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].model_patch, None);
        std::fs::write(&p, "[{\"instance_id\":\"a\"}]").unwrap();
        assert_eq!(read_predictions(&p).unwrap().len(), 1);
        std::fs::write(&p, "{\"instance_id\":\"a\"}\n{oops\n").unwrap();
        let e = read_predictions(&p).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }
}
