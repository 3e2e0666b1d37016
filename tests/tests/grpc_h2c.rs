//! HTTP/2 and gRPC on a real server: grpcio's C core serving h2c (prior knowledge) to a grpcio
//! client that counts what it received (`tests/engine/grpc_h2c.py`). Every call has exactly one
//! record, with its path equal to the client's, its gRPC status and message counts equal to the
//! client's or, where the capture cut a write, counted and never wrong; TTFT at the server's
//! write of the first message (before the client read it, and close to it).

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use inferscope_integration_tests::{
    agent::{Counters, Recorder},
    free_port,
    vllm::vllm_python,
};
use serde_json::Value;

/// A helper process that must not outlive a failed test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const CALLS: usize = 24;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("engine/grpc_h2c.py")
}

#[test]
fn every_grpc_call_on_h2c_has_one_record_with_the_clients_counts() {
    let python = vllm_python();
    assert!(
        python.exists(),
        "{} missing: grpcio comes with the vLLM venv (scripts/setup.sh test)",
        python.display()
    );
    let dir = inferscope_integration_tests::test_dir("grpc-h2c");
    let port = free_port();
    let mut server = Command::new(&python)
        .arg(script())
        .args(["serve", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the gRPC server");
    let mut ready = String::new();
    BufReader::new(server.stdout.take().expect("server stdout"))
        .read_line(&mut ready)
        .expect("server ready line");
    assert_eq!(ready.trim(), "ready");
    let server = KillOnDrop(server);
    let pid = server.0.id();

    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));

    let out = Command::new(&python)
        .arg(script())
        .args(["call", &port.to_string(), &CALLS.to_string()])
        .output()
        .expect("running the gRPC client");
    assert!(out.status.success(), "client failed: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().last(), Some("done"), "{text}");
    let calls: Vec<Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(calls.len(), CALLS);

    recorder.wait_records(Duration::from_secs(30), "every call's record", |r| {
        r.iter().filter(|r| r["http2"].is_object()).count() >= CALLS
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    let streams: Vec<&Value> = records.iter().filter(|r| r["http2"].is_object()).collect();
    assert_eq!(streams.len(), CALLS, "{streams:#?}");

    // The capture may cut a write (the kernel copies at most 8 iovecs of a sendmsg, and grpcio
    // writes a frame header and its payload as two): what was cut is counted and the record
    // says `capture_truncated` or `incomplete`; a response field never reads wrong, at worst
    // unknown (HPACK entries inserted in cut bytes).
    let mut ttft_gaps_ms = Vec::new();
    let mut exact = 0;
    for call in &calls {
        // Request sizes are unique per call: they pair each call with its record.
        let size = call["request_bytes"].as_u64().unwrap();
        let matching: Vec<_> = streams
            .iter()
            .filter(|r| r["http2"]["request_message_bytes"] == size)
            .collect();
        assert_eq!(matching.len(), 1, "call {call}: {matching:#?}");
        let r = matching[0];
        let h2 = &r["http2"];
        assert_eq!(r["method"], "POST", "{r}");
        assert_eq!(r["path"], call["path"], "{r}");
        assert_eq!(h2["request_messages"], 1, "{r}");
        assert_eq!(h2["stream_end"], "end_stream", "{r}");
        assert_eq!(r["ended_by"], "complete", "{r}");
        let arrival = r["arrival_read_mono_ns"].as_u64().unwrap();
        assert!(arrival >= call["start_ns"].as_u64().unwrap(), "{r} {call}");
        assert!(
            h2["grpc_status"] == call["grpc_status"] || h2["grpc_status"].is_null(),
            "{r}"
        );
        assert!(
            h2["content_type"] == "application/grpc" || h2["content_type"] == "unknown",
            "{r}"
        );
        assert!(r["status"] == 200 || r["status"].is_null(), "{r}");
        let cut = r["capture_truncated"] == true || !r["incomplete"].is_null();
        if cut {
            assert!(
                h2["response_messages"].as_u64() <= call["messages"].as_u64(),
                "{r}"
            );
            continue;
        }
        exact += 1;
        assert_eq!(h2["response_messages"], call["messages"], "{r}");
        assert_eq!(h2["response_message_bytes"], call["bytes"], "{r}");
        assert_eq!(r["output_chunks"], call["messages"], "{r}");
        if call["messages"].as_u64().unwrap() > 0 {
            // The server wrote the first message before the client read it, on loopback.
            let first = r["first_token_mono_ns"].as_u64().unwrap();
            let read = call["first_ns"].as_u64().unwrap();
            assert!(first <= read, "{r} {call}");
            ttft_gaps_ms.push((read - first) as f64 / 1e6);
            let last = r["last_token_mono_ns"].as_u64().unwrap();
            assert!(last <= call["last_ns"].as_u64().unwrap() && last >= first);
        } else {
            assert!(r["ttft_ms"].is_null(), "{r}");
        }
    }
    assert!(exact >= CALLS / 2, "only {exact} of {CALLS} records uncut");
    ttft_gaps_ms.sort_by(f64::total_cmp);
    let median = ttft_gaps_ms[ttft_gaps_ms.len() / 2];
    assert!(
        median < 5.0,
        "first message written → read by the client, median {median} ms: {ttft_gaps_ms:?}"
    );

    let counters = Counters::beside(&log);
    assert!(counters.get("http2_connections") >= 1);
    assert_eq!(counters.get("h2_streams"), CALLS as u64);
    for loss in [
        "h2_hpack_errors",
        "h2_frames_malformed",
        "connections_never_http",
    ] {
        assert_eq!(counters.get(loss), 0, "{loss}");
    }
    // HTTP/2 losses come from capture losses only.
    if counters.get("kernel_payload_truncated") == 0 {
        for loss in [
            "h2_hpack_unknown_fields",
            "h2_framing_lost",
            "grpc_message_framing_lost",
        ] {
            assert_eq!(counters.get(loss), 0, "{loss}");
        }
    }
}
