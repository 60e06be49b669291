//! The skill library: skills distilled from diagnosed failures, stored as JSONL with where each
//! applies (the issue and feedback it came from), and found again for similar failures by BM25 over
//! the issue text and the feedback.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::swe::bm25::Bm25Index;
use crate::swe::subtask::Subtask;

/// Errors reading or writing a skill library.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    /// The file could not be read or written.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: String,
        /// What happened.
        msg: String,
    },
    /// A line is not a skill.
    #[error("{path}:{line}: not a skill record: {msg}")]
    Malformed {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// The parser's message.
        msg: String,
    },
}

/// One skill and where it applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skill {
    /// Stable id within the library (`skill-0001`, ...).
    pub id: String,
    /// The subtask it was learned on (reused only there).
    pub subtask: Subtask,
    /// The rule or diagnoser that wrote it.
    pub rule: String,
    /// The imperative itself.
    pub text: String,
    /// The diagnosis it was distilled from.
    pub diagnosis: String,
    /// Where it applies: the issue text and feedback of the failure it came from (BM25 document).
    pub applies_to: String,
    /// The instance it was learned on.
    pub source: String,
    /// Times it was reused for another failure.
    #[serde(default)]
    pub reused: usize,
    /// Guided retries with it that recovered the prompt.
    #[serde(default)]
    pub recovered: usize,
}

/// Skills with a BM25 index over where they apply.
#[derive(Clone, Debug, Default)]
pub struct SkillLibrary {
    skills: Vec<Skill>,
}

/// The BM25 query (and document) of a failure: its issue text and its feedback.
pub fn applies_text(problem: &str, feedback: &str) -> String {
    format!("{}\n{}", problem.trim_end(), feedback.trim_end())
}

