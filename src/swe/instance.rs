//! SWE-bench task instances: the JSONL format read and written as the public files use it.
//!
//! `FAIL_TO_PASS` / `PASS_TO_PASS` are accepted both as JSON-encoded strings (the public SWE-bench files)
//! and as plain arrays; they are written back as JSON-encoded strings, the public format. Fields this
//! struct does not name are kept in [`Instance::extra`] and written back unchanged.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// Errors reading or writing instance files.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// One line is not a valid instance; the message names the field.
    #[error("{path}:{line}: {msg}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (serde's message, naming the field).
        msg: String,
    },
}

/// One SWE-bench task instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Instance {
    /// Unique id, e.g. `astropy__astropy-12907`.
    pub instance_id: String,
    /// Repository as `owner/name`.
    pub repo: String,
    /// Commit the task starts from.
    pub base_commit: String,
    /// Gold patch (unified diff) that resolves the issue, without test changes.
    #[serde(default, deserialize_with = "string_or_null")]
    pub patch: String,
    /// Patch adding or changing the tests that check the fix.
    #[serde(default, deserialize_with = "string_or_null")]
    pub test_patch: String,
    /// The issue text.
    #[serde(default, deserialize_with = "string_or_null")]
    pub problem_statement: String,
    /// Comments on the issue before the fix.
    #[serde(default, deserialize_with = "string_or_null")]
    pub hints_text: String,
    /// Creation time as written in the source file.
    #[serde(default, deserialize_with = "string_or_null")]
    pub created_at: String,
    /// Package version (a string; numbers are accepted and turned into strings).
    #[serde(default, deserialize_with = "string_or_number")]
    pub version: String,
    /// Tests that fail before the gold patch and pass after it.
    #[serde(
        rename = "FAIL_TO_PASS",
        default,
        deserialize_with = "test_list",
        serialize_with = "encoded_test_list"
    )]
    pub fail_to_pass: Vec<String>,
    /// Tests that pass both before and after the gold patch.
    #[serde(
        rename = "PASS_TO_PASS",
        default,
        deserialize_with = "test_list",
        serialize_with = "encoded_test_list"
    )]
    pub pass_to_pass: Vec<String>,
    /// Commit used to set up the environment.
    #[serde(default, deserialize_with = "string_or_null")]
    pub environment_setup_commit: String,
    /// Every other field of the record, kept for the round trip.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Instance {
    /// Parses one JSON record.
    pub fn from_json(text: &str) -> Result<Instance, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Parses one JSON record; the error message names the offending field when there is one.
    pub fn from_json_explained(text: &str) -> Result<Instance, String> {
        Instance::from_json(text).map_err(|e| explain(text, e))
    }

    /// Serialises to one JSON line (no trailing newline).
    pub fn to_json(&self) -> String {
        // Serialising plain strings and maps of JSON values cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The mirror folder name for this instance's repository: `owner/name` -> `owner__name`.
    pub fn repo_dir_name(&self) -> String {
        repo_dir_name(&self.repo)
    }
}

/// The `--repos` folder name of a repository: `owner/name` -> `owner__name`.
pub fn repo_dir_name(repo: &str) -> String {
    repo.replace('/', "__")
}

/// Reads instances from JSONL text; `path` is only used in error messages. Blank lines are skipped.
pub fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<Instance>, InstanceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let inst = Instance::from_json_explained(line).map_err(|msg| InstanceError::Parse {
            path: path.to_path_buf(),
            line: i + 1,
            msg,
        })?;
        out.push(inst);
    }
    Ok(out)
}

/// Reads an instance JSONL file (one record per line).
pub fn read_jsonl(path: &Path) -> Result<Vec<Instance>, InstanceError> {
    let file = std::fs::File::open(path).map_err(|error| InstanceError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|error| InstanceError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            Instance::from_json_explained(&line).map_err(|msg| InstanceError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                msg,
            })?,
        );
    }
    Ok(out)
}

/// Writes instances as JSONL, one record per line.
pub fn write_jsonl(path: &Path, instances: &[Instance]) -> Result<(), InstanceError> {
    let io = |error| InstanceError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    for inst in instances {
        writeln!(w, "{}", inst.to_json()).map_err(io)?;
    }
    w.flush().map_err(io)
}

