//! `inferscope run` end to end: the real agent with real eBPF on the real engine, exporting to a
//! real OTLP receiver (rotel), scraped by a real Prometheus, and read by its own CLI clients.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use inferscope_integration_tests::{
    client::Client, daemon::Daemon, engine::Engine, free_port, otlp::Rotel, prometheus::Prometheus,
};
use serde_json::Value;

const REQUESTS: usize = 4;

fn trace_id(i: usize) -> String {
    format!("4bf92f3577b34da6a3ce929d0e0e{:04x}", 0x4700 + i)
}

fn parent_span_id(i: usize) -> String {
    format!("00f067aa0ba90{:03x}", 0x200 + i)
}

#[test]
fn traces_metrics_and_api_on_the_real_engine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = Engine::start(free_port(), 2);
    let rotel = Rotel::start(dir.path(), free_port());
    let endpoint = format!("http://127.0.0.1:{}", rotel.port);
    let mut daemon = Daemon::start(
        dir.path(),
        &[
            "--port",
            &engine.port.to_string(),
            "--otlp-endpoint",
            &endpoint,
            "--engine-metrics-interval",
            "1s",
        ],
    );
    daemon.wait_attached(engine.pid(), Duration::from_secs(60));
    let prometheus = Prometheus::start(dir.path(), daemon.prometheus_port);

    // More concurrent streams than the engine's 2 slots, so some requests queue.
    let port = engine.port;
    let clients: Vec<_> = (0..REQUESTS)
        .map(|i| {
            thread::spawn(move || {
                let mut c = Client::connect(port);
                c.set_header(
                    "traceparent",
                    &format!("00-{}-{}-01", trace_id(i), parent_span_id(i)),
                );
                c.set_header("x-request-id", &format!("daemon-test-{i}"));
                c.chat(
                    &format!("Name {} animals that live in the sea.", i + 3),
                    12,
                    None,
                )
            })
        })
        .collect();
    for c in clients {
        assert!(c.join().expect("client thread").completed);
    }

    // Traces: one SERVER span per request, in the caller's trace, with the phase children.
    let spans = rotel.wait_for(Duration::from_secs(30), |spans| {
        spans
            .iter()
            .filter(|s| s.kind == "SPAN_KIND_SERVER")
            .count()
            >= REQUESTS
    });
    for i in 0..REQUESTS {
        let server = spans
            .iter()
            .find(|s| s.kind == "SPAN_KIND_SERVER" && s.trace_id == trace_id(i))
            .unwrap_or_else(|| panic!("no server span in trace {} among {spans:#?}", trace_id(i)));
        assert_eq!(
            server.parent_id,
            parent_span_id(i),
            "child of the caller's span"
        );
        assert_eq!(server.name, "chat smollm2");
        assert_eq!(server.attributes["gen_ai.operation.name"], "chat");
        assert_eq!(server.attributes["gen_ai.request.model"], "smollm2");
        assert_eq!(
            server.attributes["inferscope.x_request_id"],
            format!("daemon-test-{i}")
        );
        assert!(server.attributes["gen_ai.response.id"].starts_with("chatcmpl-"));
        for key in [
            "inferscope.ttft_ms",
            "inferscope.queue_wait_ms",
            "inferscope.prefill_ms",
        ] {
            let v: f64 = server.attributes[key].parse().expect(key);
            assert!(v >= 0.0, "{key} = {v}");
        }
        assert_eq!(server.resource["service.name"], "llamacpp");
        assert_eq!(server.resource["process.pid"], engine.pid().to_string());
        let children: BTreeMap<&str, _> = spans
            .iter()
            .filter(|s| s.parent_id == server.id)
            .map(|s| (s.name.as_str(), s))
            .collect();
        for phase in ["queue", "prefill", "decode"] {
            let child = children
                .get(phase)
                .unwrap_or_else(|| panic!("no {phase} child of request {i}: {children:#?}"));
            assert_eq!(child.trace_id, trace_id(i));
        }
        assert!(
            children["prefill"].events >= 1,
            "prefill steps as span events: {children:#?} {server:#?}"
        );
        assert!(
            children["decode"].events >= 1,
            "decode steps as span events"
        );
        // No prompt or completion text reaches the backend.
        let all = format!("{server:?}{children:?}");
        assert!(!all.contains("animals"), "prompt text leaked: {all}");
    }

    // Prometheus scrapes the histograms.
    let count = prometheus.query_value(
        "sum(gen_ai_server_time_to_first_token_seconds_count)",
        Duration::from_secs(30),
    );
    assert_eq!(
        count,
        Some(REQUESTS as f64),
        "target health {}",
        prometheus.target_health()
    );
    let queue = prometheus.query_value(
        "sum(inferscope_queue_wait_seconds_count)",
        Duration::from_secs(5),
    );
    assert_eq!(queue, Some(REQUESTS as f64));
    let exposition = daemon.scrape();
    for name in [
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "gen_ai_server_request_duration_seconds_bucket",
        "inferscope_prefill_seconds_bucket",
        "inferscope_engine_step_duration_seconds_bucket",
        "inferscope_requests_admitted_total",
        "inferscope_agent_events_total",
        // Scraped from the engine's own /metrics.
        "inferscope_engine_requests_running{",
    ] {
        assert!(exposition.contains(name), "{name} missing from /metrics");
    }
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    use std::io::Write as _;
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("feeding promtool");
    let checked = promtool.wait_with_output().expect("promtool");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // The CLI clients on live data.
    let top = daemon.client(&["top", "--iterations", "1", "--interval", "1s"]);
    let top_text = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "top: {}",
        String::from_utf8_lossy(&top.stderr)
    );
    // Subscribing starts from now: top shows the live stream, so it may list 0 requests here;
    // its table must still render.
    assert!(
        top_text.contains("TTFT") && top_text.contains("queue wait"),
        "{top_text}"
    );

    let inspect = daemon.client(&["inspect", "daemon-test-3"]);
    let inspect_text = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        inspect.status.success(),
        "inspect: {}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    for want in [
        "x-request-id daemon-test-3",
        "queue ",
        "prefill ",
        "decode ",
        "steps (",
    ] {
        assert!(
            inspect_text.contains(want),
            "{want:?} missing from:\n{inspect_text}"
        );
    }
    let missing = daemon.client(&["inspect", "no-such-request"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no recent request"));

    let trace_file = dir.path().join("trace.json");
    let export = daemon.client(&["export", "--perfetto", trace_file.to_str().expect("utf-8")]);
    assert!(
        export.status.success(),
        "export: {}",
        String::from_utf8_lossy(&export.stderr)
    );
    let trace: Value =
        serde_json::from_slice(&std::fs::read(&trace_file).expect("trace file")).expect("JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let requests = events.iter().filter(|e| e["cat"] == "request").count();
    assert_eq!(requests, REQUESTS);
    for phase in ["queue", "prefill", "decode"] {
        let n = events.iter().filter(|e| e["name"] == phase).count();
        assert_eq!(n, REQUESTS, "{phase} tracks");
    }
    assert!(events.iter().any(|e| e["cat"] == "step"));

    let log = daemon.stop();
    assert!(!log.contains("panicked"), "{log}");
}

/// A live subscriber sees requests as they finish (what `top` shows).
#[test]
fn top_follows_live_requests() {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = Engine::start(free_port(), 2);
    let mut daemon = Daemon::start(dir.path(), &["--port", &engine.port.to_string()]);
    daemon.wait_attached(engine.pid(), Duration::from_secs(60));
    let connect = format!("unix://{}", daemon.socket.display());
    let top = Command::new(inferscope_integration_tests::agent::binary())
        .args([
            "top",
            "--iterations",
            "1",
            "--interval",
            "20s",
            "--connect",
            &connect,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("top");
    // The requests go once `top` has subscribed: the agent counts its gRPC subscribers (a gauge
    // it exports about once a second).
    let deadline = Instant::now() + Duration::from_secs(30);
    while gauge(&daemon.scrape(), "grpc_subscribers") == 0 {
        assert!(
            Instant::now() < deadline,
            "top did not subscribe within 30 s:\n{}",
            daemon.log_text()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let port = engine.port;
    let clients: Vec<_> = (0..3)
        .map(|i| {
            thread::spawn(move || {
                let mut c = Client::connect(port);
                c.set_header("x-request-id", &format!("top-{i}"));
                c.chat(&format!("Give {} reasons to sleep.", i + 2), 8, None)
            })
        })
        .collect();
    for c in clients {
        assert!(c.join().expect("client").completed);
    }
    let out = top.wait_with_output().expect("top output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("3 requests in the last"), "{text}");
    let ttft_row = text
        .lines()
        .find(|l| l.starts_with("TTFT"))
        .expect("TTFT row");
    assert!(ttft_row.trim_end().ends_with('3'), "{ttft_row}");
    for i in 0..3 {
        assert!(text.contains(&format!("top-{i}")), "{text}");
    }
    daemon.stop();
}

/// The OTLP backend goes away for 30 s under load: the agent's memory stays flat (bounded span
/// queue, drops counted) and export resumes when the backend returns.
#[test]
fn otlp_outage_keeps_memory_flat_and_recovers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sse_port = free_port();
    let sse_load = env!("CARGO_BIN_EXE_sse_load");
    let mut server = Command::new(sse_load)
        .args([
            "serve",
            "--port",
            &sse_port.to_string(),
            "--tokens",
            "8",
            "--hold-ms",
            "5",
        ])
        .spawn()
        .expect("sse_load serve");
    inferscope_integration_tests::wait_until(Duration::from_secs(10), "sse_load listening", || {
        std::net::TcpStream::connect(("127.0.0.1", sse_port)).is_ok()
    });
    let otlp_port = free_port();
    let rotel = Rotel::start(dir.path(), otlp_port);
    let mut daemon = Daemon::start(
        dir.path(),
        &[
            "--port",
            &sse_port.to_string(),
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{otlp_port}"),
            "--otlp-timeout",
            "2s",
            "--otlp-queue-spans",
            "512",
        ],
    );
    daemon.wait_attached(server.id(), Duration::from_secs(30));
    let mut load = Command::new(sse_load)
        .args([
            "load",
            "--port",
            &sse_port.to_string(),
            "--connections",
            "2",
            "--requests",
            "100000000",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("sse_load load");

    let spans = rotel.wait_for(Duration::from_secs(30), |s| s.len() >= 30);
    assert!(spans.len() >= 30, "spans flow before the outage");
    // Load shaping: 5 s of steady export before the memory baseline.
    thread::sleep(Duration::from_secs(5));
    let before = daemon.rss_kib();
    rotel.kill();
    let outage = Instant::now();
    let mut peak = before;
    while outage.elapsed() < Duration::from_secs(30) {
        // Samples the memory once a second through the 30 s outage.
        thread::sleep(Duration::from_secs(1));
        peak = peak.max(daemon.rss_kib());
    }
    let metrics = daemon.scrape();
    let lost =
        counter(&metrics, "otlp_spans_failed") + gauge(&metrics, "otlp_spans_pending_or_dropped");
    assert!(
        lost > 0,
        "the outage shows in the agent's counters:\n{metrics}"
    );

    let rotel = Rotel::start(dir.path(), otlp_port);
    let after = rotel.wait_for(Duration::from_secs(60), |s| s.len() >= 30);
    let _ = load.kill();
    let _ = load.wait();
    assert!(
        after.len() >= 30,
        "export resumed after the backend returned: {} spans",
        after.len()
    );
    assert!(
        peak <= before + 24 * 1024,
        "RSS grew from {before} KiB to {peak} KiB during the outage"
    );
    eprintln!("RSS before the outage {before} KiB, peak during it {peak} KiB; spans lost {lost}");
    daemon.stop();
    let _ = server.kill();
    let _ = server.wait();
}

fn counter(exposition: &str, name: &str) -> u64 {
    let needle = format!("inferscope_agent_events_total{{counter=\"{name}\"}} ");
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn gauge(exposition: &str, name: &str) -> u64 {
    let needle = format!("inferscope_agent_state{{name=\"{name}\"}} ");
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Kernel records from a CUPTI shim (in a mock CUDA engine) reach `inferscope run`.
#[test]
fn shim_kernels_reach_the_daemon() {
    let dir = tempfile::tempdir().expect("temp dir");
    let shim_socket = dir.path().join("shim.sock");
    let daemon = Daemon::start(
        dir.path(),
        &[
            "--pattern",
            "no-engine-matches-this",
            "--shim-socket",
            shim_socket.to_str().expect("utf-8"),
            "--nvml-interval",
            "off",
        ],
    );
    wait_for_shim_socket(&daemon, &shim_socket);
    mock_engine_kernels_reach(&daemon, &shim_socket, "");
    assert_eq!(counter(&daemon.scrape(), "shim_queue_drops"), 0);
    daemon.stop();
}

/// The gRPC API over TCP with TLS: a client that trusts the agent's CA connects, one that does
/// not is refused.
#[test]
fn grpc_api_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        d.join("leaf.ext"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("leaf.ext");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "1",
                "-subj",
                "/CN=inferscope-test-ca",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "key.pem",
                "-out",
                "leaf.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    );
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
    ]);

    let port = free_port();
    let grpc = format!("tcp://127.0.0.1:{port}");
    let cert = d.join("cert.pem");
    let key = d.join("key.pem");
    let daemon = Daemon::start(
        d,
        &[
            "--pattern",
            "no-engine-matches-this",
            "--grpc",
            &grpc,
            "--grpc-tls-cert",
            cert.to_str().expect("utf-8"),
            "--grpc-tls-key",
            key.to_str().expect("utf-8"),
            "--shim-socket",
            "off",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log_text().contains("serving the gRPC API") {
        assert!(
            Instant::now() < deadline,
            "no gRPC listener:\n{}",
            daemon.log_text()
        );
        thread::sleep(Duration::from_millis(100));
    }
    let url = format!("https://127.0.0.1:{port}");
    let top = |extra: &[&str]| {
        Command::new(inferscope_integration_tests::agent::binary())
            .args([
                "top",
                "--iterations",
                "1",
                "--interval",
                "1s",
                "--connect",
                &url,
            ])
            .args(extra)
            .output()
            .expect("top")
    };
    let ca = d.join("ca.pem");
    let trusted = top(&["--tls-ca", ca.to_str().expect("utf-8")]);
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    assert!(String::from_utf8_lossy(&trusted.stdout).contains("inferscope top"));
    let untrusted = top(&[]);
    assert!(!untrusted.status.success());
    assert!(String::from_utf8_lossy(&untrusted.stderr).contains("UnknownIssuer"));
    daemon.stop();
}

/// Hostile shim clients against a real `inferscope run`: peers that announce 4 MiB messages and
/// send a megabyte of each, peers that send a length that is no varint, and peers that connect
/// and say nothing. The partial messages stay within the global budget (connections past it are
/// closed and counted, RSS stays bounded), bad frames close their connection and are counted,
/// and a real shim beside them still gets every kernel through.
#[test]
fn hostile_shim_clients_are_bounded_and_a_real_shim_gets_through() {
    use std::{io::Write, os::unix::net::UnixStream};
    let dir = tempfile::tempdir().expect("temp dir");
    let shim_socket = dir.path().join("shim.sock");
    let daemon = Daemon::start(
        dir.path(),
        &[
            "--pattern",
            "no-engine-matches-this",
            "--shim-socket",
            shim_socket.to_str().expect("utf-8"),
            "--nvml-interval",
            "off",
        ],
    );
    wait_for_shim_socket(&daemon, &shim_socket);
    let before = daemon.rss_kib();

    let connect = || {
        let s = UnixStream::connect(&shim_socket).expect("connecting to the shim socket");
        s.set_write_timeout(Some(Duration::from_secs(2)))
            .expect("write timeout");
        s
    };
    // 40 greedy peers: a length prefix of 4 MiB - 1 (the largest message allowed), then 1 MiB
    // of it, never the rest. 40 MiB attempted against the 16 MiB budget.
    let greedy_peers = 40;
    let mut greedy = Vec::new();
    for _ in 0..greedy_peers {
        let mut s = connect();
        let _ = s.write_all(&[0xff, 0xff, 0xff, 0x01]);
        let chunk = vec![0u8; 64 * 1024];
        for _ in 0..16 {
            // A peer the agent closed gets EPIPE: that is the point.
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        greedy.push(s);
    }
    // 8 peers whose length prefix is no varint (ten continuation bytes).
    let mut garbage = Vec::new();
    for _ in 0..8 {
        let mut s = connect();
        let _ = s.write_all(&[0xff; 12]);
        garbage.push(s);
    }
    // 100 peers that connect and say nothing (closed only after the idle timeout).
    let silent: Vec<_> = (0..100).map(|_| connect()).collect();

    let deadline = Instant::now() + Duration::from_secs(20);
    let (over_budget, bad_frames, buffered) = loop {
        let text = daemon.scrape();
        let over = counter(&text, "shim_connections_over_budget");
        let bad = counter(&text, "shim_bad_frames");
        if (over >= (greedy_peers - 16) as u64 && bad >= 8) || Instant::now() >= deadline {
            break (over, bad, gauge(&text, "shim_buffered_bytes"));
        }
        thread::sleep(Duration::from_millis(200));
    };
    let during = daemon.rss_kib();
    eprintln!(
        "hostile shims: {over_budget} closed over budget, {bad_frames} bad frames, {buffered} bytes buffered; RSS {before} -> {during} KiB"
    );
    // 16 MiB budget: at most 16 of the 40 greedy peers' megabytes are held.
    assert!(
        over_budget >= (greedy_peers - 16) as u64,
        "greedy peers past the budget are closed: {over_budget}\n{}",
        daemon.log_text()
    );
    assert_eq!(
        bad_frames, 8,
        "every bad length prefix closes its connection"
    );
    assert!(buffered <= 16 << 20, "buffered {buffered} bytes");
    // The budget (16 MiB), each reader's 64 KiB buffer and thread, and the decoders' slack.
    assert!(
        during <= before + 64 * 1024,
        "RSS grew from {before} KiB to {during} KiB under hostile shims"
    );

    // A real shim (the mock CUDA engine with the real CUPTI shim) beside them.
    mock_engine_kernels_reach(&daemon, &shim_socket, "beside hostile shims");
    assert_eq!(counter(&daemon.scrape(), "shim_parse_failures"), 0);
    drop((greedy, garbage, silent));
    daemon.stop();
}

/// Waits for the daemon's shim socket to exist.
fn wait_for_shim_socket(daemon: &Daemon, shim_socket: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !shim_socket.exists() {
        assert!(
            Instant::now() < deadline,
            "no shim socket:\n{}",
            daemon.log_text()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the mock CUDA engine with the real CUPTI shim (50 launches of 4 kernels, 20 graph
/// launches of 3) and waits until every one of its kernels is counted by the daemon.
fn mock_engine_kernels_reach(daemon: &Daemon, shim_socket: &std::path::Path, context: &str) {
    let out =
        inferscope_integration_tests::mock_cuda::run_engine(&["run", "50", "20"], shim_socket, &[]);
    assert!(
        out.status.success(),
        "mock engine: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = 50 * 4 + 20 * 3;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let received = counter(&daemon.scrape(), "shim_kernels_received");
        if received == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{received} of {expected} kernels reached the daemon {context}:\n{}",
            daemon.log_text()
        );
        thread::sleep(Duration::from_millis(250));
    }
}
