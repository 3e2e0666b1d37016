//! inferscope: per-request timelines of LLM inference servers, from outside the engine.
//!
//! Data flows one way: [`capture`] (eBPF, process discovery) → [`decode`] (HTTP/SSE) →
//! [`correlate`] (connections, requests) → [`export`] (JSONL, terminal). [`engines`] holds the
//! per-engine knowledge; [`pipeline`] wires the stages together. [`diagnose`] reads finished
//! records (the correlate stage's output) and explains TTFT regressions.
pub mod capture;
pub mod correlate;
pub mod daemon;
pub mod decode;
pub mod diagnose;
pub mod engines;
pub mod export;
pub mod identity;
pub mod model;
pub mod pipeline;
