//! Compiles the .proto files with protox (pure Rust), so building needs no `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["inferscope/v1/shim.proto", "inferscope/v1/agent.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    // The shim builds without the `grpc` feature: it needs the messages, not tonic.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure()
        .build_server(grpc)
        .build_client(grpc)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
