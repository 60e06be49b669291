//! `sorft serve-reward`: sorft's rewards as a service for Ray-based RL engines.
//!
//! The protocol is OpenRLHF's remote reward model: POST `{"query": [..], "prompts": [..],
//! "labels": [..]}` (one entry per sample; `query` is prompt + response as the engine decoded it,
//! `labels` the exported [`RewardLabel`] JSON) and get `{"rewards": [..], "scores": [..],
//! "extra_logs": {name: [..]}}` back, plus `details` (one object per sample). This module parses
//! requests and scores them with exactly the rule rewards sorft trains with
//! ([`RewardLabel::reward`]); with an [`Executor`], edit answers also run in the sandbox (the
//! execution reward). The HTTP server around it is [`http`].

#[cfg(feature = "serve")]
pub mod http;

use crate::pipeline::export::RewardLabel;
use crate::rft::eval::edit_to_patch;
use crate::rft::rl::zero_reason_name;
use crate::sandbox::runner::{run_instance, MirrorRepos, RunStatus, SandboxConfig};
use crate::swe::instance::Instance;
use crate::swe::reward::RewardBreakdown;
use crate::swe::subtask::{EditReward, Subtask};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// End-of-turn markers an engine may leave at the end of a decoded response; stripped before
/// scoring, as sorft's own generation stops before them.
pub const END_MARKERS: [&str; 6] = [
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "</s>",
    "<|end|>",
];

/// A client error: the request is refused with HTTP 400 and this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// One parsed request: per sample the decoded query, the prompt and the label.
#[derive(Debug, Clone)]
pub struct RewardBatch {
    /// Prompt + response as the engine decoded it (or the response alone).
    pub queries: Vec<String>,
    /// The prompts (empty when the query is the response alone).
    pub prompts: Vec<String>,
    /// The parsed labels.
    pub labels: Vec<RewardLabel>,
}

impl RewardBatch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.queries.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.queries.is_empty()
    }
}

fn string_list(obj: &Map<String, Value>, key: &str) -> Result<Option<Vec<String>>, BadRequest> {
    let Some(v) = obj.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = v else {
        return Err(BadRequest(format!(
            "field `{key}` must be a list of strings, not {}",
            kind(v)
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| match x {
            Value::String(s) => Ok(s.clone()),
            other => Err(BadRequest(format!(
                "field `{key}` item {i} must be a string, not {}",
                kind(other)
            ))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses a request body. Labels may be JSON text (as exported) or JSON objects; `prompts` may be
/// left out. Every refusal names the field and, for a list, the item.
pub fn parse_request(body: &[u8]) -> Result<RewardBatch, BadRequest> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("body is not valid JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(BadRequest(format!(
            "body must be a JSON object with `query`, `prompts`, `labels`, not {}",
            kind(&v)
        )));
    };
    let queries = string_list(&obj, "query")?
        .ok_or_else(|| BadRequest("missing field `query` (a list of strings)".into()))?;
    let prompts =
        string_list(&obj, "prompts")?.unwrap_or_else(|| vec![String::new(); queries.len()]);
    let raw_labels = match obj.get("labels") {
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(BadRequest(format!(
                "field `labels` must be a list, not {}",
                kind(other)
            )))
        }
        None => {
            return Err(BadRequest(
                "missing field `labels` (a list of sorft reward labels)".into(),
            ))
        }
    };
    if prompts.len() != queries.len() || raw_labels.len() != queries.len() {
        return Err(BadRequest(format!(
            "`query`, `prompts` and `labels` must have the same length (got {}, {}, {})",
            queries.len(),
            prompts.len(),
            raw_labels.len()
        )));
    }
    let labels = raw_labels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let parsed = match l {
                Value::String(s) => RewardLabel::parse(s),
                Value::Object(_) => RewardLabel::parse(&l.to_string()),
                other => Err(format!(
                    "must be a label string or object, not {}",
                    kind(other)
                )),
            };
            parsed.map_err(|e| BadRequest(format!("`labels` item {i}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RewardBatch {
        queries,
        prompts,
        labels,
    })
}

/// The model's response inside an engine's query: the query without its prompt prefix (when the
/// query starts with the prompt) and without trailing [`END_MARKERS`] and whitespace after them.
pub fn response_text<'a>(query: &'a str, prompt: &str) -> &'a str {
    let mut r = if !prompt.is_empty() {
        query.strip_prefix(prompt).unwrap_or(query)
    } else {
        query
    };
    loop {
        let t = r.trim_end();
        match END_MARKERS.iter().find_map(|m| t.strip_suffix(m)) {
            Some(s) => r = s,
            None => break,
        }
    }
    r
}

/// Runs edit answers in the sandbox: the answer's edit applied as a patch to the instance's
/// repository, the instance's tests run and graded (SWE-bench's resolved).
pub struct Executor {
    instances: HashMap<String, Instance>,
    mirrors: MirrorRepos,
    sandbox: SandboxConfig,
}

impl Executor {
    /// An executor over `instances` whose repositories are mirrors under `repos`.
    pub fn new(instances: Vec<Instance>, repos: &std::path::Path, sandbox: SandboxConfig) -> Self {
        Executor {
            instances: instances
                .into_iter()
                .map(|i| (i.instance_id.clone(), i))
                .collect(),
            mirrors: MirrorRepos::new(repos),
            sandbox,
        }
    }

    /// Number of instances known.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Whether no instance is known.
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
}

/// The sandbox's verdict on one edit answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// True when the tests resolve the instance.
    pub resolved: bool,
    /// The run's status name (`resolved`, `unresolved`, `no_patch`, `patch_failed`, ...).
    pub status: String,
}

