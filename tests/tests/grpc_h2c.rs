//! HTTP/2 and gRPC on a real server: grpcio's C core serving h2c (prior knowledge) to a grpcio
//! client that counts what it received (`tests/engine/grpc_h2c.py`). Every call has exactly one
//! record, with its path equal to the client's, its gRPC status and message counts equal to the
//! client's or, where the capture cut a write, counted and never wrong; TTFT at the server's
//! write of the first message (before the client read it, and close to it).

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader, Write},
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

fn start_server(python: &PathBuf, port: u16) -> KillOnDrop {
    let mut server = Command::new(python)
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
    KillOnDrop(server)
}

fn python() -> PathBuf {
    let python = vllm_python();
    assert!(
        python.exists(),
        "{} missing: grpcio comes with the vLLM venv (scripts/setup.sh test)",
        python.display()
    );
    python
}

/// The client's lines: one JSON object per call.
fn parse_calls(text: &str) -> Vec<Value> {
    assert_eq!(text.lines().last(), Some("done"), "{text}");
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_grpc_call_on_h2c_has_one_record_with_the_clients_counts() {
    let python = python();
    let dir = inferscope_integration_tests::test_dir("grpc-h2c");
    let port = free_port();
    let server = start_server(&python, port);
    let pid = server.0.id();

    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));

    let out = Command::new(&python)
        .arg(script())
        .args(["call", &port.to_string(), &CALLS.to_string()])
        .output()
        .expect("running the gRPC client");
    assert!(out.status.success(), "client failed: {out:?}");
    let calls = parse_calls(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(calls.len(), CALLS);

    recorder.wait_records(Duration::from_secs(30), "every call's record", |r| {
        r.iter().filter(|r| r["http2"].is_object()).count() >= CALLS
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    let streams: Vec<&Value> = records.iter().filter(|r| r["http2"].is_object()).collect();
    assert_eq!(streams.len(), CALLS, "{streams:#?}");

    // grpcio writes a frame header and its payload as two iovecs: a write of a few frames has
    // more than eight, which the kernel copies through bpf_loop. A write past the capture
    // limit is still cut: what was cut is counted and the record says `capture_truncated` or
    // `incomplete`; a response field never reads wrong, at worst unknown (HPACK entries
    // inserted in cut bytes).
    let counters = Counters::beside(&log);
    let nothing_cut = counters.get("kernel_payload_truncated") == 0;
    let mut ttft_gaps_ms = Vec::new();
    let mut exact = 0;
    let mut wire_unknown = 0;
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
        if nothing_cut {
            assert!(!cut, "{r}");
            assert_eq!(h2["grpc_status"], call["grpc_status"], "{r}");
            assert_eq!(r["status"], 200, "{r}");
        }
        if cut {
            assert!(
                h2["response_messages"].as_u64() <= call["messages"].as_u64(),
                "{r}"
            );
            continue;
        }
        exact += 1;
        // The segment that carried the first byte of the call's HEADERS, seen by the kernel
        // before the server read it; never a segment from before the call. Unknown (counted in
        // `arrival_wire_unknown`) only where segments of the read were not seen.
        match r["arrival_wire_mono_ns"].as_u64() {
            Some(wire) => assert!(
                wire <= arrival && wire >= call["start_ns"].as_u64().unwrap(),
                "{r} {call}"
            ),
            None => wire_unknown += 1,
        }
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
            // The server sleeps 2 ms before each message: no gap between two is shorter.
            let shortest = r["itl_p50_ms"]
                .as_f64()
                .unwrap()
                .min(r["tpot_ms"].as_f64().unwrap());
            assert!(shortest >= 2.0, "{r}");
        } else {
            assert!(r["ttft_ms"].is_null(), "{r}");
        }
    }
    assert!(exact >= CALLS / 2, "only {exact} of {CALLS} records uncut");
    // Byte positions place every segment of a fully captured connection.
    assert!(
        wire_unknown <= counters.get("arrival_wire_unknown") as usize,
        "every unknown wire arrival counted"
    );
    if nothing_cut {
        assert_eq!(wire_unknown, 0, "records without a wire arrival");
    }
    ttft_gaps_ms.sort_by(f64::total_cmp);
    let median = ttft_gaps_ms[ttft_gaps_ms.len() / 2];
    assert!(
        median < 5.0,
        "first message written → read by the client, median {median} ms: {ttft_gaps_ms:?}"
    );

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

/// A gRPC channel opened before the agent attached: decoding starts at its next whole frames.
/// The calls after the attach have records; a path the client's HPACK encoder sends by a table
/// entry inserted before the attach reads `unknown` (counted), never another path, and a path
/// first used after the attach (a literal) reads right on every call.
#[test]
fn a_grpc_channel_that_predates_the_agent_is_decoded_from_its_next_frames() {
    const BEFORE: usize = 4;
    let python = python();
    let dir = inferscope_integration_tests::test_dir("grpc-h2c-joined");
    let port = free_port();
    let server = start_server(&python, port);
    let pid = server.0.id();

    let mut client = Command::new(&python)
        .arg(script())
        .args([
            "call",
            &port.to_string(),
            &CALLS.to_string(),
            &BEFORE.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("running the gRPC client");
    let mut stdout = BufReader::new(client.stdout.take().unwrap());
    let mut text = String::new();
    while !text.ends_with("paused\n") {
        assert!(stdout.read_line(&mut text).unwrap() > 0, "client: {text}");
    }
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    client
        .stdin
        .take()
        .unwrap()
        .write_all(b"go\n")
        .expect("resuming the client");
    std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
    assert!(client.wait().unwrap().success(), "client: {text}");
    let calls = parse_calls(&text.replace("paused\n", ""));
    let after = &calls[BEFORE..];

    recorder.wait_records(Duration::from_secs(30), "the calls after the attach", |r| {
        r.iter().filter(|r| r["http2"].is_object()).count() >= after.len()
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    let streams: Vec<&Value> = records.iter().filter(|r| r["http2"].is_object()).collect();
    assert_eq!(streams.len(), after.len(), "{streams:#?}");
    let mut late = 0;
    for call in after {
        let size = call["request_bytes"].as_u64().unwrap();
        let matching: Vec<_> = streams
            .iter()
            .filter(|r| r["http2"]["request_message_bytes"] == size)
            .collect();
        assert_eq!(matching.len(), 1, "call {call}: {matching:#?}");
        let r = matching[0];
        assert!(
            r["path"] == call["path"] || r["path"] == "unknown",
            "{r} {call}"
        );
        if call["path"] == "/inferscope.test.Gen/Late" {
            assert_eq!(r["path"], call["path"], "{r}");
            late += 1;
        }
        assert_eq!(r["connection_preexisting"], true, "{r}");
        let h2 = &r["http2"];
        assert!(
            h2["grpc_status"] == call["grpc_status"] || h2["grpc_status"].is_null(),
            "{r}"
        );
        if r["capture_truncated"] == false && r["incomplete"].is_null() {
            assert_eq!(h2["response_messages"], call["messages"], "{r}");
            assert_eq!(h2["response_message_bytes"], call["bytes"], "{r}");
        }
    }
    assert!(late >= 2, "{late} calls on the late path");
    let counters = Counters::beside(&log);
    assert_eq!(counters.get("http2_connections"), 1);
    assert_eq!(counters.get("connections_never_http"), 0);
    assert_eq!(counters.get("h2_hpack_errors"), 0);
}
