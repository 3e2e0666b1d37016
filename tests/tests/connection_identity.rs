//! Connections known from accept to close, in the kernel: with real eBPF against real servers
//! whose fd numbers are reused (files read before accept and after close, late accepts, servers
//! that close first), every request on the wire has exactly one record, TTFT within 1 ms of the
//! wire, nothing recorded for non-connection fds, and `ended_by` right. Then the same on the
//! real llama.cpp engine: a burst of fresh connections, and 300 short sequential requests.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use inferscope_integration_tests::{
    agent::{self, Recorder},
    client::Client,
    engine::{self, Engine},
    free_port, pcap,
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

fn tempdir(name: &str) -> PathBuf {
    inferscope_integration_tests::test_dir(name)
}

fn tcpdump(pcap_path: &Path, port: u16) -> KillOnDrop {
    let child = Command::new("tcpdump")
        .args([
            "-i",
            "lo",
            "-s",
            "0",
            "-U",
            // Packets go to the file as they come, not when a kernel block fills or times out
            // (1 s): otherwise the last requests can still be in the kernel at the stop.
            "--immediate-mode",
            // 64 MiB: the kernel drops packets it cannot queue for a tcpdump that the
            // engine, the clients and the agent keep off two cores.
            "-B",
            "65536",
            "--time-stamp-precision=nano",
            "-w",
        ])
        .arg(pcap_path)
        .args(["tcp", "port", &port.to_string()])
        .stdout(Stdio::null())
        // Its closing lines say how many packets the kernel dropped (read by `wire_note`).
        .stderr(
            std::fs::File::create(pcap_path.with_extension("log"))
                .map_or_else(|_| Stdio::null(), Stdio::from),
        )
        .spawn()
        .expect("starting tcpdump (apt-get install tcpdump)");
    // tcpdump writes the file header once its capture is live: wait for it, so the test's
    // first packets are not sent before the capture sees them.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(pcap_path).map_or(true, |m| m.len() < 24) {
        assert!(
            std::time::Instant::now() < deadline,
            "tcpdump did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // tcpdump writes the file's header once its filter is set: from here packets are seen.
    KillOnDrop(child)
}

/// Requests on the wire: client packets that open with a request line.
/// Requests sent to `port` on the wire: their first segments, retransmissions not counted (a
/// full run once saw 308 GET segments for 300 requests).
fn wire_requests(packets: &[pcap::Packet], port: u16, method: &[u8]) -> usize {
    packets
        .iter()
        .zip(pcap::retransmitted(packets))
        .filter(|(p, again)| !again && p.dst_port == port && p.payload.starts_with(method))
        .count()
}

/// What tcpdump said at its stop and the request segments counting retransmissions, for a
/// wire reference that falls short.
fn wire_note(packets: &[pcap::Packet], pcap_path: &Path, port: u16) -> String {
    let all = packets
        .iter()
        .filter(|p| {
            p.dst_port == port
                && (p.payload.starts_with(b"GET ") || p.payload.starts_with(b"POST "))
        })
        .count();
    let said = std::fs::read_to_string(pcap_path.with_extension("log")).unwrap_or_default();
    format!("{all} request segments with retransmissions; tcpdump: {said}")
}

/// tcpdump writes each packet as it reads it (-U, immediate mode), but on a busy machine it
/// reads late, and SIGINT ends it without reading what is still queued: stop it once the file
/// holds the `want` request segments the clients sent to `port` (each answered, so on the wire)
/// and has stopped growing, or after 30 s.
fn stop_tcpdump(mut dump: KillOnDrop, pcap_path: &Path, port: u16, want: usize) {
    // A file that had not grown for 1.2 s still lacked requests once: on two loaded cores
    // tcpdump was starved longer (297, and once 292, of 300 requests in the file).
    let size = || std::fs::metadata(pcap_path).map_or(0, |m| m.len());
    let requests = || {
        let packets = pcap::read(pcap_path);
        wire_requests(&packets, port, b"POST ") + wire_requests(&packets, port, b"GET ")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut last, mut unchanged) = (size(), 0);
    while (unchanged < 3 || requests() < want) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(400));
        let now = size();
        unchanged = if now == last { unchanged + 1 } else { 0 };
        last = now;
    }
    let _ = Command::new("kill")
        .args(["-INT", &dump.0.id().to_string()])
        .status();
    let _ = dump.0.wait();
}

