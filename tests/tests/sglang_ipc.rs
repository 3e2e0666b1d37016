//! SGLang's IPC, live. SGLang 0.5.23's real scheduler does not run on this CPU-only machine
//! within CI's budget, so (as issue 18 allows) two real processes exchange SGLang's own message
//! classes (TokenizedGenerateReqInput, BatchTokenIDOutput with SGLang's SchedulerReqTimeStats),
//! pickled by SGLang's own socket code over real ZMQ ipc:// sockets, behind an HTTP front that
//! streams SSE with SGLang's ids (tests/engine/sglang/ipc_engine.py). Its scheduler has a small
//! KV pool, so requests wait and are retracted. The real agent records it with eBPF; every
//! request's admission, retractions and prompt tokens must equal what the scheduler itself
//! logged, every first-prefill step its bounds, and every other batch a step ending where it
//! was captured. One more client leaves mid-stream: its request is aborted (SGLang's
//! AbortReq) and its retractions are reported unknown.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use inferscope_integration_tests::{
    agent::{self, Recorder, read_records},
    daemon::Daemon,
    free_port,
};
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The SGLang venv's Python (scripts/setup.sh): INFERSCOPE_SGLANG_PYTHON, else .venv-sglang.
fn sglang_python() -> PathBuf {
    std::env::var_os("INFERSCOPE_SGLANG_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-sglang/bin/python3"))
}

struct Front {
    child: Child,
}

impl Drop for Front {
    fn drop(&mut self) {
        // SIGTERM: the front stops its scheduler process on the way out.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(port: u16, request: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the front");
    s.set_read_timeout(Some(Duration::from_secs(60)))
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
        if raw.ends_with(b"0\r\n\r\n") || raw.ends_with(b"\r\n\r\nok") {
            break;
        }
    }
    raw
}

