//! The SWE task layer: instances and repositories, diffs, code maps (tree-sitter), ground truth from gold
//! patches, the four SoRFT subtasks (prompts, answer parsers, rewards), the offline task generator and BM25.
//!
//! Nothing here knows about models; everything is testable on its own. Entry points:
//! - [`instance`]: SWE-bench JSONL ([`instance::read_jsonl`], [`instance::Instance`]);
//!   [`repo`]: snapshots of `--repos DIR/owner__name` mirrors ([`repo::RepoStore::snapshot`]);
//! - [`diff`]: git unified diffs ([`diff::Patch::parse`], `apply_to_files` / `apply_to_dir`,
//!   [`diff::unified_diff`]); [`edit`]: SEARCH/REPLACE blocks ([`edit::parse_blocks`],
//!   [`edit::apply_blocks`], [`edit::blocks_to_patch`]);
//! - [`codemap`]: definitions, skeletons, tree views, windows; [`truth::ground_truth`];
//! - [`subtask`]: records per (instance, subtask) with [`subtask::SubtaskRecord::reward`];
//!   [`prompt`], [`answer`] and [`reward`] hold the pieces;
//! - [`synth::generate`]: the offline dataset; [`bm25`]: retrieval.

pub mod answer;
pub mod bm25;
pub mod codemap;
pub mod diff;
pub mod edit;
pub mod edit_grammar;
pub mod grammar;
pub mod grounding;
pub mod instance;
pub mod prompt;
pub mod repo;
pub mod reward;
pub mod subtask;
pub mod synth;
pub mod truth;
