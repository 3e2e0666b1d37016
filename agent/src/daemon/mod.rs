//! The daemon's path after the pipeline: request timelines closed with their steps and kernels,
//! trace sampling, the fan-out to every exporter (OTLP, Prometheus, gRPC subscribers, JSONL) and
//! the continuous diagnosis's schedule. `inferscope run` wires it to its command line; tests drive
//! it in-process through the pipeline's [`crate::pipeline::Observer`] interface.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
mod gpu;
pub(crate) mod handover;
mod observer;
mod sampler;
#[cfg(test)]
mod tests;

pub(crate) use gpu::GpuInputs;
pub(crate) use observer::{DaemonObserver, Diagnosis, Outputs, Standby};
pub(crate) use sampler::Sampler;