/// Names the field behind a deserialisation error (serde_json reports type errors by position only).
fn explain(text: &str, err: serde_json::Error) -> String {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return err.to_string();
    };
    for field in ["instance_id", "repo", "base_commit"] {
        match map.get(field) {
            None => return format!("missing field `{field}`"),
            Some(serde_json::Value::String(_)) => {}
            Some(v) => return format!("field `{field}`: expected a string, found {v}"),
        }
    }
    for field in [
        "patch",
        "test_patch",
        "problem_statement",
        "hints_text",
        "created_at",
        "environment_setup_commit",
    ] {
        if let Some(v) = map.get(field) {
            if !v.is_string() && !v.is_null() {
                return format!("field `{field}`: expected a string, found {v}");
            }
        }
    }
    for field in ["FAIL_TO_PASS", "PASS_TO_PASS"] {
        if let Some(v) = map.get(field) {
            if test_list(v.clone()).is_err() {
                return format!("field `{field}`: {err}");
            }
        }
    }
    err.to_string()
}

fn string_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(String::new()),
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        other => Err(serde::de::Error::custom(format!(
            "expected a string or a number, found {other}"
        ))),
    }
}

fn test_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    use serde::de::Error;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        serde_json::Value::String(s) => serde_json::from_str::<Vec<String>>(&s)
            .map_err(|e| D::Error::custom(format!("not a JSON-encoded list of test names: {e}"))),
        v @ serde_json::Value::Array(_) => serde_json::from_value::<Vec<String>>(v)
            .map_err(|e| D::Error::custom(format!("not a list of test names: {e}"))),
        other => Err(D::Error::custom(format!(
            "expected a list of test names, found {other}"
        ))),
    }
}

fn encoded_test_list<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    let text = serde_json::to_string(v).map_err(serde::ser::Error::custom)?;
    s.serialize_str(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_encoded_and_plain_lists_and_keeps_extra_fields() {
        let a = r#"{"instance_id":"o__r-1","repo":"o/r","base_commit":"abc","FAIL_TO_PASS":"[\"t1\", \"t2\"]","PASS_TO_PASS":["t3"],"version":3.1,"hints_text":null,"extra_field":{"k":[1,2]}}"#;
        let inst = Instance::from_json(a).unwrap();
        assert_eq!(inst.fail_to_pass, vec!["t1", "t2"]);
        assert_eq!(inst.pass_to_pass, vec!["t3"]);
        assert_eq!(inst.version, "3.1");
        assert_eq!(inst.extra["extra_field"]["k"][1], 2);
        let back = Instance::from_json(&inst.to_json()).unwrap();
        assert_eq!(back, inst);
        let v: serde_json::Value = serde_json::from_str(&inst.to_json()).unwrap();
        assert_eq!(v["FAIL_TO_PASS"], "[\"t1\",\"t2\"]");
        assert!(v.get("extra_field").is_some());
    }

    #[test]
    fn bad_field_names_file_line_and_field() {
        let text = "{\"instance_id\":\"x\",\"repo\":\"o/r\",\"base_commit\":\"c\"}\n{\"instance_id\":\"y\",\"repo\":\"o/r\",\"base_commit\":\"c\",\"FAIL_TO_PASS\":\"[1,\"}\n";
        let err = parse_jsonl(text, Path::new("inst.jsonl")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("inst.jsonl:2:"), "{msg}");
        assert!(msg.contains("JSON-encoded list"), "{msg}");
        let missing = parse_jsonl("{\"repo\":\"o/r\"}", Path::new("f")).unwrap_err();
        assert!(missing.to_string().contains("instance_id"), "{missing}");
        let wrong = parse_jsonl(
            "{\"instance_id\":\"a\",\"repo\":\"o/r\",\"base_commit\":\"c\",\"patch\":7}",
            Path::new("f"),
        )
        .unwrap_err();
        assert_eq!(
            wrong.to_string(),
            "f:1: field `patch`: expected a string, found 7"
        );
    }
}