/// The score of one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleScore {
    /// The reward given to the engine.
    pub reward: f64,
    /// sorft's rule reward and its breakdown.
    pub rule: RewardBreakdown,
    /// The subtask scored.
    pub subtask: Subtask,
    /// The sandbox run, when the sample is an edit and execution is on.
    pub execution: Option<Execution>,
}

/// Scores samples: rule rewards always, execution rewards for edits when an [`Executor`] is set.
pub struct Scorer {
    /// Edit rule reward (SoRFT's line F-beta or SWE-RL's patch similarity).
    pub edit_reward: EditReward,
    /// The sandbox, for execution rewards.
    pub executor: Option<Executor>,
}

fn status_name(s: RunStatus) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "error".into())
}

impl Scorer {
    /// A rule-only scorer.
    pub fn rules(edit_reward: EditReward) -> Scorer {
        Scorer {
            edit_reward,
            executor: None,
        }
    }

    /// Checks what parsing cannot: with execution on, every edit label's instance must be known.
    pub fn check(&self, batch: &RewardBatch) -> Result<(), BadRequest> {
        let Some(ex) = &self.executor else {
            return Ok(());
        };
        for (i, l) in batch.labels.iter().enumerate() {
            if l.subtask == Subtask::Edit && !ex.instances.contains_key(&l.instance_id) {
                return Err(BadRequest(format!(
                    "`labels` item {i}: instance {} is not among the service's --instances",
                    l.instance_id
                )));
            }
        }
        Ok(())
    }

    /// Scores one sample.
    pub fn score_one(&self, query: &str, prompt: &str, label: &RewardLabel) -> SampleScore {
        let answer = response_text(query, prompt);
        let rule = label.reward(answer, self.edit_reward);
        let mut s = SampleScore {
            reward: rule.reward,
            rule,
            subtask: label.subtask,
            execution: None,
        };
        if let (Some(ex), Subtask::Edit) = (&self.executor, label.subtask) {
            let e = execute(ex, label, answer);
            s.reward = if e.resolved { 1.0 } else { 0.0 };
            s.execution = Some(e);
        }
        s
    }

    /// Scores a batch, in order.
    pub fn score(&self, batch: &RewardBatch) -> Vec<SampleScore> {
        (0..batch.len())
            .map(|i| self.score_one(&batch.queries[i], &batch.prompts[i], &batch.labels[i]))
            .collect()
    }
}

fn execute(ex: &Executor, label: &RewardLabel, answer: &str) -> Execution {
    let Some(inst) = ex.instances.get(&label.instance_id) else {
        return Execution {
            resolved: false,
            status: "unknown_instance".into(),
        };
    };
    let Some(patch) = edit_to_patch(&label.to_record(), answer) else {
        return Execution {
            resolved: false,
            status: "no_patch".into(),
        };
    };
    let r = run_instance(&ex.sandbox, &ex.mirrors, inst, "sorft-serve", &patch);
    Execution {
        resolved: r.resolved,
        status: status_name(r.status),
    }
}

