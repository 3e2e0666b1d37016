//! Triton's KServe v2 `ModelStreamInfer` on a real gRPC server (grpcio's C core, messages from
//! Triton's official .proto files: `tests/engine/kserve/`): one stream carries many calls, each
//! answered by a series of responses that echo its id, interleaved with other calls' on the same
//! stream. Every call the client sent has exactly one record, named by its id, with the client's
//! response count; its arrival at the wire before the server's handler saw it, its first token at
//! the server's first write, before the client read it.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read},
    process::{Child, Command, Stdio},
    time::Duration,
};

use inferscope_integration_tests::{
    agent::{Counters, Recorder},
    free_port, kserve,
    vllm::vllm_python,
};
use serde_json::Value;

const PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";
const STREAMS: usize = 4;
const CALLS_PER_STREAM: usize = 12;

/// A helper process that must not outlive a failed test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lines_of(text: &str) -> HashMap<String, Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| (v["id"].as_str().unwrap().to_owned(), v))
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn every_call_of_a_model_stream_infer_stream_has_its_own_record() {
    let python = vllm_python();
    assert!(
        python.exists(),
        "{} missing: grpcio and protobuf come with the vLLM venv (scripts/setup.sh test)",
        python.display()
    );
    let dir = inferscope_integration_tests::test_dir("kserve-stream");
    let descriptors = kserve::descriptor_set(&dir);
    let script = kserve::dir().join("triton_stream.py");
    let port = free_port();
    let mut server = Command::new(&python)
        .arg(&script)
        .args(["serve", &port.to_string()])
        .arg(&descriptors)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(KillOnDrop)
        .expect("starting the KServe server");
    let pid = server.0.id();
    let mut server_out = BufReader::new(server.0.stdout.take().unwrap());
    let mut ready = String::new();
    server_out.read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");

    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));

    let calls: HashMap<String, Value> = inferscope_integration_tests::client::json_lines(
        Command::new(&python)
            .arg(&script)
            .args(["call", &port.to_string()])
            .arg(&descriptors)
            .args([STREAMS.to_string(), CALLS_PER_STREAM.to_string()]),
    )
    .into_iter()
    .map(|v| (v["id"].as_str().unwrap().to_owned(), v))
    .collect();
    assert_eq!(calls.len(), STREAMS * CALLS_PER_STREAM);

    recorder.wait_records(Duration::from_secs(30), "every call's record", |r| {
        r.iter()
            .filter(|r| {
                r["rpc_request_id"]
                    .as_str()
                    .is_some_and(|id| calls.contains_key(id))
            })
            .count()
            >= calls.len()
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    drop(server.0.kill());
    let mut server_text = String::new();
    server_out.read_to_string(&mut server_text).unwrap();
    let answered = lines_of(&server_text);
    assert_eq!(answered.len(), calls.len(), "{server_text}");

    // No record of the streams themselves: only of their calls.
    let h2: Vec<&Value> = records.iter().filter(|r| r["http2"].is_object()).collect();
    assert_eq!(h2.len(), calls.len(), "{h2:#?}");

    let mut arrival_to_handler_ms = Vec::new();
    let mut send_to_wire_ms = Vec::new();
    let mut first_write_to_client_ms = Vec::new();
    let mut ttft_vs_client_ms = Vec::new();
    let mut stream_ids = std::collections::BTreeSet::new();
    for (id, call) in &calls {
        let mine: Vec<&&Value> = h2.iter().filter(|r| r["rpc_request_id"] == **id).collect();
        assert_eq!(mine.len(), 1, "one record for {call}");
        let r = mine[0];
        let info = &r["http2"];
        assert_eq!(r["path"], PATH, "{r}");
        assert_eq!(r["method"], "POST", "{r}");
        assert_eq!(r["capture_truncated"], false, "{r}");
        assert_eq!(r["incomplete"], Value::Null, "{r}");
        assert_eq!(r["ended_by"], "complete", "{r}");
        assert_eq!(info["request_messages"], 1, "{r}");
        assert_eq!(r["output_chunks"], call["responses"], "{r} {call}");
        assert_eq!(info["response_messages"], call["responses"], "{r} {call}");
        let want_end = if call["error"] == true {
            "error_response"
        } else {
            "final_response"
        };
        assert_eq!(info["stream_end"], want_end, "{r} {call}");
        stream_ids.insert(info["stream_id"].as_u64().unwrap());

        let ns = |v: &Value| v.as_u64().unwrap() as i64;
        let served = &answered[id];
        let wire = ns(&r["arrival_wire_mono_ns"]);
        let first = ns(&r["first_token_mono_ns"]);
        let last = ns(&r["last_token_mono_ns"]);
        // The wire before the handler, after the client's send; the first write after the
        // server handed its first response to gRPC and before the client read it.
        assert!(
            ns(&call["send_ns"]) <= wire && wire <= ns(&served["recv_ns"]),
            "{r} {call} {served}"
        );
        assert!(
            ns(&served["first_ns"]) <= first && first <= ns(&call["first_ns"]),
            "{r} {call} {served}"
        );
        assert!(
            ns(&served["last_ns"]) <= last && last <= ns(&call["last_ns"]),
            "{r} {call} {served}"
        );
        let ms = |a: i64, b: i64| (b - a) as f64 / 1e6;
        arrival_to_handler_ms.push(ms(wire, ns(&served["recv_ns"])));
        send_to_wire_ms.push(ms(ns(&call["send_ns"]), wire));
        first_write_to_client_ms.push(ms(first, ns(&call["first_ns"])));
        let client_ttft = ms(ns(&call["send_ns"]), ns(&call["first_ns"]));
        ttft_vs_client_ms.push(client_ttft - r["ttft_ms"].as_f64().unwrap());
    }
    assert_eq!(stream_ids.len(), STREAMS, "{stream_ids:?}");
    let counters = Counters::beside(&log);
    for zero in [
        "grpc_stream_responses_unmatched",
        "grpc_stream_calls_evicted",
        "grpc_paired_messages_dropped",
        "grpc_stream_calls_final_unseen",
        "rpc_request_ids_unread",
        "h2_framing_lost",
        "h2_hpack_unknown_fields",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero}");
    }
    assert_eq!(counters.get("grpc_stream_calls") as usize, calls.len());
    eprintln!(
        "KServe ModelStreamInfer: {} calls on {STREAMS} streams; median ms: client send -> wire {:.3}, \
         wire -> handler {:.3}, first write -> client read {:.3}, client TTFT - record TTFT {:.3}",
        calls.len(),
        median(send_to_wire_ms),
        median(arrival_to_handler_ms),
        median(first_write_to_client_ms.clone()),
        median(ttft_vs_client_ms.clone()),
    );
    // The client's own TTFT includes its send and read paths, never less than the wire's.
    assert!(
        ttft_vs_client_ms.iter().all(|d| *d >= 0.0),
        "{ttft_vs_client_ms:?}"
    );
}
