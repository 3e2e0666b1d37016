//! Export stage: finished records leave the agent here — files, the terminal, OTLP, the
//! Prometheus endpoint, the gRPC API and Perfetto traces.
pub mod counters_file;
pub mod grpc;
pub mod health;
pub mod hub;
pub mod jsonl;
pub mod live;
pub mod metrics;
pub mod names;
pub mod otlp;
pub mod perfetto;
pub mod prometheus_http;
pub mod proto_conv;
pub mod summary;
