//! SGLang on its real stack: `python -m sglang.launch_server` 0.5.23 on the CPU (its own HTTP
//! server, TokenizerManager, Scheduler, Detokenizer and pickled ZeroMQ IPC) serving a tiny
//! Llama with dummy weights (`--load-format dummy`: nothing downloaded; the forward really runs,
//! it is just small) and a 320-token KV pool, so requests wait and are retracted. Ground truth
//! comes from SGLang's own scheduler (tests/engine/sglang/truth/sitecustomize.py wraps the
//! function that stamps `forward_entry_time` and `Req.reset_for_retract`). The real agent
//! records the HTTP process with eBPF, attached after start-up (so it also joins IPC streams
//! mid-way); every admitted request's admission must be within 1 ms of SGLang's stamp and its
//! retractions and prompt tokens exact.

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
    free_port,
};
use serde_json::Value;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sglang_python() -> PathBuf {
    std::env::var_os("INFERSCOPE_SGLANG_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv-sglang/bin/python3"))
}

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM: SGLang's launcher stops its scheduler and detokenizer on the way out.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http(port: u16, request: &str, timeout: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to SGLang");
    s.set_read_timeout(Some(timeout)).expect("read timeout");
    s.write_all(request.as_bytes()).expect("sending");
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    // A read error (the timeout) ends the exchange; the caller checks what came.
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.ends_with(b"0\r\n\r\n") {
            break;
        }
        if raw.starts_with(b"HTTP/1.1 200")
            && raw.windows(4).any(|w| w == b"\r\n\r\n")
            && !raw.windows(7).any(|w| w == b"chunked")
        {
            break;
        }
    }
    raw
}