/// One request on a fresh connection, read until the server closes it.
fn post_and_read_to_close(port: u16, n: usize) -> Vec<u8> {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the server");
    post_and_read_to_close_on(s, n)
}

/// A client socket that speaks MPTCP (IPPROTO_MPTCP), connected to 127.0.0.1:`port`.
fn mptcp_connect(port: u16) -> TcpStream {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket(2)/connect(2) calls on a fresh fd this function owns; the address
    // is a valid sockaddr_in for the length passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_MPTCP);
        assert!(
            fd >= 0,
            "an MPTCP socket: {}",
            std::io::Error::last_os_error()
        );
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
            },
            sin_zero: [0; 8],
        };
        let connected = libc::connect(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(
            connected,
            0,
            "connecting: {}",
            std::io::Error::last_os_error()
        );
        TcpStream::from_raw_fd(fd)
    }
}

fn post_and_read_to_close_on(mut s: TcpStream, n: usize) -> Vec<u8> {
    s.set_nodelay(true).expect("TCP_NODELAY");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let body =
        format!(r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":"q{n}"}}]}}"#);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes())
        .expect("sending the request");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    raw
}

fn ms(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

#[test]
fn fd_reuse_late_accept_and_server_close_match_the_wire() {
    fd_reuse_late_accept_and_server_close(
        "fd-reuse",
        &[],
        &[],
        &DEFAULT_MECHANISMS,
        false,
        ClientSocket::Tcp,
    );
}

/// The same with entry programs saving every read's and write's arguments (and a write's time),
/// as on a kernel without `bpf_task_pt_regs` (before 5.15).
#[test]
fn fd_reuse_late_accept_and_server_close_match_the_wire_with_arguments_from_the_entry() {
    fd_reuse_late_accept_and_server_close(
        "fd-reuse-entry",
        &[],
        &[
            ("INFERSCOPE_READ_ARGS", "entry"),
            ("INFERSCOPE_WRITE_ARGS", "entry"),
        ],
        &[
            "an accepted connection's TCP socket is found from its fd at the accept",
            "reads take their arguments at their entry (INFERSCOPE_READ_ARGS=entry)",
            "writes take their arguments and time at their entry (INFERSCOPE_WRITE_ARGS=entry)",
        ],
        false,
        ClientSocket::Tcp,
    );
}

/// The same with the saved registers and the transmit stamp read with helper calls, as on a
/// kernel without `bpf_rdonly_cast` (before 6.2), where the exits cannot load them through
/// typed pointers.
#[test]
fn fd_reuse_late_accept_and_server_close_match_the_wire_with_helper_reads() {
    fd_reuse_late_accept_and_server_close(
        "fd-reuse-helpers",
        &[],
        &[("INFERSCOPE_KFUNCS", "off")],
        &[
            "an accepted connection's TCP socket is found from its fd at the accept",
            "reads take their arguments at their exit, from the thread's saved registers (read with helper calls: INFERSCOPE_KFUNCS=off)",
            "and their time from their socket's transmit stamp (read with helper calls: INFERSCOPE_KFUNCS=off)",
        ],
        false,
        ClientSocket::Tcp,
    );
}

/// The same with the socket learnt at each connection's first read (tcp_rcv_space_adjust), as
/// on a kernel with neither fexit nor BTF.
#[test]
fn fd_reuse_late_accept_and_server_close_match_the_wire_with_the_socket_from_the_first_read() {
    fd_reuse_late_accept_and_server_close(
        "fd-reuse-first-read",
        &[],
        &[("INFERSCOPE_ACCEPT_SOCKET", "first-read")],
        &[
            "is learnt at its first read (tcp:tcp_rcv_space_adjust)",
            "reads take their arguments at their entry",
            "writes take their arguments at their exit",
        ],
        true,
        ClientSocket::Tcp,
    );
}

/// The same behind a listener that speaks MPTCP (Go 1.24's default where the kernel allows it):
/// the agent finds it by its port, and a plain TCP client's connections are plain TCP.
#[test]
fn fd_reuse_late_accept_and_server_close_match_the_wire_behind_an_mptcp_listener() {
    fd_reuse_late_accept_and_server_close(
        "fd-reuse-mptcp",
        &["mptcp"],
        &[],
        &DEFAULT_MECHANISMS,
        false,
        ClientSocket::Tcp,
    );
}

/// The same with a client that speaks MPTCP too (`IPPROTO_MPTCP`): the accepted fd then holds
/// an `mptcp_sock`, whose bytes travel on TCP subflows. The kernel programs join its arrivals and
/// stamp its writes by its first subflow; the `mptcp_sock` itself, taken for a TCP socket,
/// would lose every wire arrival and give writes its unrelated memory for a transmit stamp (a
/// mismatch stamps the write at its return, counted; a chance match, a wrong time).
#[test]
fn fd_reuse_late_accept_and_server_close_match_the_wire_from_an_mptcp_client() {
    fd_reuse_late_accept_and_server_close(
        "fd-reuse-mptcp-client",
        &["mptcp"],
        &[],
        &DEFAULT_MECHANISMS,
        false,
        ClientSocket::Mptcp,
    );
}

/// How the agent says it learns each connection's socket and where reads and writes take their
/// arguments, on this project's VM with nothing overridden.
const DEFAULT_MECHANISMS: [&str; 3] = [
    "an accepted connection's TCP socket is found from its fd at the accept",
    "reads take their arguments at their exit, from the thread's saved registers (loaded through typed pointers (bpf_rdonly_cast))",
    "and their time from their socket's transmit stamp (loaded through typed pointers (bpf_rdonly_cast))",
];

/// How the test's client connects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClientSocket {
    Tcp,
    Mptcp,
}

/// `server_args`: after the server's port and count (`mptcp`: an MPTCP listener).
/// `mechanisms`: how the agent says it learns each connection's socket, then where reads and
/// writes take their arguments. Where fexit is allowed (not on this project's VM) the accept
/// hook names the socket and neither socket fallback runs: the first is then not in the log.
/// `from_read`: each connection's socket is learnt at its first read (else never there).
/// `client`: a plain TCP client, or one that speaks MPTCP.
fn fd_reuse_late_accept_and_server_close(
    name: &str,
    server_args: &[&str],
    env: &[(&str, &str)],
    mechanisms: &[&str],
    from_read: bool,
    client: ClientSocket,
) {
    const PER: usize = 10;
    let dir = tempdir(name);
    let port = free_port();
    let mut server = Command::new(engine::python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("engine/fd_reuse_server.py"))
        .args([&port.to_string(), &PER.to_string()])
        .args(server_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the test server");
    let mut ready = String::new();
    BufReader::new(server.stdout.take().expect("server stdout"))
        .read_line(&mut ready)
        .expect("server ready line");
    assert_eq!(ready.trim(), "ready");
    let server = KillOnDrop(server);
    let pid = server.0.id();

    let pcap_path = dir.join("lo.pcap");
    let dump = tcpdump(&pcap_path, port);
    let mut recorder = Recorder::start_with_env(&dir, &["--port", &port.to_string()], env);
    recorder.wait_attached(pid, Duration::from_secs(30));
    let fexit = !recorder
        .log_text()
        .contains("fexit on inet_csk_accept unavailable");
    // With fexit, no read waits for its socket, so even the first-read run takes the
    // arguments at the exit.
    let (socket_mechanism, args_mechanisms) = mechanisms.split_first().expect("mechanisms");
    assert!(
        (fexit || recorder.log_text().contains(socket_mechanism))
            && args_mechanisms
                .iter()
                .all(|m| fexit && from_read || recorder.log_text().contains(m)),
        "the socket or the arguments are not taken the way this test runs: {}",
        recorder.log_text()
    );

    let scenarios = [
        "file-before-accept",
        "late-accept",
        "file-after-close",
        "server-closes-first",
    ];
    for n in 0..PER * scenarios.len() {
        let raw = match client {
            ClientSocket::Tcp => post_and_read_to_close(port, n),
            ClientSocket::Mptcp => post_and_read_to_close_on(mptcp_connect(port), n),
        };
        assert!(raw.starts_with(b"HTTP/1.1 200"), "request {n}: {raw:?}");
    }
    recorder.wait_records(Duration::from_secs(30), "a record per request", |records| {
        records.len() >= PER * scenarios.len()
    });
    stop_tcpdump(dump, &pcap_path, port, PER * scenarios.len());
    let log_recorder = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_recorder);
    let log = std::fs::read_to_string(log_recorder).unwrap_or_default();

    let packets = pcap::read(&pcap_path);
    let on_wire = wire_requests(&packets, port, b"POST ");
    let note = wire_note(&packets, &pcap_path, port);
    assert_eq!(
        on_wire,
        PER * scenarios.len(),
        "requests on the wire: {note}"
    );
    let wire = pcap::wire_ttfts(&packets, port);
    assert_eq!(
        wire.len(),
        on_wire,
        "a first token on the wire for every request"
    );

    // Exactly one record per request, and no record for anything else (a file's bytes).
    assert_eq!(
        records.len(),
        on_wire,
        "one record per request: {records:#?}\n{log}"
    );
    let mut by_id: HashMap<&str, &Value> = HashMap::new();
    for r in &records {
        let id = r["response_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{r:#?}"));
        assert!(by_id.insert(id, r).is_none(), "two records for {id}");
        assert_eq!(r["method"], "POST", "{r:#?}");
        assert_eq!(r["path"], "/v1/chat/completions", "{r:#?}");
        assert_eq!(r["connection_preexisting"], false, "{r:#?}");
    }
    let mut errors = Vec::new();
    for (id, wire_ttft) in &wire {
        let r = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("no record for {id}"));
        assert!(
            r["arrival_wire_mono_ns"].is_u64(),
            "{id}: wire arrival lost: {r:#?}"
        );
        let ttft = ms(&r["ttft_ms"]);
        assert!(
            (ttft - wire_ttft).abs() < 1.0,
            "{id}: TTFT {ttft:.3} ms, on the wire {wire_ttft:.3} ms"
        );
        errors.push(ttft - wire_ttft);
        let scenario = scenarios
            .iter()
            .find(|s| id.contains(*s))
            .expect("a scenario in the id");
        if *scenario == "server-closes-first" {
            assert_eq!(r["ended_by"], "server", "{r:#?}");
            assert_eq!(r["aborted"], false, "{r:#?}");
            assert_eq!(r["output_chunks"], 2, "{r:#?}");
        } else {
            assert_eq!(r["ended_by"], "complete", "{r:#?}");
            assert_eq!(r["output_chunks"], 3, "{r:#?}");
        }
        if *scenario == "late-accept" {
            // The bytes waited ~20 ms for the accept: TTFT counts that wait.
            assert!(ms(&r["read_delay_ms"]) >= 15.0, "{r:#?}");
        }
    }
    errors.sort_by(f64::total_cmp);
    eprintln!(
        "{name}: TTFT - wire TTFT over {} requests: min {:+.4} ms, median {:+.4} ms, max {:+.4} ms",
        errors.len(),
        errors[0],
        errors[errors.len() / 2],
        errors[errors.len() - 1]
    );
    // The files were never captured: the kernel skipped their reads.
    assert!(
        counters.get("kernel_unknown_fd_skipped") >= (2 * PER) as u64,
        "{log}"
    );
    assert_eq!(counters.get("records_not_server_connection"), 0, "{log}");
    assert_eq!(
        counters.get("kernel_conns_accepted"),
        on_wire as u64,
        "{log}"
    );
    if client == ClientSocket::Mptcp {
        // Every write of this test is transmitted before it returns (the server waits between
        // its events): one stamped at its return read a socket that was not the subflow.
        assert_eq!(counters.get("kernel_writes_stamped_at_return"), 0, "{log}");
    }
    if !fexit {
        let learnt_at_read = counters.get("kernel_conn_sock_from_read");
        if from_read {
            assert!(learnt_at_read >= on_wire as u64, "{log}");
        } else {
            assert_eq!(learnt_at_read, 0, "{log}");
        }
    }
}

