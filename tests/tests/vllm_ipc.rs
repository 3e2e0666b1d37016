//! vLLM V1 IPC, live: the fixtures' messages (encoded with vLLM 0.33.0's own classes, see
//! tests/fixtures/vllm) travel between two real processes over real pyzmq sockets, behind an
//! HTTP front that streams SSE with vLLM's ids (tests/engine/vllm_ipc_replay.py). The real agent
//! records the API-server process with eBPF; its records must carry exactly the admission,
//! preemptions, prompt tokens and per-step KV use the fixtures encode.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use inferscope_integration_tests::{
    agent::{self, Recorder, read_records},
    engine::python,
};
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/vllm/0.33.0")
}

struct Front {
    child: Child,
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP exchange on a fresh connection; returns the raw response.
fn http(port: u16, request: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the front");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    s.write_all(request.as_bytes()).expect("sending");
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).expect("reading the response");
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        let done_chunked = raw.ends_with(b"0\r\n\r\n");
        let done_plain = raw.ends_with(b"\r\n\r\nok");
        if done_chunked || done_plain {
            break;
        }
    }
    raw
}

/// The port the front bound (it asks the kernel for one: a port picked here and bound there could
/// be taken in between by another test's process, which then answers this test's requests).
fn front_port(dir: &std::path::Path, front: &mut Child) -> u16 {
    let path = dir.join("http.port");
    let mut port = None;
    inferscope_integration_tests::wait_until(Duration::from_secs(20), "the replay front", || {
        if let Ok(Some(status)) = front.try_wait() {
            panic!("the replay front exited ({status}): run scripts/setup.sh for .venv with pyzmq");
        }
        port = std::fs::read_to_string(&path)
            .ok()
            .and_then(|p| p.trim().parse().ok());
        port.is_some()
    });
    port.expect("the front's port")
}

fn expected_steps() -> usize {
    let expected: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("expected.json")).unwrap()).unwrap();
    expected["steps"].as_array().map_or(0, Vec::len)
}

fn ns(seconds: f64) -> u64 {
    (seconds * 1e9 + 0.5).floor() as u64
}

