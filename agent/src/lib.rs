//! inferscope: per-request timelines of LLM inference servers, from outside the engine.
//!
//! Data flows one way, and the modules are its stages in order: [`model`] (the shared records,
//! clocks and counters) → [`capture`] (eBPF, process discovery, scraping, the CUPTI shim
//! listener) → [`decode`] (HTTP/SSE, ZMTP/msgpack, pickle, Prometheus text) → [`identity`]
//! (containers, pods) → [`engines`] (one plugin per engine: discovery, hooks, IPC decoders,
//! metric names) → [`correlate`] (connections, requests, steps, timelines) → [`diagnose`] →
//! [`export`] (OTLP, Prometheus, gRPC, JSONL) → [`pipeline`] (the stages wired on one thread) →
//! [`daemon`] (the `run` daemon's fan-out) → [`cli`] (the commands). A module never names a later
//! stage (`tests/architecture.rs` checks it).
pub mod capture;
pub mod cli;
pub mod correlate;
pub(crate) mod daemon;
pub mod diagnose;
pub mod engines;
pub(crate) mod export;
pub mod identity;
pub(crate) mod pipeline;
