//! Decode stage: captured bytes → protocol events. Parsers here see untrusted bytes: they
//! never panic, keep bounded buffers and report what they could not parse.
//!
//! A crate of its own so that Cargo holds the layering: it may name only [`inferscope_model`] (and the shim's messages in `inferscope_proto`)
//! (never capture, engines, correlate or export), and it links no async runtime, exporter, GPU
//! library or kernel loader, so the fuzz targets build without them. The agent's stages are
//! described in `docs/src/architecture.md`.
pub mod http;
pub mod http2;
pub mod msgpack;
pub mod pickle;
pub mod prometheus;
pub mod protobuf;
pub mod shim;
pub mod zmtp;
