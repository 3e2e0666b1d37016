//! The daemon's path after the pipeline: the fan-out of closed timelines and everything beside
//! them to every exporter, each one [`crate::pipeline::Sink`] (OTLP with trace sampling,
//! Prometheus, gRPC subscribers, JSONL, the continuous diagnosis), GPU inputs, and a surge roll's
//! handover. `inferscope run` wires it to its command line; tests drive it in-process through
//! the same interface.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
mod fanout;
mod gpu;
pub(crate) mod handover;
mod sampler;
mod sinks;
#[cfg(test)]
mod tests;

pub(crate) use fanout::{FanOut, Outputs, Standby};
pub(crate) use gpu::GpuInputs;
pub(crate) use sampler::Sampler;
pub(crate) use sinks::Diagnosis;
