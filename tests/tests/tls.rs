//! HTTPS on real servers, through the TLS library probes (`tests/engine/tls_sse.py`): uvicorn
//! on uvloop, where the event loop moves the ciphertext through `ssl.MemoryBIO` (vLLM's and
//! SGLang's front end), and threaded `http.server` on `ssl.SSLSocket`, where OpenSSL reads and
//! writes the socket itself. Ground truth on both sides: the server logs when it handed each
//! token event to the TLS library, the client counts the events it decrypted and when it sent
//! each request. Every request has one record with `tls`, its exact event count and the
//! server's completion id; the first token is the server's own first write; the wire arrival
//! is the request's segment (not the handshake's) and TTFT agrees with the truth.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::Duration,
};

use inferscope_integration_tests::{
    agent::{Counters, Recorder},
    engine, free_port, test_dir,
    vllm::{VllmOptions, VllmServer, vllm_python},
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

#[derive(Clone, Copy, PartialEq)]
enum Server {
    /// uvicorn + uvloop: memory BIO.
    Uvicorn,
    /// http.server threads + ssl.SSLSocket: socket BIO.
    Threaded,
}

impl Server {
    fn mode(self) -> &'static str {
        match self {
            Server::Uvicorn => "uvicorn",
            Server::Threaded => "threaded",
        }
    }

    fn python(self) -> PathBuf {
        let python = match self {
            // uvicorn and uvloop come with the vLLM venv.
            Server::Uvicorn => vllm_python(),
            Server::Threaded => engine::python(),
        };
        assert!(
            python.exists(),
            "{} missing (scripts/setup.sh test)",
            python.display()
        );
        python
    }
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("engine/tls_sse.py")
}

struct Running {
    server: KillOnDrop,
    port: u16,
    log: PathBuf,
    python: PathBuf,
}

fn start(kind: Server, dir: &Path) -> Running {
    let (cert, key) = inferscope_integration_tests::self_signed_certificate(dir);
    let port = free_port();
    let log = dir.join("server.jsonl");
    let python = kind.python();
    let mut child = Command::new(&python)
        .arg(script())
        .args([kind.mode(), &port.to_string()])
        .args([&cert, &key, &log])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the HTTPS server");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("server stdout"))
        .read_line(&mut ready)
        .expect("server ready line");
    assert_eq!(ready.trim(), "ready");
    Running {
        server: KillOnDrop(child),
        port,
        log,
        python,
    }
}

/// The client: `conns` keep-alive connections, `reqs` requests each; with `pause`, it stops
/// after that many requests per connection until [`Paused::resume`].
fn load(run: &Running, conns: usize, reqs: usize, pause: usize) -> (Child, Option<ChildStdin>) {
    load_model(&run.python, run.port, conns, reqs, pause, "tls-test")
}

