//! Triton's KServe v2 gRPC protocol for the test server (`tests/engine/kserve/`): its official
//! .proto files compiled into a descriptor set that protobuf's Python runtime builds the
//! messages from.
use std::path::{Path, PathBuf};

use prost::Message;

/// The folder of the protocol files and the test server.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/kserve")
}

/// Writes the FileDescriptorSet of `grpc_service.proto` and its imports into `out_dir`; returns
/// its path.
pub fn descriptor_set(out_dir: &Path) -> PathBuf {
    let set = protox::compile(["grpc_service.proto"], [dir()])
        .expect("compiling Triton's grpc_service.proto");
    let path = out_dir.join("kserve.desc");
    std::fs::write(&path, set.encode_to_vec()).expect("writing the descriptor set");
    path
}