fn wait_http(port: u16, front: &mut Child) {
    // Importing SGLang (torch comes along) takes a while on two cores.
    let deadline = Instant::now() + Duration::from_secs(180);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = front.try_wait() {
            panic!(
                "the SGLang IPC engine exited ({status}): run scripts/setup.sh for .venv-sglang"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the SGLang IPC engine did not listen on {port}");
}

/// The front's child titled `sglang::scheduler`, from /proc.
fn scheduler_of(front: u32) -> u32 {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(front) && cmdline.starts_with(b"sglang::scheduler") {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "the front's scheduler: {found:?}");
    found[0]
}

/// Sends a streamed chat request and leaves once its first SSE event is in.
fn leave_mid_stream(port: u16, body: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the front");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("sending");
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.windows(6).any(|w| w == b"data: ") {
        let n = s.read(&mut buf).expect("reading the response");
        assert!(n > 0, "{}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
}

fn ns(repr: &Value) -> u64 {
    let s: f64 = repr.as_str().expect("a repr").parse().expect("a float");
    (s * 1e9 + 0.5).floor() as u64
}

#[test]
fn sglang_ipc_admission_retractions_and_prompt_tokens() {
    let dir = inferscope_integration_tests::test_dir("sglang");
    let port = free_port();
    // "sglang serve" in the command line: discovery recognises SGLang's server by it (the
    // scheduler process by its `sglang::scheduler` title).
    let child = Command::new(sglang_python())
        .arg(repo_root().join("tests/engine/sglang/ipc_engine.py"))
        .args(["api", "sglang", "serve"])
        .args(["--port", &port.to_string()])
        .args(["--pool", "200", "--prefill-ms", "15", "--decode-ms", "4"])
        .arg("--workdir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("engine.log")).expect("engine log"))
        .spawn()
        .expect("starting the SGLang IPC engine (run scripts/setup.sh for .venv-sglang)");
    let mut front = Front { child };
    wait_http(port, &mut front.child);
    let steps_path = dir.join("agent-steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--steps", &steps_arg]);
    recorder.wait_attached(front.child.id(), Duration::from_secs(60));
    http(port, "GET /start HTTP/1.1\r\nHost: x\r\n\r\n");

    // 16 streams at once, prompts of 10..55 words and 12..27 tokens out: far more than the
    // 200-token pool holds, so requests wait and running ones are retracted.
    let clients: Vec<_> = (0..16)
        .map(|i| {
            std::thread::spawn(move || {
                let words = vec!["w"; 10 + 3 * i].join(" ");
                // Half name their rid in the body; SGLang makes one for the others.
                let rid = if i % 2 == 0 {
                    format!(r#""rid":"it-{i}","#)
                } else {
                    String::new()
                };
                let body = format!(
                    r#"{{{rid}"model":"m","max_tokens":{},"stream":true,"messages":[{{"role":"user","content":"{words}"}}]}}"#,
                    12 + i
                );
                let req = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                http(port, &req)
            })
        })
        .collect();
    // One more asks for 400 tokens and leaves after its first: the front aborts it.
    let words = ["w"; 12].join(" ");
    leave_mid_stream(
        port,
        &format!(
            r#"{{"rid":"gone-0","model":"m","max_tokens":400,"stream":true,"messages":[{{"role":"user","content":"{words}"}}]}}"#
        ),
    );
    for c in clients {
        let raw = c.join().expect("client");
        assert!(
            raw.ends_with(b"0\r\n\r\n"),
            "{}",
            String::from_utf8_lossy(&raw)
        );
    }
    recorder.wait_records(
        Duration::from_secs(60),
        "the seventeen streams' records",
        |records| {
            records
                .iter()
                .filter(|r| r["path"] == "/v1/chat/completions")
                .count()
                >= 17
        },
    );
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let agent_steps = read_records(&steps_path);
    let truth = read_records(&dir.join("truth.jsonl"));
    let engine_steps = read_records(&dir.join("steps.jsonl"));
    let aborted = read_records(&dir.join("aborted.jsonl"));
    let scheduler = scheduler_of(front.child.id());
    drop(front);

    // The layout came from the installed package, and nothing was refused.
    assert!(counters.get("sglang_version_from_package") >= 1, "{log}");
    for bad in [
        "sglang_ipc_layout_assumed",
        "sglang_ipc_layout_mismatch",
        "sglang_ipc_not_pickle",
        "sglang_requests_unjoined",
        "pickle_truncated",
        "sglang_steps_unstamped",
    ] {
        assert_eq!(counters.get(bad), 0, "{bad}\n{log}");
    }
    assert_eq!(truth.len(), 16, "{truth:#?}");
    let by_rid: HashMap<&str, &Value> = records
        .iter()
        .filter_map(|r| Some((r["response_id"].as_str()?, r)))
        .collect();
    let mut retracted = 0;
    let mut waited = 0;
    for t in &truth {
        let rid = t["rid"].as_str().unwrap();
        let rec = by_rid
            .get(rid)
            .unwrap_or_else(|| panic!("no record for {rid}: {records:#?}\n{log}"));
        assert_eq!(rec["engine"], "sglang");
        assert_eq!(rec["prompt_tokens"], t["prompt_tokens"], "{rid}: {rec:#?}");
        assert_eq!(
            rec["completion_tokens"], t["completion_tokens"],
            "{rid}: {rec:#?}"
        );
        assert_eq!(rec["preemptions"], t["retractions"], "{rid}: {rec:#?}");
        // Admission: SGLang's own forward_entry_time, to the nanosecond (well inside 1 ms).
        let admitted = rec["admitted_mono_ns"].as_u64().unwrap();
        let want = ns(&t["forward_entry_time"]);
        assert!(admitted.abs_diff(want) <= 1, "{rid}: {admitted} vs {want}");
        let arrival = rec["arrival_mono_ns"].as_u64().unwrap();
        let first_token = rec["first_token_mono_ns"].as_u64().unwrap();
        assert!(arrival <= admitted && admitted <= first_token, "{rec:#?}");
        let wait = rec["queue_wait_ms"].as_f64().unwrap();
        let prefill = rec["prefill_ms"].as_f64().unwrap();
        let ttft = rec["ttft_ms"].as_f64().unwrap();
        assert!((wait + prefill - ttft).abs() < 0.01, "{rec:#?}");
        retracted += t["retractions"].as_u64().unwrap();
        if wait > 20.0 {
            waited += 1;
        }
    }
    eprintln!(
        "sglang_ipc: {} requests, {retracted} retractions, {waited} waited > 20 ms",
        truth.len()
    );
    assert!(retracted > 0, "the load retracted nothing: {truth:#?}");
    assert!(waited > 0, "no request waited: {records:#?}");

    // The client that left: aborted by the front (AbortReq), its retractions unknown, not 0.
    assert_eq!(aborted.len(), 1, "{aborted:#?}");
    assert_eq!(aborted[0]["rid"], "gone-0");
    let gone = by_rid
        .get("gone-0")
        .unwrap_or_else(|| panic!("no record for gone-0: {records:#?}\n{log}"));
    assert_eq!(gone["aborted"], true, "{gone:#?}");
    assert!(gone["preemptions"].is_null(), "{gone:#?}");
    assert!(
        gone["engine_unknown"]
            .as_array()
            .is_some_and(|u| u.iter().any(|f| f == "preemptions")),
        "{gone:#?}"
    );
    assert!(
        counters.get("sglang_preemptions_unknown_aborted") >= 1,
        "{log}"
    );

    // Every batch with first prefills is one step, bounded by SGLang's own clock.
    let want_steps: Vec<&Value> = engine_steps
        .iter()
        .filter(|s| s.get("first").is_some())
        .collect();
    let sglang_steps: Vec<&Value> = agent_steps
        .iter()
        .filter(|s| s["engine"] == "sglang")
        .collect();
    let got: Vec<&Value> = sglang_steps
        .iter()
        .copied()
        .filter(|s| s["start_from"] == "forward_entry")
        .collect();
    assert_eq!(got.len(), want_steps.len(), "{got:#?}\n{want_steps:#?}");
    for (g, w) in got.iter().zip(&want_steps) {
        assert_eq!(
            g["start_mono_ns"].as_u64(),
            Some(ns(&w["start"])),
            "{g:#?} {w:#?}"
        );
        assert_eq!(
            g["end_mono_ns"].as_u64(),
            Some(ns(&w["end"])),
            "{g:#?} {w:#?}"
        );
        // Its first prefills and the retracted requests it prefilled again: all of a
        // prefill batch here.
        assert_eq!(
            g["prefilling"].as_u64(),
            Some(w["rids"].as_array().unwrap().len() as u64),
            "{g:#?} {w:#?}"
        );
        assert_eq!(
            g["sequences"].as_u64(),
            Some(w["rids"].as_array().unwrap().len() as u64)
        );
        // Its kernels are the scheduler's, wherever the step was seen.
        assert_eq!(
            g["kernel_pid"].as_u64().or(g["pid"].as_u64()),
            Some(u64::from(scheduler)),
            "{g:#?}"
        );
    }
    // Every other batch is one step too, in the order sent, with its members and their
    // phases, ending at its first capture (with `--port` only the front is traced: its read
    // of the outputs, just after the scheduler logs its clock past the send) and with no
    // start SGLang gives.
    let want_untimed: Vec<&Value> = engine_steps
        .iter()
        .filter(|s| s.get("first").is_none())
        .collect();
    let untimed: Vec<&Value> = sglang_steps
        .iter()
        .copied()
        .filter(|s| s["start_from"] == "unknown")
        .collect();
    assert_eq!(got.len() + untimed.len(), sglang_steps.len());
    assert_eq!(
        untimed.len(),
        want_untimed.len(),
        "{untimed:#?}\n{want_untimed:#?}"
    );
    for (g, w) in untimed.iter().zip(&want_untimed) {
        let members: Vec<&Value> = g["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| &m["request_id"])
            .collect();
        let rids: Vec<&Value> = w["rids"].as_array().unwrap().iter().collect();
        assert_eq!(members, rids, "{g:#?} {w:#?}");
        let phase = if w["mode"] == "prefill" {
            "prefill"
        } else {
            "decode"
        };
        assert!(
            g["requests"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["phase"] == phase),
            "{g:#?} {w:#?}"
        );
        let end = g["end_mono_ns"].as_u64().unwrap();
        assert_eq!(g["start_mono_ns"].as_u64(), Some(end), "{g:#?}");
        assert!(end.abs_diff(ns(&w["time"])) < 250_000_000, "{g:#?} {w:#?}");
        // A decode step: one token per member.
        if phase == "decode" {
            assert_eq!(
                g["batch_tokens"].as_u64(),
                Some(rids.len() as u64),
                "{g:#?}"
            );
        }
        assert_eq!(
            g["kernel_pid"].as_u64().or(g["pid"].as_u64()),
            Some(u64::from(scheduler)),
            "{g:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The numbers before "ms" on an `inspect` step row: its start (from the arrival) and length.
fn step_ms(row: &str) -> Vec<f64> {
    row.split_whitespace()
        .filter_map(|w| w.strip_suffix("ms")?.parse().ok())
        .collect()
}

/// Each request's steps as `inferscope run` joins them and `inspect` draws them: its first
/// prefill, the one step SGLang's IPC times, with the bounds the scheduler itself logged for
/// that batch; nothing else is drawn (chunk and decode steps are not timed by SGLang's outputs:
/// the record says its step counts are unknown).
#[test]
fn sglang_ipc_request_steps_through_inspect() {
    let dir = inferscope_integration_tests::test_dir("sglang-steps");
    let port = free_port();
    let child = Command::new(sglang_python())
        .arg(repo_root().join("tests/engine/sglang/ipc_engine.py"))
        .args(["api", "sglang", "serve"])
        .args(["--port", &port.to_string()])
        .args(["--pool", "200", "--prefill-ms", "15", "--decode-ms", "4"])
        .arg("--workdir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("engine.log")).expect("engine log"))
        .spawn()
        .expect("starting the SGLang IPC engine (run scripts/setup.sh for .venv-sglang)");
    let mut front = Front { child };
    wait_http(port, &mut front.child);
    let mut daemon = Daemon::start(&dir, &["--port", &port.to_string()]);
    daemon.wait_attached(front.child.id(), Duration::from_secs(60));
    http(port, "GET /start HTTP/1.1\r\nHost: x\r\n\r\n");
    let clients: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let words = vec!["w"; 10 + 5 * i].join(" ");
                let body = format!(
                    r#"{{"rid":"steps-{i}","model":"m","max_tokens":{},"stream":true,"messages":[{{"role":"user","content":"{words}"}}]}}"#,
                    8 + i
                );
                let req = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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
    // Without a shim, timelines close as their requests end.
    inferscope_integration_tests::wait_until(Duration::from_secs(30), "the timelines", || {
        (0..8).all(|i| {
            daemon
                .client(&["inspect", &format!("steps-{i}"), "--json"])
                .status
                .success()
        })
    });
    let engine_steps = read_records(&dir.join("steps.jsonl"));
    let mut checked = 0;
    for i in 0..8 {
        let rid = format!("steps-{i}");
        let want = engine_steps
            .iter()
            .find(|s| {
                s["first"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|r| r == rid.as_str()))
            })
            .unwrap_or_else(|| panic!("{rid}: no first prefill in {engine_steps:#?}"));
        let json = daemon.client(&["inspect", &rid, "--json"]);
        assert!(
            json.status.success(),
            "{}",
            String::from_utf8_lossy(&json.stderr)
        );
        let record: Value = serde_json::from_slice(&json.stdout).expect("inspect --json");
        let unknown = record["engine_unknown"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for field in ["prefill_steps", "decode_steps"] {
            assert!(unknown.iter().any(|u| u == field), "{field}: {record:#?}");
        }
        assert!(record["prefill_steps"].is_null(), "{record:#?}");
        let arrival = record["arrival_mono_ns"].as_u64().expect("arrival");
        let out = daemon.client(&["inspect", &rid, "--steps", "100"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("steps (1):"), "{rid}: {want}\n{text}");
        let row = text
            .lines()
            .skip_while(|l| !l.starts_with("steps ("))
            .nth(1)
            .unwrap_or_default();
        assert!(row.starts_with("prefill "), "{row}\n{text}");
        let (start, end) = (ns(&want["start"]), ns(&want["end"]));
        let got = step_ms(row);
        let want_ms = [
            start.saturating_sub(arrival) as f64 / 1e6,
            (end - start) as f64 / 1e6,
        ];
        assert_eq!(got.len(), 2, "{row}");
        for (g, w) in got.iter().zip(want_ms) {
            // Drawn to 0.1 ms.
            assert!(
                (g - w).abs() <= 0.051,
                "{rid}: {got:?} vs SGLang {want_ms:?}\n{text}"
            );
        }
        checked += 1;
    }
    drop(front);
    let log = daemon.stop();
    eprintln!("sglang_ipc: {checked} requests' steps drawn as SGLang logged them");
    assert_eq!(checked, 8, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