#[test]
fn real_engine_burst_and_sequential_requests_all_recorded_with_wire_arrivals() {
    const BURST: usize = 32;
    const SEQUENTIAL: usize = 300;
    let dir = tempdir("engine-burst");
    let port = free_port();
    let engine = Engine::start(port, 2);
    let pcap_path = dir.join("lo.pcap");
    let dump = tcpdump(&pcap_path, port);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string()]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    // A burst of fresh connections, all at once.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(BURST));
    let workers: Vec<_> = (0..BURST)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut client = Client::connect(port);
                barrier.wait();
                client.chat(&format!("({i}) Name a colour."), 3, None)
            })
        })
        .collect();
    let streams: Vec<_> = workers
        .into_iter()
        .map(|w| w.join().expect("client thread"))
        .collect();
    assert!(streams.iter().all(|s| s.completed));
    // Short requests one after another, each on a fresh connection.
    for _ in 0..SEQUENTIAL {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("sending");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
    recorder.wait_records(Duration::from_secs(30), "a record per request", |records| {
        records.len() >= BURST + SEQUENTIAL
    });
    stop_tcpdump(dump, &pcap_path, port, BURST + SEQUENTIAL);
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(log_path).unwrap_or_default();

    let packets = pcap::read(&pcap_path);
    let note = wire_note(&packets, &pcap_path, port);
    assert_eq!(wire_requests(&packets, port, b"POST "), BURST, "{note}");
    assert_eq!(wire_requests(&packets, port, b"GET "), SEQUENTIAL, "{note}");
    let wire = pcap::wire_ttfts(&packets, port);
    assert_eq!(wire.len(), BURST);

    let chats: Vec<&Value> = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    let health: Vec<&Value> = records.iter().filter(|r| r["path"] == "/health").collect();
    assert_eq!(
        chats.len() + health.len(),
        records.len(),
        "a record that is no request on the wire: {records:#?}"
    );
    assert_eq!(chats.len(), BURST, "{log}");
    assert_eq!(health.len(), SEQUENTIAL, "{log}");
    for r in &health {
        assert!(r["arrival_wire_mono_ns"].is_u64(), "{r:#?}");
        assert_eq!(r["status"], 200);
        assert_eq!(r["ended_by"], "complete", "{r:#?}");
    }
    for (id, wire_ttft) in &wire {
        let matching: Vec<_> = chats.iter().filter(|r| r["response_id"] == *id).collect();
        assert_eq!(matching.len(), 1, "{id}: {matching:#?}");
        let r = matching[0];
        assert!(r["arrival_wire_mono_ns"].is_u64(), "{r:#?}");
        let ttft = ms(&r["ttft_ms"]);
        assert!(
            (ttft - wire_ttft).abs() < 1.0,
            "{id}: TTFT {ttft:.3} ms, on the wire {wire_ttft:.3} ms"
        );
        assert_eq!(r["ended_by"], "complete", "{r:#?}");
    }
    assert_eq!(counters.get("records_not_server_connection"), 0, "{log}");
}

