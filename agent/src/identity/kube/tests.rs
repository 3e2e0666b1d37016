//! The watcher against a local HTTP server that answers like the Kubernetes API, from the
//! fixtures in tests/fixtures/kube: list + watch, a watch that expires, an API that is down,
//! slow, answers garbage or refuses the service account.
use std::{
    sync::{Arc, Mutex, atomic::Ordering},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::*;

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/../tests/fixtures/kube/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const VLLM: &str = "3e8b0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbba";
const SGLANG: &str = "bbbb0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddcc111";
const NEW: &str = "cccc0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddcc222";

/// What the server does with the n-th connection.
#[derive(Clone)]
enum Reply {
    /// A complete response.
    Full(u16, String),
    /// 200 with a chunked body sent in pieces, `pause` apart, then the end of the body.
    Stream(Vec<String>, Duration),
    /// Accept, read the request, answer nothing.
    Hang,
    /// 200 and the head of a chunked body, then nothing more (a quiet watch).
    Open,
}

struct Server {
    port: u16,
    paths: Arc<Mutex<Vec<String>>>,
}

async fn serve(script: Vec<Reply>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let paths = Arc::new(Mutex::new(Vec::new()));
    let seen = paths.clone();
    tokio::spawn(async move {
        let mut n = 0;
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            // Past the script: hang, so the watcher waits instead of spinning.
            let reply = script.get(n).cloned().unwrap_or(Reply::Hang);
            n += 1;
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                seen.lock().unwrap().push(path);
                match reply {
                    Reply::Full(status, body) => {
                        let text = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(text.as_bytes()).await;
                    }
                    Reply::Stream(pieces, pause) => {
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        for p in pieces {
                            tokio::time::sleep(pause).await;
                            let chunk = format!("{:x}\r\n{p}\r\n", p.len());
                            let _ = socket.write_all(chunk.as_bytes()).await;
                        }
                        let _ = socket.write_all(b"0\r\n\r\n").await;
                    }
                    Reply::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
                    Reply::Open => {
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                            .await;
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                }
            });
        }
    });
    Server { port, paths }
}

fn config(port: u16) -> KubeConfig {
    KubeConfig {
        tls: false,
        host: "127.0.0.1".into(),
        port,
        token_path: None,
        ca_path: None,
        node_name: "gpu-node-1".into(),
        request_timeout: Duration::from_millis(300),
        watch_seconds: 5,
        backoff: Duration::from_millis(50),
    }
}

