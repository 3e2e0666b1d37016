//! Protobuf messages shared by the agent, its clients and the CUPTI shim.
//!
//! - [`v1::shim`]: what `libinferscope_cupti.so` sends the agent over a Unix socket, as
//!   length-delimited `KernelBatch` messages.
//! - [`v1::agent`]: the agent's gRPC API (`Subscribe`, `ListRequests`, `GetRequest`).
pub mod v1 {
    pub mod shim {
        include!(concat!(env!("OUT_DIR"), "/inferscope.v1.shim.rs"));
    }
    // Generated code: prost boxes nothing, so the subscription's oneof is as large as a request.
    #[allow(clippy::large_enum_variant)]
    pub mod agent {
        include!(concat!(env!("OUT_DIR"), "/inferscope.v1.agent.rs"));
    }
}