fn load_model(
    python: &Path,
    port: u16,
    conns: usize,
    reqs: usize,
    pause: usize,
    model: &str,
) -> (Child, Option<ChildStdin>) {
    let mut child = Command::new(python)
        .arg(script())
        .args([
            "load",
            &port.to_string(),
            &conns.to_string(),
            &reqs.to_string(),
            &pause.to_string(),
            model,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the HTTPS client");
    let stdin = child.stdin.take();
    (child, stdin)
}

/// The client's lines: one JSON object per request.
fn finish_load(child: Child) -> Vec<Value> {
    let out = child.wait_with_output().expect("waiting for the client");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "client failed: {text}");
    assert_eq!(text.lines().last(), Some("done"), "{text}");
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The server's log: completion id → the times it handed each token event to TLS.
fn server_log(path: &Path) -> HashMap<String, Vec<u64>> {
    std::fs::read_to_string(path)
        .expect("reading the server's log")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let times = v["token_ns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect();
            (v["id"].as_str().unwrap().to_owned(), times)
        })
        .collect()
}

/// Checks every client request of `phase` against its record and the server's log; returns
/// |TTFT − truth| per request, in ms.
fn check(records: &[Value], calls: &[Value], server: &HashMap<String, Vec<u64>>) -> Vec<f64> {
    let by_id: HashMap<&str, &Value> = records
        .iter()
        .filter_map(|r| Some((r["response_id"].as_str()?, r)))
        .collect();
    let mut errors = Vec::new();
    let mut handoffs = Vec::new();
    for call in calls {
        let id = call["id"].as_str().unwrap();
        let r = by_id
            .get(id)
            .unwrap_or_else(|| panic!("no record for {call}"));
        let tokens = &server[id];
        assert_eq!(r["tls"], true, "{r}");
        assert_eq!(r["path"], "/v1/chat/completions", "{r}");
        assert_eq!(r["status"], 200, "{r}");
        assert_eq!(r["ended_by"], "complete", "{r}");
        assert_eq!(r["capture_truncated"], false, "{r}");
        assert!(r["incomplete"].is_null(), "{r}");
        assert_eq!(r["output_chunks"], call["events"], "{r} {call}");
        assert_eq!(tokens.len() as u64, call["events"].as_u64().unwrap());
        // The first token is the server's own hand-off to TLS, before the client decrypted it.
        // The server's stamp precedes its SSL_write by its own work, and on the threaded server
        // by a GIL hand-over at worst (5 ms switch interval): bounded here, the median below.
        let first = r["first_token_mono_ns"].as_u64().unwrap();
        assert!(
            first >= tokens[0] && first - tokens[0] < 10_000_000,
            "first token {first} vs the server's {}: {r}",
            tokens[0]
        );
        handoffs.push((first - tokens[0]) as f64 / 1e6);
        assert!(first <= call["first_ns"].as_u64().unwrap(), "{r} {call}");
        let last = r["last_token_mono_ns"].as_u64().unwrap();
        let server_last = *tokens.last().unwrap();
        assert!(
            last >= server_last && last - server_last < 10_000_000,
            "{r}"
        );
        // The request's own segment: after the client sent it (its handshake was done before
        // `start_ns`), before the server read it.
        let wire = r["arrival_wire_mono_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("no wire arrival: {r}"));
        let sent = call["start_ns"].as_u64().unwrap();
        assert!(
            wire >= sent,
            "wire {wire} before the client sent {sent}: {r}"
        );
        assert!(wire <= r["arrival_read_mono_ns"].as_u64().unwrap(), "{r}");
        let truth_ms = (tokens[0] - sent) as f64 / 1e6;
        errors.push((r["ttft_ms"].as_f64().unwrap() - truth_ms).abs());
    }
    same_connections(records, calls);
    handoffs.sort_by(f64::total_cmp);
    if let Some(median) = handoffs.get(handoffs.len() / 2) {
        assert!(
            *median < 0.5,
            "first token vs the server's hand-off, median {median} ms: {handoffs:?}"
        );
    }
    errors.sort_by(f64::total_cmp);
    errors
}

/// Every request one client connection sent is recorded on one agent connection, and no two
/// client connections share one: plaintext never crosses connections.
fn same_connections(records: &[Value], calls: &[Value]) {
    let mut by_client: HashMap<u64, std::collections::HashSet<u64>> = HashMap::new();
    for call in calls {
        let Some(r) = records.iter().find(|r| r["response_id"] == call["id"]) else {
            continue;
        };
        by_client
            .entry(call["conn"].as_u64().unwrap())
            .or_default()
            .insert(r["connection_id"].as_u64().unwrap());
    }
    let mut seen = std::collections::HashSet::new();
    for (client, agent) in &by_client {
        assert_eq!(
            agent.len(),
            1,
            "client connection {client} became {agent:?}"
        );
        assert!(
            seen.insert(*agent.iter().next().unwrap()),
            "two client connections on one agent connection: {by_client:?}"
        );
    }
}

fn assert_close(errors: &[f64]) {
    let median = errors[errors.len() / 2];
    assert!(
        median < 1.0,
        "TTFT vs the client's send and the server's first write, median |error| {median} ms: {errors:?}"
    );
}

const CONNS: usize = 16;
const REQS: usize = 4;

fn every_request_is_exact(kind: Server, name: &str) {
    let dir = test_dir(name);
    let run = start(kind, &dir);
    let pid = run.server.0.id();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));

    let (client, _stdin) = load(&run, CONNS, REQS, 0);
    let calls = finish_load(client);
    assert_eq!(calls.len(), CONNS * REQS);
    recorder.wait_records(Duration::from_secs(30), "every request's record", |r| {
        r.len() >= CONNS * REQS
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    assert_eq!(records.len(), CONNS * REQS, "{records:#?}");
    let errors = check(&records, &calls, &server_log(&run.log));
    assert_close(&errors);

    let counters = Counters::beside(&log);
    assert_eq!(counters.get("kernel_tls_connections"), CONNS as u64);
    assert_eq!(counters.get("kernel_tls_ties"), CONNS as u64);
    assert_eq!(counters.get("tls_probes_attached"), 1);
    for zero in [
        "tls_connections_undecoded",
        "kernel_tls_untied",
        "requests_lost",
        "connection_gaps",
        "arrival_wire_unknown",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero}");
    }
}

#[test]
fn https_on_uvicorn_and_uvloop_memory_bio() {
    every_request_is_exact(Server::Uvicorn, "tls-uvicorn");
}

#[test]
fn https_on_threads_with_openssl_on_the_socket() {
    every_request_is_exact(Server::Threaded, "tls-threaded");
}

/// Connections whose handshake happened before the agent attached: their `SSL*` is tied at its
/// next read (memory BIO: by order after the socket read; socket BIO: inside the call).
fn live_tls_connections_are_joined(kind: Server, name: &str) -> (Vec<Value>, Counters) {
    let dir = test_dir(name);
    let run = start(kind, &dir);
    let pid = run.server.0.id();
    let (mut client, stdin) = load(&run, 8, 4, 1);
    let mut stdout = BufReader::new(client.stdout.as_mut().unwrap());
    // The "before" lines come first; then the pause.
    let mut before = 0;
    loop {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("client line");
        if line.trim() == "paused" {
            break;
        }
        assert!(line.starts_with('{'), "client said {line:?}");
        before += 1;
    }
    assert_eq!(before, 8);
    drop(stdout);
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    let mut stdin = stdin.unwrap();
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let calls = finish_load(client);
    let after: Vec<Value> = calls
        .into_iter()
        .filter(|c| c["phase"] == "after")
        .collect();
    assert_eq!(after.len(), 8 * 3);
    let log = recorder.log.clone();
    let records = recorder.stop();
    let counters = Counters::beside(&log);
    assert_eq!(counters.get("connections_preexisting"), 8);
    assert_eq!(counters.get("kernel_tls_connections"), 8);
    assert_eq!(counters.get("kernel_tls_ties"), 8);
    let server = server_log(&run.log);
    let recorded: Vec<Value> = after
        .iter()
        .filter(|c| records.iter().any(|r| r["response_id"] == c["id"]))
        .cloned()
        .collect();
    check(&records, &recorded, &server);
    (
        after
            .into_iter()
            .filter(|c| !recorded.contains(c))
            .collect(),
        counters,
    )
}

#[test]
fn live_tls_connections_on_uvloop_are_joined_at_their_next_read() {
    let (missing, counters) = live_tls_connections_are_joined(Server::Uvicorn, "tls-late-uvicorn");
    assert!(missing.is_empty(), "{missing:#?}");
    assert_eq!(counters.get("requests_lost"), 0);
}

#[test]
fn live_tls_connections_on_threads_are_joined_and_a_read_begun_before_attach_is_counted() {
    let (missing, counters) =
        live_tls_connections_are_joined(Server::Threaded, "tls-late-threaded");
    // Each connection's thread sat in SSL_read when the agent attached: that call's plaintext
    // cannot be had (its buffer was named before the probe existed), as with a plain read(2)
    // begun before attach. Its request is counted, never guessed; every later one is exact.
    assert!(missing.len() <= 8, "{missing:#?}");
    assert_eq!(
        counters.get("requests_lost_request_not_captured"),
        missing.len() as u64
    );
}

#[test]
fn without_the_tls_probes_https_is_counted_as_undecoded() {
    let dir = test_dir("tls-off");
    let run = start(Server::Uvicorn, &dir);
    let pid = run.server.0.id();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string(), "--no-tls"]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    let (client, _stdin) = load(&run, 4, 2, 0);
    assert_eq!(finish_load(client).len(), 8);
    let log = recorder.log.clone();
    let records = recorder.stop();
    assert!(records.is_empty(), "{records:#?}");
    let counters = Counters::beside(&log);
    assert_eq!(counters.get("tls_connections_undecoded"), 4);
    assert_eq!(counters.get("tls_probes_attached"), 0);
    assert_eq!(counters.get("kernel_tls_records"), 0);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("serves TLS that inferscope cannot decrypt"),
        "no warning in the agent's log"
    );
}

