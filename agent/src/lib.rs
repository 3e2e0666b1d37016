//! inferscope: per-request timelines of LLM inference servers, from outside the engine.
//!
//! Data flows one way, and the modules are its stages in order, after the two crates every stage
//! shares (`inferscope-model`: records, clocks, counters; `inferscope-decode`: the decoders of
//! untrusted bytes): [`capture`] (eBPF, process discovery, ELF and uprobes, the CUPTI shim,
//! scraping) → [`identity`] (containers, pods) → [`engines`] (one plugin per engine: discovery,
//! hooks, IPC decoders, metric names) → [`correlate`] (connections, requests, steps) → `join`
//! (what waits for more about a finished request: engine IPC, P/D legs, engine metrics, kernels;
//! timelines) → [`diagnose`] → `export` (OTLP, Prometheus, gRPC, JSONL) → `pipeline` (the stages wired on one
//! thread) → `daemon` (the `run` daemon's fan-out) → [`cli`] (the commands). A module never names
//! a later stage (`tests/architecture.rs` checks it); the picture, with one record's path from the
//! ring buffer to an OTLP span, is `docs/src/architecture.md`.
//!
//! Only what another crate uses is public: [`cli::main`] for the binary, and [`testing`], the
//! narrow surface the fuzz targets, benchmarks and integration tests drive directly.
pub(crate) mod capture;
pub mod cli;
pub(crate) mod correlate;
pub(crate) mod daemon;
pub(crate) mod diagnose;
pub(crate) mod engines;
pub(crate) mod export;
pub(crate) mod identity;
pub(crate) mod join;
pub(crate) mod pipeline;
pub mod testing;
