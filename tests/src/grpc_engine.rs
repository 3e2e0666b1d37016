//! The gRPC load client of engines' own gRPC servers (`tests/engine/grpc_engine_client.py`:
//! vLLM's `vllm serve --grpc`, SGLang's `--smg-grpc-mode`): runs it to its end and returns
//! what each call saw, by the client's own count and clock.
use std::{path::Path, process::Command};

use serde_json::Value;

/// Runs the client with `python` (a venv with smg-grpc-proto) against `port` with `args`
/// (calls, concurrency, then options); one JSON object per call, none of them an error.
pub fn run_calls(python: &Path, port: u16, args: &[&str]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/grpc_engine_client.py");
    let output = Command::new(python)
        .arg(script)
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("running the gRPC client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().last() == Some("done"),
        "gRPC client failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let calls: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for call in &calls {
        assert!(call.get("error").is_none(), "{call}");
    }
    calls
}