fn wait_healthy(port: u16, server: &mut Child) {
    // Start-up (imports, tokenizer, dummy weights) takes about a minute on two cores.
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = server.try_wait() {
            panic!("SGLang exited ({status}): see its log; run scripts/setup.sh for .venv-sglang");
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let raw = http(
                port,
                "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                Duration::from_secs(10),
            );
            if raw.starts_with(b"HTTP/1.1 200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("SGLang did not become healthy on {port}");
}

/// The server's child titled `sglang::scheduler…`, from /proc.
fn scheduler_of(server: u32) -> u32 {
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
        if ppid == Some(server) && cmdline.starts_with(b"sglang::scheduler") {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "SGLang's scheduler: {found:?}");
    found[0]
}

fn ns(repr: &Value) -> u64 {
    let s: f64 = repr.as_str().expect("a repr").parse().expect("a float");
    (s * 1e9 + 0.5).floor() as u64
}

/// Starts SGLang's real server on the test model (a tiny Llama config and a WordLevel
/// tokenizer, one token per word `w<n>`, no weights) with its scheduler writing the ground
/// truth to `dir/truth.jsonl`; `extra` adds server arguments.
fn launch(dir: &std::path::Path, port: u16, extra: &[&str]) -> (Server, PathBuf) {
    let model = dir.join("model");
    let status = Command::new(sglang_python())
        .args(["-m", "inferscope_vllm.model"])
        .arg(&model)
        .env("PYTHONPATH", repo_root().join("tests/engine/vllm"))
        .stdout(Stdio::null())
        .status()
        .expect("writing the test model");
    assert!(status.success());
    let truth_path = dir.join("truth.jsonl");
    let child = Command::new(sglang_python())
        .args(["-m", "sglang.launch_server", "--model-path"])
        .arg(&model)
        .args(["--device", "cpu", "--load-format", "dummy"])
        .args([
            "--attention-backend",
            "torch_native",
            "--sampling-backend",
            "pytorch",
        ])
        .args([
            "--disable-cuda-graph",
            "--skip-server-warmup",
            "--enable-metrics",
        ])
        .args(["--max-total-tokens", "320", "--context-length", "300"])
        .args(["--schedule-conservativeness", "0.01"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(extra)
        .current_dir(dir)
        .env("PYTHONPATH", repo_root().join("tests/engine/sglang/truth"))
        .env("INFERSCOPE_SGLANG_TRUTH", &truth_path)
        // SGLang's own knob: admission reserves at most 8 future tokens per new request, so it
        // admits more than the pool can finish and retracts in decode.
        .env("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "8")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("sglang.out")).expect("log"))
        .stderr(std::fs::File::create(dir.join("sglang.log")).expect("log"))
        .spawn()
        .expect("starting SGLang (run scripts/setup.sh for .venv-sglang)");
    (Server { child }, truth_path)
}

/// The SSE stream's `id` (SGLang's rid).
fn stream_id(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let at = text.find("data: {")?;
    let line = text[at + 6..].lines().next()?;
    let v: Value = serde_json::from_str(line).ok()?;
    v["id"].as_str().map(str::to_owned)
}

#[test]
fn sglang_real_scheduler_admission_retractions_and_prompt_tokens() {
    // Two SGLang servers at once starve two cores: one at a time.
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("sglang-real");
    let port = free_port();
    let (mut server, truth_path) = launch(&dir, port, &[]);
    wait_healthy(port, &mut server.child);

    let steps_path = dir.join("agent-steps.jsonl");
    let steps_arg = steps_path.to_string_lossy().into_owned();
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string(), "--steps", &steps_arg]);
    recorder.wait_attached(server.child.id(), Duration::from_secs(60));

    // 12 streams at once: prompts of 16..38 tokens, 120 tokens out each (ignore_eos): SGLang
    // admits on the prompts and a small output reserve, then decode outgrows the 320-token
    // pool and the scheduler retracts.
    let clients: Vec<_> = (0..12)
        .map(|i| {
            std::thread::spawn(move || {
                // Distinct words: no prefix shared in SGLang's radix cache.
                let words: Vec<String> =
                    (0..15 + 2 * i).map(|j| format!("w{}", 100 + 200 * i + j)).collect();
                let words = words.join(" ");
                let rid = if i % 2 == 0 {
                    format!(r#""rid":"it-real-{i}","#)
                } else {
                    String::new()
                };
                let body = format!(
                    r#"{{{rid}"model":"m","max_tokens":120,"ignore_eos":true,"stream":true,"messages":[{{"role":"user","content":"{words}"}}]}}"#
                );
                let req = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                http(port, &req, Duration::from_secs(240))
            })
        })
        .collect();
    let mut ids = Vec::new();
    for c in clients {
        let raw = c.join().expect("client");
        assert!(
            raw.ends_with(b"0\r\n\r\n"),
            "{}",
            String::from_utf8_lossy(&raw)
        );
        ids.push(stream_id(&raw).expect("a stream id"));
    }
    recorder.wait_records(Duration::from_secs(60), "the streams' records", |records| {
        records
            .iter()
            .filter(|r| r["path"] == "/v1/chat/completions")
            .count()
            >= ids.len()
    });
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let scheduler = scheduler_of(server.child.id());
    drop(server);
    let truth = read_records(&truth_path);
    let agent_steps: Vec<Value> = read_records(&steps_path)
        .into_iter()
        .filter(|s| s["engine"] == "sglang")
        .collect();

    assert!(counters.get("sglang_version_from_package") >= 1, "{log}");
    for bad in [
        "sglang_ipc_layout_assumed",
        "sglang_ipc_layout_mismatch",
        "sglang_ipc_not_pickle",
        "sglang_requests_unjoined",
        "sglang_admission_unknown",
    ] {
        assert_eq!(counters.get(bad), 0, "{bad}\n{log}");
    }
    let mut admitted: HashMap<&str, &Value> = HashMap::new();
    let mut retractions: HashMap<&str, u64> = HashMap::new();
    for t in &truth {
        let rid = t["rid"].as_str().unwrap();
        match t["event"].as_str() {
            Some("admit") => {
                admitted.insert(rid, t);
            }
            Some("retract") => *retractions.entry(rid).or_default() += 1,
            _ => panic!("{t}"),
        }
    }
    let by_rid: HashMap<&str, &Value> = records
        .iter()
        .filter_map(|r| Some((r["response_id"].as_str()?, r)))
        .collect();
    let mut worst_ns = 0u64;
    let mut waited = 0;
    for id in &ids {
        let t = admitted
            .get(id.as_str())
            .unwrap_or_else(|| panic!("SGLang never admitted {id}: {truth:#?}"));
        let rec = by_rid
            .get(id.as_str())
            .unwrap_or_else(|| panic!("no record for {id}: {records:#?}\n{log}"));
        assert_eq!(rec["engine"], "sglang");
        assert_eq!(rec["prompt_tokens"], t["input_len"], "{id}: {rec:#?}");
        assert_eq!(
            rec["preemptions"].as_u64(),
            Some(retractions.get(id.as_str()).copied().unwrap_or(0)),
            "{id}: {rec:#?}"
        );
        assert_eq!(rec["completion_tokens"], 120, "{id}: {rec:#?}");
        // SGLang's detokenizer re-bases the stamp it forwards by its own clock offset
        // (time.time() − perf_counter(), read at a slightly different instant): microseconds.
        let got = rec["admitted_mono_ns"].as_u64().unwrap();
        let want = ns(&t["forward_entry_time"]);
        let err = got.abs_diff(want);
        assert!(err <= 1_000_000, "{id}: admitted {got} vs SGLang {want}");
        worst_ns = worst_ns.max(err);
        let arrival = rec["arrival_mono_ns"].as_u64().unwrap();
        let first_token = rec["first_token_mono_ns"].as_u64().unwrap();
        assert!(arrival <= got && got <= first_token, "{rec:#?}");
        // Its one timed step: the batch of its first prefill, opened no later than SGLang's
        // admission stamp; its kernels are the scheduler's. Step counts are not invented.
        let has = |s: &Value, phase: &str| {
            s["requests"].as_array().is_some_and(|m| {
                m.iter()
                    .any(|m| m["request_id"] == id.as_str() && m["phase"] == phase)
            })
        };
        let prefills: Vec<&Value> = agent_steps
            .iter()
            .filter(|s| s["start_from"] == "forward_entry" && has(s, "prefill"))
            .collect();
        // One prefill, and one more for each retraction it was prefilled again after (a full
        // run on two loaded cores retracted one request of this test).
        let retracted = retractions.get(id.as_str()).copied().unwrap_or(0) as usize;
        assert!(
            (1..=1 + retracted).contains(&prefills.len()),
            "{id}: {retracted} retractions, {prefills:#?}"
        );
        let step = prefills
            .iter()
            .copied()
            .find(|step| {
                let (start, end) = (
                    step["start_mono_ns"].as_u64().unwrap(),
                    step["end_mono_ns"].as_u64().unwrap(),
                );
                start <= want + 1_000_000 && want <= end
            })
            .unwrap_or_else(|| panic!("{id}: SGLang admitted at {want}, steps {prefills:#?}"));
        assert_eq!(
            step["kernel_pid"].as_u64().or(step["pid"].as_u64()),
            Some(u64::from(scheduler)),
            "{step:#?}"
        );
        // Its decode steps (streamed: one output per step) are steps too, ending at their
        // capture (with `--port`, the TokenizerManager's read of BatchStrOutput), their start
        // unknown; the scheduler ran their kernels as well.
        let decodes: Vec<&Value> = agent_steps.iter().filter(|s| has(s, "decode")).collect();
        assert!(decodes.len() >= 100, "{id}: {} decode steps", decodes.len());
        for s in &decodes {
            assert_eq!(s["start_from"], "unknown", "{s:#?}");
            assert_eq!(s["start_mono_ns"], s["end_mono_ns"], "{s:#?}");
            assert_eq!(
                s["kernel_pid"].as_u64().or(s["pid"].as_u64()),
                Some(u64::from(scheduler)),
                "{s:#?}"
            );
        }
        let unknown = rec["engine_unknown"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            unknown.iter().any(|u| u == "decode_steps") && rec["decode_steps"].is_null(),
            "{rec:#?}"
        );
        if rec["queue_wait_ms"].as_f64().unwrap() > 50.0 {
            waited += 1;
        }
    }
    let retracted: u64 = retractions.values().sum();
    eprintln!(
        "sglang_engine: {} requests, {retracted} retractions, {waited} waited > 50 ms, worst admission error {worst_ns} ns",
        ids.len()
    );
    assert!(waited > 0, "no request waited: {records:#?}");
    assert!(retracted > 0, "SGLang retracted nothing: {truth:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every gRPC call named its rid, joined SGLang's, with a wire arrival; none lost.
fn assert_no_grpc_call_lost(counters: &agent::Counters, log: &str) {
    for zero in [
        "rpc_request_ids_unread",
        "sglang_requests_unjoined",
        "sglang_ipc_not_pickle",
        "arrival_wire_unknown",
        "requests_lost",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero} in\n{log}");
    }
}

/// Waits for SGLang's gRPC server to listen on `port`.
fn wait_for_grpc_port(server: &mut Server, port: u16, dir: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!(
                "SGLang exited ({status}): see {}",
                dir.join("sglang.log").display()
            );
        }
        assert!(Instant::now() < deadline, "SGLang's gRPC port never opened");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A gRPC call's record `r` joined to SGLang's own admission of the rid the call named (within
/// 1 ms, prompt length exact), its times inside the client's and in order.
fn assert_joined_to_sglang(r: &Value, call: &Value, truth: &[Value]) {
    let id = call["id"].as_str().unwrap();
    let admit = truth
        .iter()
        .find(|t| t["event"] == "admit" && t["rid"] == id)
        .unwrap_or_else(|| panic!("SGLang never admitted {id}"));
    assert_eq!(r["prompt_tokens"], admit["input_len"], "{r}");
    let got = r["admitted_mono_ns"].as_u64().unwrap();
    let want = ns(&admit["forward_entry_time"]);
    assert!(
        got.abs_diff(want) <= 1_000_000,
        "{id}: admitted {got} vs SGLang {want}"
    );
    let wire = r["arrival_wire_mono_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("no wire arrival: {r}"));
    let first = r["first_token_mono_ns"].as_u64().unwrap();
    assert!(wire >= call["send_ns"].as_u64().unwrap(), "{r} {call}");
    assert!(wire <= got && got <= first, "{r}");
    assert!(first <= call["first_ns"].as_u64().unwrap(), "{r} {call}");
}

/// SGLang's `--smg-grpc-mode` (smg-grpc-servicer's SglangScheduler in the server process, the same
/// scheduler and pickled IPC behind it): streaming `Generate` calls multiplexed over HTTP/2
/// connections, some cancelled mid-stream. Each call is one record that names the request id
/// its message carried, which is the scheduler's rid: joined to SGLang's own admission stamp
/// (within 1 ms) and prompt length, its response messages counted exactly, its times inside
/// the client's own.
#[test]
fn sglang_grpc_calls_are_joined_to_the_scheduler() {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("sglang-grpc");
    // `--port` is the gRPC server's (its HTTP sidecar takes the next one).
    let port = free_port();
    // A pool that holds every call at once: this test is about the join, not retractions.
    let grpc = ["--smg-grpc-mode", "--max-total-tokens", "4096"];
    let (mut server, truth_path) = launch(&dir, port, &grpc);
    wait_for_grpc_port(&mut server, port, &dir);
    let metrics_path = dir.join("metrics.jsonl");
    let mut recorder = Recorder::start(
        &dir,
        &[
            "--port",
            &port.to_string(),
            "--metrics",
            metrics_path.to_str().unwrap(),
        ],
    );
    recorder.wait_attached(server.child.id(), Duration::from_secs(60));

    let calls = inferscope_integration_tests::grpc_engine::run_calls(
        &sglang_python(),
        port,
        &[
            "24",
            "8",
            "--engine",
            "sglang",
            "--channels",
            "2",
            "--tag",
            "sg",
            "--cancel-every",
            "8",
            "--prompt-lens",
            "8,24,60",
            "--max-tokens",
            "4,16",
        ],
    );
    assert_eq!(calls.len(), 24);
    let generate = "/sglang.grpc.scheduler.SglangScheduler/Generate";
    recorder.wait_records(Duration::from_secs(60), "every call's record", |r| {
        r.iter().filter(|r| r["path"] == generate).count() >= calls.len()
    });
    // In gRPC mode SGLang's /metrics is on its HTTP sidecar (the next port, same process), which
    // opens after the gRPC port: the scraper finds it among the process's listening ports.
    let sidecar = format!("port={} path=\"/metrics\"", port + 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&recorder.log)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("scraping engine metrics") && l.contains(&sidecar))
    {
        assert!(
            Instant::now() < deadline,
            "SGLang's metrics sidecar (port {}) never scraped",
            port + 1
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    drop(server);
    let truth = read_records(&truth_path);

    let mut cancelled = 0;
    for call in &calls {
        let r = inferscope_integration_tests::grpc_engine::record_of(
            &records, call, generate, "sglang",
        );
        if call["cancelled"] == true {
            cancelled += 1;
        }
        assert_joined_to_sglang(r, call, &truth);
        assert_eq!(r["prompt_tokens"], call["prompt_len"], "{r} {call}");
    }
    assert!(cancelled >= 2, "{cancelled} calls cancelled");
    assert_eq!(counters.get("rpc_request_ids_read") as usize, calls.len());
    assert!(counters.get("metrics_scrapes") > 0, "{log}");
    assert_no_grpc_call_lost(&counters, &log);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SGLang's native gRPC server (`--grpc-port`: Rust, in the server process, in front of the same
/// tokenizer manager and scheduler), with a client built from its proto: streaming `Generate`
/// (token ids) and `TextGenerate` (text) calls, 8 at once. Their `rid` comes after the prompt,
/// hundreds of bytes into the message: each call is still one record named by it, joined to
/// SGLang's own admission stamp (within 1 ms) and prompt length, its response messages counted
/// exactly, its times inside the client's.
#[test]
fn sglang_native_grpc_calls_are_joined_to_the_scheduler() {
    let _machine = inferscope_integration_tests::exclusive();
    let dir = inferscope_integration_tests::test_dir("sglang-native-grpc");
    let port = free_port();
    let grpc_port = free_port();
    let grpc = [
        "--grpc-port",
        &grpc_port.to_string(),
        "--max-total-tokens",
        "4096",
    ];
    let (mut server, truth_path) = launch(&dir, port, &grpc);
    wait_for_grpc_port(&mut server, grpc_port, &dir);
    let mut recorder = Recorder::start(&dir, &["--port", &grpc_port.to_string()]);
    recorder.wait_attached(server.child.id(), Duration::from_secs(60));

    let native = repo_root().join("tests/engine/sglang/native");
    let descriptors = inferscope_integration_tests::kserve::compile(
        &native,
        "sglang.proto",
        &dir.join("sglang.desc"),
    );
    let calls = inferscope_integration_tests::client::json_lines(
        Command::new(sglang_python())
            .arg(native.join("native_grpc.py"))
            .arg(grpc_port.to_string())
            .arg(&descriptors)
            .args(["24", "8"]),
    );
    assert_eq!(calls.len(), 24);
    for call in &calls {
        assert!(call.get("error").is_none(), "{call}");
        assert_eq!(call["finished"], true, "{call}");
    }
    recorder.wait_records(Duration::from_secs(60), "every call's record", |r| {
        r.iter()
            .filter(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/sglang.runtime.v1."))
            })
            .count()
            >= calls.len()
    });
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    drop(server);
    let truth = read_records(&truth_path);

    for call in &calls {
        let path = call["path"].as_str().unwrap();
        let r =
            inferscope_integration_tests::grpc_engine::record_of(&records, call, path, "sglang");
        assert_joined_to_sglang(r, call, &truth);
    }
    assert_eq!(counters.get("rpc_request_ids_read") as usize, calls.len());
    assert_no_grpc_call_lost(&counters, &log);
    let _ = std::fs::remove_dir_all(&dir);
}