/// vLLM's own OpenAI server (uvicorn on uvloop) over HTTPS, on its real scheduler: every
/// request is joined to its admission, steps and prompt tokens exactly as over plain HTTP.
#[test]
fn vllm_over_https_is_joined_to_its_scheduler() {
    let dir = test_dir("tls-vllm");
    let (cert, key) = inferscope_integration_tests::self_signed_certificate(&dir);
    let port = free_port();
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let opts = VllmOptions {
        max_num_seqs: 16,
        https: true,
        extra: vec![
            "--ssl-keyfile".into(),
            path(&key),
            "--ssl-certfile".into(),
            path(&cert),
        ],
        ..Default::default()
    };
    let server = VllmServer::start(&dir.join("vllm"), port, &opts);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string()]);
    recorder.wait_attached(server.pid(), Duration::from_secs(60));

    let (client, _stdin) = load_model(&vllm_python(), port, 16, 2, 0, "tiny");
    let calls = finish_load(client);
    assert_eq!(calls.len(), 32);
    recorder.wait_records(Duration::from_secs(60), "every request's record", |r| {
        r.iter()
            .filter(|r| r["path"] == "/v1/chat/completions")
            .count()
            >= calls.len()
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    for call in &calls {
        let r = records
            .iter()
            .find(|r| r["response_id"] == call["id"])
            .unwrap_or_else(|| panic!("no record for {call}"));
        assert_eq!(r["tls"], true, "{r}");
        assert_eq!(r["engine"], "vllm", "{r}");
        assert_eq!(r["ended_by"], "complete", "{r}");
        assert_eq!(r["capture_truncated"], false, "{r}");
        assert_eq!(r["output_chunks"], call["events"], "{r} {call}");
        for joined in [
            "admitted_mono_ns",
            "queue_wait_ms",
            "prefill_ms",
            "prompt_tokens",
        ] {
            assert!(!r[joined].is_null(), "{joined} not joined: {r}");
        }
        assert!(r["prefill_steps"].as_u64().unwrap() >= 1, "{r}");
        let wire = r["arrival_wire_mono_ns"].as_u64().unwrap();
        let first = r["first_token_mono_ns"].as_u64().unwrap();
        assert!(wire >= call["start_ns"].as_u64().unwrap(), "{r} {call}");
        assert!(
            first > wire && first <= call["first_ns"].as_u64().unwrap(),
            "{r} {call}"
        );
    }
    let counters = Counters::beside(&log);
    assert_eq!(counters.get("kernel_tls_connections"), 16);
    for zero in [
        "tls_connections_undecoded",
        "requests_lost",
        "arrival_wire_unknown",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero}");
    }
}

