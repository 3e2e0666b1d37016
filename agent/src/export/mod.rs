//! Export stage: finished records leave the agent here (files, the terminal).
pub mod jsonl;
pub mod live;
pub mod summary;