/// A non-streamed chat request (content-length framed response) with its own `X-Request-Id`.
fn chat_request(id: &str, stream: bool) -> String {
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{id}: name a colour"}}],"max_tokens":3,"stream":{stream}}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: {id}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Reads one content-length framed response off `s` (`pending` keeps bytes of the next).
fn read_framed_response(s: &mut TcpStream, pending: &mut Vec<u8>) -> String {
    let mut buf = [0u8; 8192];
    loop {
        if let Some(head_end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .split("content-length:")
                .nth(1)
                .and_then(|v| v.lines().next())
                .and_then(|v| v.trim().parse().ok())
                .expect("a content-length framed response");
            let total = head_end + 4 + length;
            if pending.len() >= total {
                let response: Vec<u8> = pending.drain(..total).collect();
                return String::from_utf8_lossy(&response).into_owned();
            }
        }
        let n = s.read(&mut buf).expect("reading a response");
        assert!(n > 0, "the server closed before answering");
        pending.extend_from_slice(&buf[..n]);
    }
}

/// Keep-alive shapes the engine's clients produce that the tests above do not: requests
/// pipelined into one write (each must join its own scheduler task, in order), and a request
/// pipelined behind a stream (llama.cpp shuts the connection down after a stream, drains and
/// closes: the request is the server's cut, never a client abort).
#[test]
fn real_engine_pipelined_requests_and_a_request_after_the_servers_shutdown() {
    const CONNECTIONS: usize = 3;
    const PIPELINED: usize = 3;
    let dir = tempdir("engine-pipelined");
    let port = free_port();
    let engine = Engine::start(port, 2);
    let pcap_path = dir.join("lo.pcap");
    let dump = tcpdump(&pcap_path, port);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string()]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    for c in 0..CONNECTIONS {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        let all: String = (0..PIPELINED)
            .map(|k| chat_request(&format!("p{c}-{k}"), false))
            .collect();
        s.write_all(all.as_bytes()).expect("sending");
        let mut pending = Vec::new();
        for _ in 0..PIPELINED {
            let response = read_framed_response(&mut s, &mut pending);
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        }
    }

    // A stream with a request pipelined behind it: llama.cpp shuts the connection down after
    // a stream, drains what the client sent, and closes without answering it.
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let both = chat_request("s-0", true)
        + "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: after\r\n\r\n";
    s.write_all(both.as_bytes()).expect("sending");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    assert!(
        raw.ends_with(b"\r\n0\r\n\r\n"),
        "the stream did not end whole"
    );
    assert_eq!(
        String::from_utf8_lossy(&raw).matches("HTTP/1.1 ").count(),
        1,
        "llama.cpp answered the request behind a stream"
    );
    drop(s);

    recorder.wait_records(
        Duration::from_secs(30),
        "the pipelined requests",
        |records| {
            (0..CONNECTIONS).all(|c| {
                (0..PIPELINED).all(|k| {
                    let id = format!("p{c}-{k}");
                    records.iter().any(|r| r["x_request_id"] == id.as_str())
                })
            })
        },
    );
    stop_tcpdump(dump, &pcap_path, port, CONNECTIONS + 1);
    let log_path = recorder.log.clone();
    let records = recorder.stop();
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(log_path).unwrap_or_default();

    // The wire: each connection's requests left in one segment (pipelined for real).
    let packets = pcap::read(&pcap_path);
    assert_eq!(wire_requests(&packets, port, b"POST "), CONNECTIONS + 1);

    let by_id = |id: &str| -> &Value {
        let matching: Vec<&Value> = records.iter().filter(|r| r["x_request_id"] == id).collect();
        assert_eq!(matching.len(), 1, "{id}: {matching:#?}\n{log}");
        matching[0]
    };
    for c in 0..CONNECTIONS {
        let mut previous_end = 0u64;
        let mut tasks = Vec::new();
        for k in 0..PIPELINED {
            let r = by_id(&format!("p{c}-{k}"));
            assert_eq!(r["status"], 200, "{r:#?}");
            assert_eq!(r["ended_by"], "complete", "{r:#?}");
            assert_eq!(r["seq_on_connection"], k as u64, "{r:#?}");
            // Its own task, admitted after it was read and after the previous answer ended
            // (the server handles a connection's requests in order), before its own answer.
            let admitted = r["admitted_mono_ns"]
                .as_u64()
                .unwrap_or_else(|| panic!("p{c}-{k} has no admission: {r:#?}\n{log}"));
            let read = r["arrival_read_mono_ns"].as_u64().expect("read time");
            let first_byte = r["first_byte_mono_ns"].as_u64().expect("first byte");
            assert!(admitted >= read && admitted <= first_byte, "{r:#?}");
            assert!(
                admitted >= previous_end,
                "p{c}-{k} admitted before the previous answer ended: {r:#?}"
            );
            previous_end = r["end_mono_ns"].as_u64().expect("end");
            tasks.push(r["engine_task_id"].as_i64().expect("task id"));
        }
        tasks.dedup();
        assert_eq!(
            tasks.len(),
            PIPELINED,
            "tasks shared between pipelined requests"
        );
    }
    let stream = by_id("s-0");
    assert_eq!(stream["ended_by"], "complete", "{stream:#?}");
    let after = by_id("after");
    assert_eq!(after["ended_by"], "server", "{after:#?}");
    assert_eq!(after["aborted"], false, "{after:#?}");
    assert!(after["status"].is_null(), "{after:#?}");
    assert_eq!(counters.get("requests_cut_by_server"), 1, "{log}");
    assert_eq!(counters.get("requests_aborted"), 0, "{log}");
    assert_eq!(
        records.len(),
        CONNECTIONS * PIPELINED + 2,
        "a record that is no request on the wire: {records:#?}"
    );
}