/// The HTTP/2-over-TLS server (`tests/engine/h2_tls.py`): the process, its port and its log of
/// streams.
fn start_h2_tls(dir: &Path) -> (KillOnDrop, u16, PathBuf) {
    let (cert, key) = inferscope_integration_tests::self_signed_certificate(dir);
    let port = free_port();
    let log = dir.join("server.jsonl");
    let mut child = Command::new(engine::python())
        .arg(h2_tls_script())
        .arg(port.to_string())
        .args([&cert, &key, &log])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the HTTP/2 server");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("server stdout"))
        .read_line(&mut ready)
        .expect("server ready line");
    assert_eq!(ready.trim(), "ready");
    (KillOnDrop(child), port, log)
}

fn h2_tls_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("engine/h2_tls.py")
}

/// HTTP/2 over TLS (ALPN h2): a gRPC-style server on Python's ssl (`tests/engine/h2_tls.py`),
/// answering each stream from its own thread while its reader thread reads the next frames,
/// and curl multiplexing 24 calls on one connection, three times. One record per stream, with
/// the path curl sent (HPACK, Huffman-coded), the server's message count, and no gap: reads
/// and writes of one connection by two threads are numbered apart in the kernel.
#[test]
fn grpc_over_http2_and_tls_has_one_record_per_stream() {
    let dir = test_dir("tls-h2");
    let (server, port, log) = start_h2_tls(&dir);
    let pid = server.0.id();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));

    // One gRPC message asking for nothing in particular: the server picks the count.
    let body = dir.join("request.bin");
    std::fs::write(&body, [0, 0, 0, 0, 1, 5]).unwrap();
    const CALLS: usize = 24;
    const ROUNDS: usize = 3;
    let url = format!("https://127.0.0.1:{port}/inferscope.test.Gen/Stream");
    for round in 0..ROUNDS {
        let mut curl = Command::new("curl");
        curl.args(["-sSk", "--http2", "--parallel", "--parallel-max", "24"])
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .arg("--data-binary")
            .arg(format!("@{}", body.display()));
        for call in 0..CALLS {
            curl.arg("-o")
                .arg(dir.join(format!("out-{round}-{call}")))
                .arg(&url);
        }
        let status = curl.status().expect("running curl");
        assert!(status.success(), "curl failed: {status}");
    }
    recorder.wait_records(Duration::from_secs(30), "every stream's record", |r| {
        r.len() >= CALLS * ROUNDS
    });
    let agent_log = recorder.log.clone();
    let records = recorder.stop();
    assert_eq!(records.len(), CALLS * ROUNDS, "{records:#?}");
    let served: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(served.len(), CALLS * ROUNDS);
    for r in &records {
        let h2 = &r["http2"];
        assert_eq!(r["tls"], true, "{r}");
        assert_eq!(r["method"], "POST", "{r}");
        assert_eq!(r["path"], "/inferscope.test.Gen/Stream", "{r}");
        assert_eq!(h2["content_type"], "application/grpc", "{r}");
        assert_eq!(h2["grpc_status"], 0, "{r}");
        assert_eq!(h2["stream_end"], "end_stream", "{r}");
        assert_eq!(r["capture_truncated"], false, "{r}");
        assert!(r["incomplete"].is_null(), "{r}");
        let stream = h2["stream_id"].as_u64().unwrap();
        assert_eq!(h2["response_messages"], 4 + (stream / 2) % 20, "{r}");
        assert_eq!(r["output_chunks"], h2["response_messages"], "{r}");
        // The first message is the server's hand-off of one of this stream id's answers (its
        // stamp precedes the write by a GIL hand-over at worst among 24 answering threads).
        let first = r["first_token_mono_ns"].as_u64().unwrap();
        assert!(
            served.iter().any(|s| s["stream_id"] == stream
                && s["message_ns"][0]
                    .as_u64()
                    .is_some_and(|t| first >= t && first - t < 10_000_000)),
            "{r}"
        );
    }
    let counters = Counters::beside(&agent_log);
    assert_eq!(counters.get("http2_connections"), ROUNDS as u64);
    assert_eq!(counters.get("kernel_tls_connections"), ROUNDS as u64);
    for zero in [
        "connection_gaps",
        "h2_framing_lost",
        "h2_hpack_errors",
        "h2_hpack_unknown_fields",
        "grpc_message_framing_lost",
        "requests_lost",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero}");
    }
}

