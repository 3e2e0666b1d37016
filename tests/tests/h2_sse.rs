//! Token streams inside HTTP/2 (`tests/engine/h2_sse.py`): real ASGI servers that speak HTTP/2 to
//! their clients (hypercorn on h2c and on TLS with ALPN, granian's hyper on h2c), streaming
//! OpenAI-style server-sent events and Ollama-style JSON lines, to a client (httpx with h2) that
//! multiplexes many streams on each connection. Ground truth on both sides: the server logs when
//! its app got each request and when it handed each token event to the server; the client counts
//! the token events it received and when it sent each request and read the first. Every stream
//! must become one record with its id and path, the server's event count as chunks, its first and
//! last token at the server's own writes, TTFT inside the client's, and nothing cut or unframed,
//! as over HTTP/1.1; on connections older than the agent as well.

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

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("engine/h2_sse.py")
}

#[derive(Clone, Copy)]
enum Server {
    Hypercorn,
    Granian,
}

struct Running {
    _server: KillOnDrop,
    port: u16,
    log: PathBuf,
    tls: bool,
}

impl Running {
    fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The process that accepts the connections (granian's worker is a grandchild).
    fn listener_pid(&self) -> u32 {
        let out = Command::new("ss")
            .args(["-Hltnp", &format!("sport = :{}", self.port)])
            .output()
            .expect("running ss (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split("pid=")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("nothing listens on {}: {text}", self.port))
    }
}

fn start(server: Server, tls: bool, dir: &Path) -> Running {
    let port = free_port();
    let log = dir.join("server.jsonl");
    let mode = match server {
        Server::Hypercorn => "serve",
        Server::Granian => "granian",
    };
    let mut command = Command::new(engine::python());
    command
        .arg(script())
        .args([mode, &port.to_string()])
        .arg(&log);
    if tls {
        let (cert, key) = inferscope_integration_tests::self_signed_certificate(dir);
        command.args([cert, key]);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the HTTP/2 server (scripts/setup.sh test installs hypercorn, granian)");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("server stdout"))
        .read_line(&mut ready)
        .expect("server ready line");
    assert_eq!(ready.trim(), "ready");
    Running {
        _server: KillOnDrop(child),
        port,
        log,
        tls,
    }
}

/// The client: `conns` HTTP/2 connections with `streams` concurrent streams each, on `route`
/// ("chat": SSE, "generate": JSON lines); with `pause`, a second round after a line on stdin.
fn client(run: &Running, conns: usize, streams: usize, route: &str, pause: bool) -> Child {
    Command::new(engine::python())
        .arg(script())
        .args(["client", &run.url()])
        .args([conns.to_string(), streams.to_string()])
        .args([route, if pause { "1" } else { "0" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the HTTP/2 client (httpx[http2])")
}

fn finish(child: Child) -> Vec<Value> {
    let out = child.wait_with_output().expect("waiting for the client");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "client failed: {text}");
    assert_eq!(text.lines().last(), Some("done"), "{text}");
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The server's log: completion id (or x-request-id) → (when the app got the request, when it
/// handed each token event over).
fn server_log(path: &Path) -> HashMap<String, (u64, Vec<u64>)> {
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
            let id = v["id"].as_str().unwrap().to_owned();
            (id, (v["entry_ns"].as_u64().unwrap(), times))
        })
        .collect()
}

const MS: u64 = 1_000_000;

/// Checks each client request against its one record and the server's log. Returns, per request,
/// |agent's first-to-last token span − the server's| in ms (the inter-token gaps' sum).
/// `joined`: the connections predate the agent, so header values the client's encoder had put in
/// its HPACK table before read unknown (never guessed); the bodies still say the rest.
fn check(
    records: &[Value],
    calls: &[Value],
    server: &HashMap<String, (u64, Vec<u64>)>,
    joined: bool,
) -> Vec<f64> {
    let mut span_errors = Vec::new();
    for call in calls {
        let (key, field) = match call["id"] == call["x_request_id"] {
            true => (call["x_request_id"].as_str().unwrap(), "x_request_id"),
            false => (call["id"].as_str().unwrap(), "response_id"),
        };
        let matching: Vec<&Value> = records.iter().filter(|r| r[field] == key).collect();
        assert_eq!(matching.len(), 1, "records for {call}: {matching:#?}");
        let r = matching[0];
        let (entry, tokens) = &server[key];
        assert_eq!(r["status"], 200, "{r}");
        assert_eq!(r["ended_by"], "complete", "{r}");
        assert!(r["incomplete"].is_null(), "{r}");
        assert_eq!(r["capture_truncated"], false, "{r}");
        if joined {
            assert!(r["x_request_id"].is_null() || r["x_request_id"] == call["x_request_id"]);
            assert!(["unknown", "/v1/chat/completions"].contains(&r["path"].as_str().unwrap()));
        } else {
            assert_eq!(r["x_request_id"], call["x_request_id"], "{r}");
        }
        assert_eq!(r["model"], "h2-test", "the request body was read: {r}");
        assert_eq!(r["stream"], true, "{r}");
        assert_eq!(tokens.len() as u64, call["chunks"].as_u64().unwrap());
        assert_eq!(r["output_chunks"], call["chunks"], "{r} {call}");
        assert_eq!(r["completion_tokens"], call["chunks"], "{r}");
        // The request arrived after the client sent it and before the app was handed it.
        let arrival = r["arrival_mono_ns"].as_u64().unwrap();
        let sent = call["start_ns"].as_u64().unwrap();
        assert!(
            arrival >= sent,
            "arrival {arrival} before the send {sent}: {r}"
        );
        assert!(
            arrival <= *entry,
            "arrival {arrival} after the app got it {entry}: {r}"
        );
        // The first and last token: the server's own writes, after its stamps, before the
        // client read them.
        let first = r["first_token_mono_ns"].as_u64().unwrap();
        assert!(
            first >= tokens[0] && first - tokens[0] < 20 * MS,
            "first token {first} vs the server's {}: {r}",
            tokens[0]
        );
        assert!(first <= call["first_ns"].as_u64().unwrap(), "{r} {call}");
        let last = r["last_token_mono_ns"].as_u64().unwrap();
        let server_last = *tokens.last().unwrap();
        assert!(last >= server_last && last - server_last < 20 * MS, "{r}");
        assert!(last <= call["end_ns"].as_u64().unwrap(), "{r} {call}");
        let ttft = r["ttft_ms"].as_f64().unwrap();
        let client_ttft = (call["first_ns"].as_u64().unwrap() - sent) as f64 / 1e6;
        assert!(
            ttft <= client_ttft,
            "TTFT {ttft} ms > the client's {client_ttft}: {r}"
        );
        let span = (last - first) as f64 / 1e6;
        let server_span = (server_last - tokens[0]) as f64 / 1e6;
        span_errors.push((span - server_span).abs());
        assert!(r["itl_p50_ms"].as_f64().is_some(), "{r}");
    }
    span_errors.sort_by(f64::total_cmp);
    let median = span_errors[span_errors.len() / 2];
    // The server's stamp is taken before its app hands the event over, and the server's writer
    // runs behind its app when many streams start at once: up to ~1.2 ms (h2c, granian and
    // hypercorn) and 3 ms (TLS) on fresh connections beside a parallel test; when every stream
    // of the joined connections starts together, 1 to 6 ms (TLS, quiet machine) and 4 to 5 ms
    // (h2c, beside the rest of the suite) — measured: the client still read each first token 1
    // to 2 ms after the agent's stamp. The stamps and the client's reads bound the agent's
    // times (checked above, per token); this median only catches a systematic offset.
    let bound = if joined { 8.0 } else { 3.0 };
    assert!(
        median < bound,
        "token span vs the server's, median |error| {median} ms: {span_errors:?}"
    );
    span_errors
}

fn zero_losses(counters: &Counters) {
    for zero in [
        "requests_incomplete_http2_framing",
        "requests_lost",
        "h2_framing_lost",
        "sse_json_error",
        "sse_events_cut",
        "request_body_json_error",
    ] {
        assert_eq!(counters.get(zero), 0, "{zero}");
    }
}

/// One server, one agent: chat streams (SSE), then JSON-lines streams.
fn every_stream_is_timed(server: Server, tls: bool, name: &str) {
    let dir = test_dir(name);
    let run = start(server, tls, &dir);
    let pid = run.listener_pid();
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));

    let mut calls = finish(client(&run, 4, 8, "chat", false));
    calls.extend(finish(client(&run, 2, 6, "generate", false)));
    assert_eq!(calls.len(), 4 * 8 + 2 * 6);
    recorder.wait_records(Duration::from_secs(30), "every stream's record", |r| {
        r.len() >= calls.len()
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    assert_eq!(records.len(), calls.len(), "{records:#?}");
    for r in &records {
        assert_eq!(r["tls"], tls, "{r}");
        assert!(r["http2"]["stream_id"].as_u64().unwrap() % 2 == 1, "{r}");
    }
    let paths: Vec<&str> = records.iter().filter_map(|r| r["path"].as_str()).collect();
    assert_eq!(
        paths
            .iter()
            .filter(|p| **p == "/v1/chat/completions")
            .count(),
        32
    );
    assert_eq!(paths.iter().filter(|p| **p == "/api/generate").count(), 12);
    check(&records, &calls, &server_log(&run.log), false);
    let counters = Counters::beside(&log);
    assert_eq!(counters.get("http2_connections"), 6);
    zero_losses(&counters);
}

#[test]
fn sse_and_json_lines_over_h2c_on_hypercorn() {
    every_stream_is_timed(Server::Hypercorn, false, "h2-sse-hypercorn");
}

#[test]
fn sse_and_json_lines_over_http2_and_tls_on_hypercorn() {
    every_stream_is_timed(Server::Hypercorn, true, "h2-sse-hypercorn-tls");
}

#[test]
fn sse_and_json_lines_over_h2c_on_granian() {
    every_stream_is_timed(Server::Granian, false, "h2-sse-granian");
}

/// Connections opened and used before the agent attached (joined mid-connection, the HPACK
/// tables unknown until the client's encoder says them again): the next round of streams on
/// them is recorded whole, and the connections are said to predate the agent.
#[test]
fn http2_connections_older_than_the_agent_keep_their_token_streams() {
    connections_older_than_the_agent(false, "h2-sse-live");
}

/// The same over TLS: the connections' `SSL*` are tied at their next read, and their plaintext
/// is whole HTTP/2 frames from there.
#[test]
fn http2_over_tls_connections_older_than_the_agent_keep_their_token_streams() {
    connections_older_than_the_agent(true, "h2-sse-live-tls");
}

fn connections_older_than_the_agent(tls: bool, name: &str) {
    let dir = test_dir(name);
    let run = start(Server::Hypercorn, tls, &dir);
    let pid = run.listener_pid();
    let mut child = client(&run, 4, 4, "chat", true);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut before = Vec::new();
    loop {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("client line");
        if line.trim() == "paused" {
            break;
        }
        before.push(serde_json::from_str::<Value>(&line).expect("a request line"));
    }
    assert_eq!(before.len(), 16);
    let mut recorder = Recorder::start(&dir, &["--pid", &pid.to_string()]);
    recorder.wait_attached(pid, Duration::from_secs(30));
    let mut stdin: ChildStdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let mut after = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        if line == "done" {
            break;
        }
        after.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(after.len(), 16);
    recorder.wait_records(Duration::from_secs(30), "the second round's records", |r| {
        r.len() >= 16
    });
    let log = recorder.log.clone();
    let records = recorder.stop();
    assert_eq!(records.len(), 16, "{records:#?}");
    for r in &records {
        assert_eq!(r["connection_preexisting"], true, "{r}");
        assert_eq!(r["tls"], tls, "{r}");
    }
    check(&records, &after, &server_log(&run.log), true);
    let counters = Counters::beside(&log);
    // The four client connections, and the server's own readiness probe if it still holds it.
    assert!((4..=5).contains(&counters.get("connections_preexisting")));
    assert_eq!(counters.get("http2_connections"), 4);
    zero_losses(&counters);
}