/// Runs the watcher until `done` holds for its store (checked every 10 ms; at most 20 s, so a
/// loaded machine only makes the test slower), then stops it and returns the store.
async fn run_until(port: u16, done: impl Fn(&PodStore) -> bool) -> Arc<PodStore> {
    let store = Arc::new(PodStore::default());
    let watcher = tokio::spawn(watch_pods(config(port), store.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(&store) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached: {:?}",
            store.counters
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watcher.abort();
    store
}

fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[tokio::test]
async fn lists_then_follows_the_watch_and_resumes_from_the_last_version() {
    let events: Vec<String> = fixture("watch.jsonl")
        .lines()
        .map(|l| format!("{l}\n"))
        .collect();
    // Split one event across two chunks, as a real stream may.
    let mut pieces = vec![events[0][..40].to_string(), events[0][40..].to_string()];
    pieces.extend(events[1..].iter().cloned());
    let server = serve(vec![
        Reply::Full(200, fixture("pods-list.json")),
        Reply::Stream(pieces, Duration::from_millis(20)),
        Reply::Open,
    ])
    .await;
    let paths = server.paths.clone();
    let store = run_until(server.port, |s| {
        count(&s.counters.watch_events) == 4 && paths.lock().unwrap().len() >= 3
    })
    .await;

    assert!(store.synced());
    let vllm = store.find(VLLM, None).expect("the listed vLLM pod");
    assert_eq!(vllm.name, "vllm-7d9f8c6b5-x2k4p");
    assert_eq!(vllm.deployment.as_deref(), Some("vllm"));
    // Added Pending, then MODIFIED with its container id.
    let new = store.find(NEW, None).expect("the pod the watch added");
    assert_eq!(new.name, "vllm-7d9f8c6b5-q8m2z");
    assert_eq!(new.container_name(NEW), Some("engine"));
    // DELETED removes it, by uid.
    assert!(store.find(SGLANG, None).is_none());
    assert_eq!(store.len(), 2);
    assert_eq!(count(&store.counters.watch_events), 4);
    assert_eq!(count(&store.counters.garbage), 0);
    assert_eq!(count(&store.counters.api_errors), 0);

    let paths = server.paths.lock().unwrap().clone();
    assert!(
        paths[0].starts_with("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1"),
        "{paths:?}"
    );
    assert!(!paths[0].contains("watch"), "{paths:?}");
    assert!(paths[1].contains("watch=1"), "{paths:?}");
    assert!(paths[1].contains("resourceVersion=48213"), "{paths:?}");
    // The server ended the watch: it resumes from the bookmark's version, without a re-list.
    assert!(paths[2].contains("resourceVersion=48250"), "{paths:?}");
    assert_eq!(count(&store.counters.lists), 1);
}

#[tokio::test]
async fn an_expired_watch_relists() {
    let server = serve(vec![
        Reply::Full(200, fixture("pods-list.json")),
        Reply::Stream(vec![fixture("watch-expired.jsonl")], Duration::ZERO),
        Reply::Full(200, fixture("pods-list.json")),
    ])
    .await;
    let store = run_until(server.port, |s| count(&s.counters.lists) == 2).await;
    assert_eq!(count(&store.counters.watch_expired), 1);
    assert_eq!(count(&store.counters.lists), 2);
    assert!(store.find(SGLANG, None).is_some());
}

#[tokio::test]
async fn an_api_that_is_down_is_counted_and_retried() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let store = run_until(port, |s| count(&s.counters.api_errors) >= 3).await;
    assert!(!store.synced());
    assert!(store.find(VLLM, None).is_none());
}

#[tokio::test]
async fn a_slow_api_times_out_then_a_later_answer_is_used() {
    let server = serve(vec![
        Reply::Hang,
        Reply::Full(200, fixture("pods-list.json")),
    ])
    .await;
    let store = run_until(server.port, PodStore::synced).await;
    assert!(count(&store.counters.api_errors) >= 1);
    assert!(store.synced());
    assert!(store.find(VLLM, None).is_some());
}

#[tokio::test]
async fn garbage_and_refusals_are_counted_and_never_fill_the_cache() {
    let server = serve(vec![
        Reply::Full(200, "<html>proxy error</html>".into()),
        Reply::Full(200, r#"{"kind":"PodList","items":"no"}"#.into()),
        Reply::Full(
            403,
            r#"{"kind":"Status","code":403,"reason":"Forbidden"}"#.into(),
        ),
        Reply::Full(200, fixture("pods-list.json")),
        Reply::Stream(
            vec![
                "{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}\n".into(),
                "{\"type\":\"WHAT\",\"object\":{}}\n".into(),
                "not json at all\n".into(),
            ],
            Duration::ZERO,
        ),
    ])
    .await;
    let store = run_until(server.port, |s| count(&s.counters.garbage) >= 5).await;
    // Two bad lists, the pod without a uid, the unknown event type, the bad line.
    assert!(count(&store.counters.garbage) >= 5, "{:?}", store.counters);
    assert!(
        count(&store.counters.api_errors) >= 1,
        "{:?}",
        store.counters
    );
    // The good list before the bad watch still serves lookups.
    assert!(store.find(VLLM, None).is_some());
}

#[test]
fn urls_and_selectors() {
    assert_eq!(
        parse_url("http://127.0.0.1:8001"),
        Some((false, "127.0.0.1".into(), 8001))
    );
    assert_eq!(
        parse_url("https://[fd00::1]:6443/"),
        Some((true, "fd00::1".into(), 6443))
    );
    assert_eq!(
        parse_url("https://api.example.com"),
        Some((true, "api.example.com".into(), 443))
    );
    assert_eq!(parse_url("ftp://x"), None);
    assert_eq!(percent_encode("node-1.eu_w"), "node-1.eu_w");
    assert_eq!(percent_encode("a b&c"), "a%20b%26c");
}

fn openssl(args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .expect("running openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// The in-cluster path: TLS verified against the service account's CA, the token as a bearer
/// header (re-read per request), against a TLS server with a certificate made for the test.
#[tokio::test]
async fn in_cluster_tls_and_token() {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    // A cluster CA and an API server certificate it signed, for the service's IP.
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509", "-days", "1", "-subj", "/CN=kubernetes-ca"][..],
            &ec,
            &["-keyout", &d("ca.key"), "-out", &d("ca.crt")],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-subj", "/CN=kube-apiserver"][..],
            &ec,
            &["-keyout", &d("key.pem"), "-out", &d("srv.csr")],
        ]
        .concat(),
    );
    std::fs::write(d("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-days",
        "1",
        "-in",
        &d("srv.csr"),
        "-CA",
        &d("ca.crt"),
        "-CAkey",
        &d("ca.key"),
        "-CAcreateserial",
        "-extfile",
        &d("san.ext"),
        "-out",
        &d("srv.crt"),
    ]);
    let (cert, key, ca) = (
        dir.path().join("srv.crt"),
        dir.path().join("key.pem"),
        dir.path().join("ca.crt"),
    );
    let token = dir.path().join("token");
    std::fs::write(&token, "eyJhbGciOi.test-token\n").unwrap();

    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    let list = fixture("pods-list.json");
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let Ok(mut tls) = acceptor.accept(socket).await else {
                continue;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if tls.read(&mut byte).await.unwrap_or(0) == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_string();
            let is_watch = head.contains("watch=1");
            seen.lock().unwrap().push(head);
            if is_watch {
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            } else {
                let text = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{list}",
                    list.len()
                );
                let _ = tls.write_all(text.as_bytes()).await;
                let _ = tls.flush().await;
            }
        }
    });

    let store = Arc::new(PodStore::default());
    let config = KubeConfig {
        tls: true,
        token_path: Some(token),
        ca_path: Some(ca),
        ..config(port)
    };
    let watcher = tokio::spawn(watch_pods(config, store.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while heads.lock().unwrap().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            store.counters
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watcher.abort();
    assert!(store.find(VLLM, None).is_some());
    assert_eq!(count(&store.counters.api_errors), 0);
    for head in heads.lock().unwrap().iter() {
        assert!(
            head.to_ascii_lowercase()
                .contains("authorization: bearer eyjhbgcioi.test-token\r\n"),
            "{head}"
        );
    }
}

#[tokio::test]
async fn a_server_the_ca_does_not_vouch_for_is_refused() {
    // The CA file names no server this one presents: the handshake fails, counted.
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=other"])
        .arg("-keyout")
        .arg(dir.path().join("key.pem"))
        .arg("-out")
        .arg(&ca)
        .output()
        .expect("running openssl");
    assert!(out.status.success());
    // A plain-HTTP server where TLS is expected answers garbage to the handshake.
    let server = serve(vec![Reply::Full(200, fixture("pods-list.json"))]).await;
    let store = Arc::new(PodStore::default());
    let config = KubeConfig {
        tls: true,
        ca_path: Some(ca),
        ..config(server.port)
    };
    let watcher = tokio::spawn(watch_pods(config, store.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while count(&store.counters.api_errors) == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watcher.abort();
    assert!(!store.synced());
}