impl SkillLibrary {
    /// An empty library.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads a JSONL library (a missing file is an empty library).
    pub fn load(path: &Path) -> Result<Self, SkillError> {
        let name = path.display().to_string();
        if !path.exists() {
            return Ok(Self::new());
        }
        let text = std::fs::read_to_string(path).map_err(|e| SkillError::Io {
            path: name.clone(),
            msg: e.to_string(),
        })?;
        let mut skills = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let s: Skill = serde_json::from_str(line).map_err(|e| SkillError::Malformed {
                path: name.clone(),
                line: i + 1,
                msg: e.to_string(),
            })?;
            skills.push(s);
        }
        Ok(Self { skills })
    }

    /// Writes the library as JSONL.
    pub fn save(&self, path: &Path) -> Result<(), SkillError> {
        let io = |e: std::io::Error| SkillError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        };
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        for s in &self.skills {
            let line = serde_json::to_string(s).map_err(|e| SkillError::Io {
                path: path.display().to_string(),
                msg: e.to_string(),
            })?;
            writeln!(f, "{line}").map_err(io)?;
        }
        f.flush().map_err(io)
    }

    /// The skills, in the order they were added.
    pub fn skills(&self) -> &[Skill] {
        &self.skills
    }

    /// Mutable access to skill `i`.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Skill> {
        self.skills.get_mut(i)
    }

    /// Number of skills.
    pub fn len(&self) -> usize {
        self.skills.len()
    }

    /// Whether the library is empty.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// Adds a skill (its id is assigned here) and returns its index. A skill with the same
    /// subtask and text is not stored twice: the existing one gains the new `applies_to` text
    /// (one more place where it applies) and its index is returned.
    pub fn add(&mut self, mut skill: Skill) -> usize {
        if let Some(i) = self
            .skills
            .iter()
            .position(|s| s.subtask == skill.subtask && s.text == skill.text)
        {
            let s = &mut self.skills[i];
            s.applies_to.push('\n');
            s.applies_to.push_str(&skill.applies_to);
            return i;
        }
        skill.id = format!("skill-{:04}", self.skills.len() + 1);
        self.skills.push(skill);
        self.skills.len() - 1
    }

    /// The index of the skill of `subtask` whose `applies_to` matches `query` best, when its BM25
    /// score is at least `min_ratio` times the score the query reaches against itself (1.0 = an
    /// identical text); `skip` skills are passed over.
    pub fn find(
        &self,
        subtask: Subtask,
        query: &str,
        min_ratio: f64,
        skip: &dyn Fn(&Skill) -> bool,
    ) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.skills.len())
            .filter(|&i| self.skills[i].subtask == subtask && !skip(&self.skills[i]))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let docs = candidates
            .iter()
            .map(|&i| (i.to_string(), self.skills[i].applies_to.as_str()))
            .chain(std::iter::once(("query".to_string(), query)));
        let index = Bm25Index::new(docs);
        let ranked = index.search(query, index.len());
        let own = ranked
            .iter()
            .find(|(id, _)| id == "query")
            .map(|(_, s)| *s)?;
        ranked
            .iter()
            .filter(|(id, _)| id != "query")
            .find_map(|(id, s)| (*s >= min_ratio * own).then(|| id.parse::<usize>().ok())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(subtask: Subtask, text: &str, applies: &str) -> Skill {
        Skill {
            id: String::new(),
            subtask,
            rule: "test".into(),
            text: text.into(),
            diagnosis: String::new(),
            applies_to: applies.into(),
            source: "x".into(),
            reused: 0,
            recovered: 0,
        }
    }

    #[test]
    fn similar_failures_reuse_a_skill_and_unrelated_ones_do_not() {
        let mut lib = SkillLibrary::new();
        let a = lib.add(skill(
            Subtask::File,
            "Follow the traceback.",
            "Traceback: KeyError in parse_header when reading csv files\n- no_overlap: io/readers.py",
        ));
        lib.add(skill(
            Subtask::Line,
            "Pick the comparison.",
            "Traceback: KeyError in parse_header when reading csv files\n- no_overlap: line 3",
        ));
        lib.add(skill(
            Subtask::File,
            "Read the plot docs.",
            "Legend colours are wrong in the bar chart renderer",
        ));
        assert_eq!(lib.skills()[a].id, "skill-0001");
        // The same lesson learned again is one skill with one more place where it applies.
        let again = lib.add(skill(
            Subtask::File,
            "Follow the traceback.",
            "Traceback in the csv sniffer",
        ));
        assert_eq!((again, lib.len()), (a, 3));
        assert!(lib.skills()[a].applies_to.ends_with("csv sniffer"));
        let q = "KeyError in parse_header when reading csv files with a Traceback\n- no_overlap: io/writers.py";
        assert_eq!(lib.find(Subtask::File, q, 0.5, &|_| false), Some(a));
        // Another subtask's skill is never returned, and an unrelated text finds nothing.
        assert_eq!(lib.find(Subtask::Edit, q, 0.5, &|_| false), None);
        assert_eq!(
            lib.find(
                Subtask::File,
                "division by zero in the scheduler",
                0.5,
                &|_| false
            ),
            None
        );
        // Skipped skills (e.g. ones that leak for this instance) are passed over.
        assert_eq!(
            lib.find(Subtask::File, q, 0.5, &|s| s.id == "skill-0001"),
            None
        );
    }

    #[test]
    fn round_trips_and_rejects_malformed_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("skills.jsonl");
        let mut lib = SkillLibrary::new();
        lib.add(skill(Subtask::Edit, "Copy SEARCH verbatim.", "issue"));
        lib.save(&p).unwrap();
        let back = SkillLibrary::load(&p).unwrap();
        assert_eq!(back.skills(), lib.skills());
        assert!(SkillLibrary::load(&dir.path().join("none.jsonl"))
            .unwrap()
            .is_empty());
        std::fs::write(&p, "{\"id\": 3}\n").unwrap();
        let e = SkillLibrary::load(&p).unwrap_err().to_string();
        assert!(e.contains("skills.jsonl:1"), "{e}");
    }
}
