//! Decode stage: captured bytes → protocol events. Parsers here see untrusted bytes: they
//! never panic, keep bounded buffers and report what they could not parse.
pub mod http;
pub mod http2;
pub mod msgpack;
pub mod pickle;
pub mod prometheus;
pub mod protobuf;
pub mod zmtp;
