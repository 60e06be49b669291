//! Reinforcement fine-tuning: advantages, KL estimators, the PPO / GRPO / RLOO objectives.

pub mod accept;
pub mod advantage;
pub mod dynamic;
pub mod eval;
pub mod exec_reward;
pub mod failforge;
pub mod kl;
pub mod localize;
pub mod mismatch;
pub mod monitor;
pub mod openai;
pub mod p2t;
pub mod ppo;
pub mod ptx;
pub mod regression;
pub mod rl;
pub mod rl_lora;
pub mod rl_run;
pub mod select;
pub mod stats;
pub mod teacher;
