//! The gRPC load client of engines' own gRPC servers (`tests/engine/grpc_engine_client.py`:
//! vLLM's `vllm serve --grpc`, SGLang's `--smg-grpc-mode`): runs it to its end and returns
//! what each call saw, by the client's own count and clock.
use std::{path::Path, process::Command};

use serde_json::Value;

/// Runs the client with `python` (a venv with smg-grpc-proto) against `port` with `args`
/// (calls, concurrency, then options); one JSON object per call, none of them an error.
pub fn run_calls(python: &Path, port: u16, args: &[&str]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/grpc_engine_client.py");
    let calls = crate::client::json_lines(
        Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .args(args),
    );
    for call in &calls {
        assert!(call.get("error").is_none(), "{call}");
    }
    calls
}

/// The one record of `call` (by the request id it named, `rpc_request_id`), with what every
/// engine's gRPC record must hold: `path`, `engine`, nothing cut or incomplete; an uncancelled
/// call complete with the client's message count and `grpc_status` 0; a cancelled one ended by
/// the client's RST_STREAM (or complete, when the server ended the stream before the reset
/// reached it) after its second message.
pub fn record_of<'a>(records: &'a [Value], call: &Value, path: &str, engine: &str) -> &'a Value {
    let id = call["id"].as_str().expect("a call id");
    let mine: Vec<&Value> = records
        .iter()
        .filter(|r| r["rpc_request_id"] == id)
        .collect();
    assert_eq!(mine.len(), 1, "one record for {call}");
    let r = mine[0];
    assert_eq!(r["path"], path, "{r}");
    assert_eq!(r["engine"], engine, "{r}");
    assert_eq!(r["capture_truncated"], false, "{r}");
    assert_eq!(r["incomplete"], Value::Null, "{r}");
    let info = &r["http2"];
    if call["cancelled"] == true {
        if r["ended_by"] == "client" {
            assert_eq!(info["stream_end"], "rst_stream", "{r}");
        } else {
            assert_eq!(r["ended_by"], "complete", "{r}");
        }
        assert!(r["output_chunks"].as_u64().unwrap_or(0) >= 2, "{r} {call}");
    } else {
        assert_eq!(r["ended_by"], "complete", "{r}");
        assert_eq!(r["output_chunks"], call["messages"], "{r} {call}");
        assert_eq!(info["grpc_status"], 0, "{r}");
    }
    r
}