/// `late`: the engine starts (ZMTP handshake, start-up message) before the agent attaches.
fn replay(transport: &str, late: bool) {
    let dir = inferscope_integration_tests::test_dir(&format!("vllm-{transport}"));
    let script = repo_root().join("tests/engine/vllm_ipc_replay.py");
    // "vllm serve" in the command line: the agent's discovery recognises vLLM by it.
    let mut child = Command::new(python())
        .arg(&script)
        .args(["api", "vllm", "serve", "fixture"])
        .args(["--transport", transport])
        .arg("--fixtures")
        .arg(fixtures())
        .arg("--workdir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("front.log")).expect("front log"))
        .spawn()
        .expect("starting the replay (run scripts/setup.sh for .venv with pyzmq)");
    let port = front_port(&dir, &mut child);
    let front = Front { child };
    if late {
        http(port, "GET /start HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    let steps_path = dir.join("steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--steps", &steps_arg]);
    recorder.wait_attached(front.child.id(), Duration::from_secs(30));
    // The engine starts after the agent attached: its ZMTP handshake and start-up message
    // (with vllm_version) are captured, as for an engine (re)started under the agent.
    if !late {
        http(port, "GET /start HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    let clients: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|x| {
            std::thread::spawn(move || {
                let body = r#"{"model":"fixture","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
                let req = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: fixture-{x}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                http(port, &req)
            })
        })
        .collect();
    for c in clients {
        let raw = c.join().expect("client");
        assert!(
            raw.ends_with(b"0\r\n\r\n"),
            "{}",
            String::from_utf8_lossy(&raw)
        );
    }
    // The four streams' records, and the engine's steps, are written once the agent has read
    // their last bytes.
    let want_steps = expected_steps();
    recorder.wait_records(
        Duration::from_secs(30),
        "the four streams' records",
        |records| {
            records
                .iter()
                .filter(|r| {
                    r["x_request_id"]
                        .as_str()
                        .is_some_and(|x| x.starts_with("fixture-"))
                })
                .count()
                == 4
        },
    );
    inferscope_integration_tests::agent::wait_records(
        &steps_path,
        Duration::from_secs(30),
        "the engine's steps",
        |steps| steps.iter().filter(|s| s["engine"] == "vllm").count() >= want_steps,
    );
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let steps = read_records(&steps_path);
    let offset: f64 = std::fs::read_to_string(dir.join("offset"))
        .expect("the engine wrote its timestamp offset")
        .trim()
        .parse()
        .expect("offset");
    drop(front);
    if late {
        // No handshake and no version seen: the newest pinned layout, type-checked.
        assert!(counters.get("vllm_ipc_layout_assumed") > 0, "{log}");
        assert_eq!(counters.get("vllm_ipc_ready"), 0, "{log}");
    } else {
        assert_eq!(counters.get("vllm_ipc_ready"), 1, "{log}");
        assert_eq!(counters.get("vllm_ipc_layout_assumed"), 0, "{log}");
    }
    check(&records, &steps, offset, &log);
    let _ = std::fs::remove_dir_all(&dir);
}

fn check(records: &[Value], steps: &[Value], offset: f64, log: &str) {
    let expected: Value =
        serde_json::from_slice(&std::fs::read(fixtures().join("expected.json")).unwrap()).unwrap();
    assert!(!log.contains("vllm_ipc_layout_mismatch"), "{log}");
    for want in expected["requests"].as_array().unwrap() {
        let ext = want["external_req_id"].as_str().unwrap();
        // D streamed no event with an id (aborted while waiting): found by its X-Request-Id.
        let rec = records
            .iter()
            .find(|r| {
                r["response_id"] == ext
                    || r["x_request_id"]
                        .as_str()
                        .is_some_and(|x| format!("chatcmpl-{x}") == ext)
            })
            .unwrap_or_else(|| panic!("no record for {ext}: {records:#?}\n{log}"));
        assert_eq!(rec["engine"], "vllm");
        assert_eq!(
            rec["prompt_tokens"], want["prompt_tokens"],
            "{ext}: {rec:#?}"
        );
        match want["scheduled"].as_f64() {
            Some(scheduled) => {
                let admitted = ns(scheduled + offset);
                assert_eq!(rec["admitted_mono_ns"], admitted, "{ext}: {rec:#?}");
                assert_eq!(rec["preemptions"], want["preemptions"], "{ext}: {rec:#?}");
                let arrival = rec["arrival_mono_ns"].as_u64().unwrap();
                let first_token = rec["first_token_mono_ns"].as_u64().unwrap();
                assert!(arrival <= admitted && admitted <= first_token, "{rec:#?}");
                let wait = rec["queue_wait_ms"].as_f64().unwrap();
                let prefill = rec["prefill_ms"].as_f64().unwrap();
                let ttft = rec["ttft_ms"].as_f64().unwrap();
                assert!((wait + prefill - ttft).abs() < 0.01, "{rec:#?}");
            }
            // D was aborted while waiting: never admitted.
            None => {
                assert!(rec["admitted_mono_ns"].is_null(), "{rec:#?}");
                assert!(rec["preemptions"].is_null(), "{rec:#?}");
            }
        }
    }
    let vllm_steps: Vec<&Value> = steps.iter().filter(|s| s["engine"] == "vllm").collect();
    let want_steps = expected["steps"].as_array().unwrap();
    assert_eq!(vllm_steps.len(), want_steps.len(), "{steps:#?}");
    for (got, want) in vllm_steps.iter().zip(want_steps) {
        let end = ns(want["timestamp"].as_f64().unwrap() + offset);
        assert_eq!(got["end_mono_ns"], end, "{got:#?}");
        assert_eq!(got["kv_cache_usage"], want["kv_cache_usage"], "{got:#?}");
        assert_eq!(got["running_requests"], want["running"], "{got:#?}");
        assert_eq!(got["waiting_requests"], want["waiting"], "{got:#?}");
    }
}

#[test]
fn vllm_ipc_over_unix_sockets() {
    replay("ipc", false);
}

#[test]
fn vllm_ipc_over_tcp() {
    replay("tcp", false);
}

#[test]
fn vllm_ipc_joined_after_the_engine_started_unix() {
    replay("ipc", true);
}

#[test]
fn vllm_ipc_joined_after_the_engine_started_tcp() {
    replay("tcp", true);
}
