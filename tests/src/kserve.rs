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
    compile(&dir(), "grpc_service.proto", &out_dir.join("kserve.desc"))
}

/// Compiles `file` (in `proto_dir`, with its imports) into a FileDescriptorSet at `out`, which
/// protobuf's Python runtime builds message classes from (no protoc, no generated code).
pub fn compile(proto_dir: &Path, file: &str, out: &Path) -> PathBuf {
    let set =
        protox::compile([file], [proto_dir]).unwrap_or_else(|e| panic!("compiling {file}: {e}"));
    std::fs::write(out, set.encode_to_vec()).expect("writing the descriptor set");
    out.to_path_buf()
}
