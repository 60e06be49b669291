//! Reinforcement fine-tuning: advantages, KL estimators, the PPO / GRPO / RLOO objectives.

pub mod advantage;
pub mod kl;
pub mod openai;
pub mod ppo;
pub mod select;
pub mod teacher;
