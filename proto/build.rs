//! Compiles the .proto files with protox (pure Rust), so building needs no `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["inferscope/v1/shim.proto", "inferscope/v1/agent.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
