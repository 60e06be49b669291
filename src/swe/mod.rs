//! The SWE task layer: instances and repositories, diffs, code maps (tree-sitter), ground truth from gold
//! patches, the four SoRFT subtasks (prompts, answer parsers, rewards), the offline task generator and BM25.
//!
//! Nothing here knows about models; everything is testable on its own.

pub mod answer;
pub mod codemap;
pub mod diff;
pub mod edit;
pub mod instance;
pub mod prompt;
pub mod repo;
pub mod reward;
pub mod subtask;
pub mod synth;
pub mod truth;
