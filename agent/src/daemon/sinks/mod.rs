//! The daemon's exporters, each one [`crate::pipeline::Sink`]: the fan-out
//! (`daemon::FanOut`) hands every one of them what the pipeline hands on.
mod diagnosis;
mod grpc;
mod jsonl;
mod otlp;
mod prometheus;

pub(crate) use diagnosis::{Diagnosis, DiagnosisSink};
pub(crate) use grpc::GrpcSink;
pub(crate) use jsonl::JsonlSink;
pub(crate) use otlp::OtlpSink;
pub(crate) use prometheus::PrometheusSink;