/// A gRPC request message of 40,000 bytes over HTTP/2 and TLS, answered with one message of
/// 100,000 bytes: the server reads each 16 KiB DATA frame's plaintext in one `SSL_read` (one
/// record and one chunk) and writes the answer's frames in one `SSL_write` (one record and 12
/// chunks), more than one record holds, so the TLS probe sends them as chunk series (walked in
/// `bpf_loop`). Every byte of every message is counted, none cut.
#[test]
fn tls_plaintext_larger_than_a_record_is_captured_whole() {
    const CALLS: usize = 3;
    const MESSAGE: usize = 40_000;
    let dir = test_dir("tls-h2-large");
    let (server, port, _log) = start_h2_tls(&dir);
    let pid = server.0.id();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    let mut body = vec![0u8];
    body.extend_from_slice(&(MESSAGE as u32).to_be_bytes());
    body.extend((0..MESSAGE).map(|i| (i % 251) as u8));
    let path = dir.join("request.bin");
    std::fs::write(&path, &body).unwrap();
    let url = format!("https://127.0.0.1:{port}/inferscope.test.Gen/Stream");
    for _ in 0..CALLS {
        let status = Command::new("curl")
            .args(["-sSk", "--http2", "-o", "/dev/null"])
            .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
            .arg("--data-binary")
            .arg(format!("@{}", path.display()))
            .arg(&url)
            .status()
            .expect("running curl");
        assert!(status.success(), "curl failed: {status}");
    }
    recorder.wait_records(Duration::from_secs(30), "every call's record", |r| {
        r.len() >= CALLS
    });
    let agent_log = recorder.log.clone();
    let records = recorder.stop();
    assert_eq!(records.len(), CALLS, "{records:#?}");
    for r in &records {
        assert_eq!(r["tls"], true, "{r}");
        assert_eq!(r["capture_truncated"], false, "{r}");
        assert_eq!(r["http2"]["request_messages"], 1, "{r}");
        assert_eq!(r["http2"]["request_message_bytes"], MESSAGE as u64, "{r}");
        // tests/engine/h2_tls.py's LARGE_ANSWER.
        assert_eq!(r["http2"]["response_messages"], 1, "{r}");
        assert_eq!(r["http2"]["response_message_bytes"], 100_000, "{r}");
        assert_eq!(r["http2"]["grpc_status"], 0, "{r}");
    }
    let counters = Counters::beside(&agent_log);
    // Per call: two 16 KiB reads and the answer's write.
    assert!(
        counters.get("capture_chunked_syscalls") >= 3 * CALLS as u64,
        "no TLS read was sent as a chunk series: {}",
        counters.get("capture_chunked_syscalls")
    );
    for zero in [
        "capture_chunks_lost",
        "capture_chunks_orphaned",
        "kernel_records_unsent",
        "kernel_tls_nested",
        "connection_gaps",
        "h2_framing_lost",
        "grpc_message_framing_lost",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// HTTP/2 over TLS, calls a few milliseconds apart on one connection (`h2_tls.py client`): the
/// server reads each segment's plaintext frame by frame, so the read that opens a stream is not
/// the read that took its segment. Each stream's wire arrival is still its own segment: after the
/// client's write, before the server had read its HEADERS; never the handshake's. Its TTFT agrees
/// with the truth (the client's send to the server's hand-off of the first message) within 1 ms.
#[test]
fn h2_over_tls_streams_arrive_at_their_own_segments() {
    const CALLS: usize = 24;
    let dir = test_dir("tls-h2-arrival");
    let (server, port, log) = start_h2_tls(&dir);
    let pid = server.0.id();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    let calls = inferscope_integration_tests::client::json_lines(
        Command::new(engine::python()).arg(h2_tls_script()).args([
            "client",
            &port.to_string(),
            &CALLS.to_string(),
            "5",
        ]),
    );
    assert_eq!(calls.len(), CALLS);
    recorder.wait_records(Duration::from_secs(30), "every stream's record", |r| {
        r.len() >= CALLS
    });
    let agent_log = recorder.log.clone();
    let records = recorder.stop();
    let served: HashMap<u64, Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["stream_id"].as_u64().unwrap(), v))
        .collect();
    let mut ttft_errors_ms = Vec::new();
    for call in &calls {
        let stream = call["stream_id"].as_u64().unwrap();
        let r = records
            .iter()
            .find(|r| r["http2"]["stream_id"] == stream)
            .unwrap_or_else(|| panic!("no record of stream {stream}"));
        let s = &served[&stream];
        let wire = r["arrival_wire_mono_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("{r}"));
        let send = call["send_ns"].as_u64().unwrap();
        let headers_read = s["headers_ns"].as_u64().unwrap();
        assert!(send <= wire && wire <= headers_read, "{r}\n{call}\n{s}");
        let truth_ms = (s["message_ns"][0].as_u64().unwrap() - send) as f64 / 1e6;
        ttft_errors_ms.push(r["ttft_ms"].as_f64().unwrap() - truth_ms);
    }
    eprintln!("h2 over TLS: TTFT - truth (ms): {ttft_errors_ms:?}");
    // TLS hides which segment a call's bytes were in: behind a server that reads late, a
    // segment that came after the call's (the client's window updates) can stand for it, never
    // one before. So TTFT errs short, by at most the server's delay in reading the call.
    let mut abs: Vec<f64> = ttft_errors_ms.iter().map(|e| e.abs()).collect();
    abs.sort_by(f64::total_cmp);
    assert!(abs[abs.len() / 2] < 0.2, "median: {ttft_errors_ms:?}");
    assert!(abs[abs.len() * 9 / 10] < 1.0, "p90: {ttft_errors_ms:?}");
    assert!(
        ttft_errors_ms.iter().all(|e| *e < 0.5),
        "{ttft_errors_ms:?}"
    );
    assert_eq!(Counters::beside(&agent_log).get("arrival_wire_unknown"), 0);
}

/// A second copy of OpenSSL loaded after the agent attached (`tests/engine/tls_second_copy.py`:
/// the system's libssl mapped at start, then a copy at a path of its own, as a wheel bundles
/// one, serving HTTPS through ctypes): the agent sees the new copy among the process's mapped
/// files and probes it, so the requests it serves are recorded, not counted undecoded.
#[test]
fn a_copy_of_openssl_loaded_after_attach_is_probed_too() {
    const REQUESTS: u64 = 6;
    let dir = test_dir("tls-second-copy");
    let (cert, key) = inferscope_integration_tests::self_signed_certificate(&dir);
    let port = free_port();
    let log = dir.join("server.jsonl");
    let copy = dir.join("libssl-bundled.so.3");
    let mut child = Command::new(engine::python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("engine/tls_second_copy.py"))
        .arg(port.to_string())
        .args([&cert, &key, &log, &copy])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the HTTPS server");
    let mut stdin = child.stdin.take().expect("server stdin");
    let mut out = BufReader::new(child.stdout.take().expect("server stdout"));
    let server = KillOnDrop(child);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = server.0.id();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    writeln!(stdin, "go").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "serving");
    // Mapped files are looked at again every 2 s.
    inferscope_integration_tests::agent::wait_log(
        &recorder.log,
        "libssl-bundled.so.3",
        Duration::from_secs(30),
    );
    for k in 0..REQUESTS {
        let status = Command::new("curl")
            .args([
                "-sSk",
                "-N",
                "-o",
                "/dev/null",
                "-H",
                "content-type: application/json",
            ])
            .arg("-d")
            .arg(format!("{{\"max_tokens\": {}, \"stream\": true}}", 3 + k))
            .arg(format!("https://127.0.0.1:{port}/v1/chat/completions"))
            .status()
            .expect("running curl");
        assert!(status.success());
    }
    recorder.wait_records(Duration::from_secs(30), "every request's record", |r| {
        r.len() as u64 >= REQUESTS
    });
    let agent_log = recorder.log.clone();
    let mut records = recorder.stop();
    records.sort_by_key(|r| r["arrival_mono_ns"].as_u64());
    let served: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len() as u64, REQUESTS, "{records:#?}");
    assert_eq!(served.len() as u64, REQUESTS);
    for (k, (r, s)) in records.iter().zip(&served).enumerate() {
        assert_eq!(r["tls"], true, "{r}");
        assert_eq!(r["ended_by"], "complete", "{r}");
        assert_eq!(r["output_chunks"], 3 + k as u64, "{r}");
        assert_eq!(s["events"], 3 + k as u64);
        let first = r["first_token_mono_ns"].as_u64().unwrap();
        let stamp = s["token_ns"][0].as_u64().unwrap();
        assert!(first >= stamp && first - stamp < 10_000_000, "{r} {s}");
    }
    let counters = Counters::beside(&agent_log);
    assert_eq!(counters.get("tls_connections_undecoded"), 0);
    assert_eq!(counters.get("tls_probes_attached"), 1, "one process");
    assert!(counters.get("hooks_attached_late") >= 1);
}
