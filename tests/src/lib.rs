//! Helpers for the integration tests: the real engine, the real agent binary, a streaming
//! client that keeps its own view of each response, and a pcap reader for the wire reference.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod client;
pub mod daemon;
pub mod engine;
pub mod grpc_engine;
pub mod kserve;
pub mod mock_cuda;
pub mod native_engine;
pub mod otlp;
pub mod pcap;
pub mod prometheus;
pub mod split;
pub mod vllm;
pub mod vllm_load;

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::Duration,
};

/// A fresh directory for one test's files: unique among the tests of this process (they run
/// two at a time) and across runs. Left in place when a test fails, for its logs.
pub fn test_dir(name: &str) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("inferscope-it-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the test's temp dir");
    dir
}

/// Polls `done` until it holds; panics saying what never happened once `timeout` has passed.
/// For a test that waits on something it can see (a log line, a record, a port), not a sleep.
pub fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited {timeout:?} for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The machine to this test alone, among the tests of its binary that ask (they run two at a
/// time): for tests whose assertions compare latencies between two windows, which another test's
/// engine on the same cores would skew. Every test of such a binary that runs an engine asks.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static MACHINE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it must not fail the others.
    MACHINE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A TCP port free right now on 127.0.0.1, below the kernel's ephemeral range: an engine that
/// takes seconds to bind the port it was given (SGLang: ~20 s on two cores) must not find it
/// taken by some process's outgoing connection in the meantime, which an ephemeral port (what
/// binding port 0 hands out) can be.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_low.max(10_001));
    let span = high - low;
    // Spread over the range by process (two test binaries never run at once, but their
    // leftover listeners may) and by call.
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = low + seed.wrapping_add(n.wrapping_mul(7_919)) % span;
        if let Ok(port) = u16::try_from(port)
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding a port on 127.0.0.1")
}

/// A plain HTTP/1.1 GET on 127.0.0.1, returning the body ("" on any failure).
pub fn http_get(port: u16, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return String::new();
    };
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return dechunk(body);
    }
    body.to_string()
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// A self-signed certificate and key for 127.0.0.1 in `dir` (Debian's `openssl`), for the HTTPS
/// and HTTP/2-over-TLS test servers.
pub fn self_signed_certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::process::{Command, Stdio};
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("running openssl (Debian's openssl package)");
    assert!(status.success(), "openssl req failed");
    (cert, key)
}
