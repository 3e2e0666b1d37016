//! Export stage: finished records leave the agent here — files, the terminal, OTLP, the
//! Prometheus endpoint, the gRPC API and Perfetto traces.
//!
//! Where this stage sits and what it may import: `docs/src/architecture.md`.
pub(crate) mod counters_file;
pub(crate) mod grpc;
pub(crate) mod health;
pub(crate) mod hub;
pub(crate) mod jsonl;
pub(crate) mod live;
pub(crate) mod metrics;
pub(crate) mod names;
pub(crate) mod otlp;
pub(crate) mod perfetto;
pub(crate) mod prometheus_http;
pub(crate) mod proto_conv;
pub(crate) mod summary;