/// The response body: OpenRLHF's `rewards`, `scores` (rewards clipped to [0, 1], for its dynamic
/// filtering) and `extra_logs` (numeric, one value per sample; `executed` and `resolved` whenever
/// execution is on, so every answer of a service has the same keys), plus `details` per sample.
pub fn response_json(scores: &[SampleScore], execution_on: bool) -> Value {
    let col = |f: &dyn Fn(&SampleScore) -> f64| -> Value {
        Value::Array(scores.iter().map(|s| json!(f(s))).collect())
    };
    let mut logs = Map::new();
    logs.insert("rule_reward".into(), col(&|s| s.rule.reward));
    logs.insert("precision".into(), col(&|s| s.rule.precision));
    logs.insert("recall".into(), col(&|s| s.rule.recall));
    logs.insert("predicted".into(), col(&|s| s.rule.predicted as f64));
    logs.insert(
        "format_error".into(),
        col(&|s| {
            let fmt = s.rule.zero_reason.as_ref().map(zero_reason_name);
            f64::from(u8::from(matches!(
                fmt,
                Some("empty_answer" | "format_error" | "search_not_found" | "unknown_file")
            )))
        }),
    );
    logs.insert(
        "invented_target".into(),
        col(&|s| {
            let z = s.rule.zero_reason.as_ref().map(zero_reason_name);
            f64::from(u8::from(z == Some("invented_target")))
        }),
    );
    if execution_on {
        logs.insert(
            "executed".into(),
            col(&|s| f64::from(u8::from(s.execution.is_some()))),
        );
        logs.insert(
            "resolved".into(),
            col(&|s| f64::from(u8::from(s.execution.as_ref().is_some_and(|e| e.resolved)))),
        );
    }
    let details: Vec<Value> = scores
        .iter()
        .map(|s| {
            let mut d = json!({
                "subtask": s.subtask.name(),
                "rule_reward": s.rule.reward,
                "truth": s.rule.truth,
                "zero_reason": s.rule.zero_reason.as_ref().map(zero_reason_name),
            });
            if let Some(e) = &s.execution {
                d["execution"] = json!({"resolved": e.resolved, "status": e.status});
            }
            d
        })
        .collect();
    json!({
        "rewards": col(&|s| s.reward),
        "scores": col(&|s| s.reward.clamp(0.0, 1.0)),
        "extra_logs": logs,
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swe::subtask::Shown;
    use crate::swe::truth::GroundTruth;

    fn label() -> RewardLabel {
        RewardLabel {
            v: crate::pipeline::export::LABEL_VERSION,
            instance_id: "o__r-1".into(),
            repo: "o/r".into(),
            subtask: Subtask::File,
            shown: Shown {
                files: vec!["a.py".into(), "b.py".into()],
                ..Shown::default()
            },
            truth: GroundTruth {
                files: vec!["a.py".into()],
                ..GroundTruth::default()
            },
            gold_patch: String::new(),
        }
    }

    #[test]
    fn responses_lose_the_prompt_and_end_markers() {
        assert_eq!(response_text("P: hia.py<|im_end|>\n", "P: hi"), "a.py");
        assert_eq!(response_text("a.py</s><|endoftext|>", ""), "a.py");
        assert_eq!(response_text("other a.py", "P"), "other a.py");
    }

    #[test]
    fn requests_are_parsed_and_scored_like_sorft() {
        let l = label().to_json();
        let body = json!({"query": ["PROMPTa.py<|im_end|>", "c.py"], "prompts": ["PROMPT", ""],
                          "labels": [l, serde_json::from_str::<Value>(&l).unwrap()]});
        let batch = parse_request(body.to_string().as_bytes()).unwrap();
        let s = Scorer::rules(EditReward::LineFbeta).score(&batch);
        assert!((s[0].reward - 1.0).abs() < 1e-12);
        assert_eq!(s[1].reward, 0.0);
        let out = response_json(&s, false);
        assert_eq!(out["rewards"].as_array().unwrap().len(), 2);
        assert_eq!(out["extra_logs"]["invented_target"][1], 1.0);
        assert_eq!(out["details"][1]["zero_reason"], "invented_target");
    }

    #[test]
    fn malformed_requests_name_the_problem() {
        let err = |b: &str| parse_request(b.as_bytes()).unwrap_err().0;
        assert!(err("{").contains("not valid JSON"));
        assert!(err("[1]").contains("JSON object"));
        assert!(err(r#"{"labels": []}"#).contains("missing field `query`"));
        assert!(err(r#"{"query": "x", "labels": []}"#).contains("list of strings"));
        assert!(err(r#"{"query": [1], "labels": [""]}"#).contains("item 0 must be a string"));
        assert!(err(r#"{"query": ["a"], "labels": []}"#).contains("same length"));
        assert!(err(r#"{"query": ["a"], "labels": ["{}"]}"#).contains("`labels` item 0"));
        assert!(err(r#"{"query": ["a"], "labels": [3]}"#).contains("not a number"));
    }
}
