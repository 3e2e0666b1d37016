//! The agent, with real eBPF, against the real llama.cpp server: every request recorded once,
//! TTFT equal to the wire's, chunk counts equal to the client's, keep-alive and aborts right.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::Duration,
};

use inferscope_integration_tests::{
    agent::{self, Recorder},
    client::{Client, ClientResponse, ClientStream},
    engine::Engine,
    free_port, pcap,
};
use serde_json::Value;

const TOPICS: &[&str] = &[
    "rivers", "kites", "pianos", "cacti", "lanterns", "otters", "canyons", "violins", "harbors",
    "meteors", "gardens", "islands",
];

/// A helper process that must not outlive a failed test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// tcpdump writes its file's header once its filter is set: from then on packets are seen.
fn wait_capture(pcap_path: &std::path::Path) {
    inferscope_integration_tests::wait_until(Duration::from_secs(10), "tcpdump's capture", || {
        std::fs::metadata(pcap_path).is_ok_and(|m| m.len() >= 24)
    });
}

fn tempdir(name: &str) -> std::path::PathBuf {
    inferscope_integration_tests::test_dir(name)
}

fn by_response_id(records: &[Value]) -> HashMap<String, Vec<&Value>> {
    let mut map: HashMap<String, Vec<&Value>> = HashMap::new();
    for r in records {
        if let Some(id) = r["response_id"].as_str() {
            map.entry(id.to_owned()).or_default().push(r);
        }
    }
    map
}

#[test]
fn records_match_the_wire_for_concurrent_keep_alive_streams() {
    let dir = tempdir("wire");
    let port = free_port();
    let engine = Engine::start(port, 2);

    let pcap_path = dir.join("lo.pcap");
    let tcpdump = Command::new("tcpdump")
        .args([
            "-i",
            "lo",
            "-s",
            "0",
            "-U",
            "--time-stamp-precision=nano",
            "-w",
        ])
        .arg(&pcap_path)
        .args(["tcp", "port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting tcpdump (apt-get install tcpdump)");
    let mut tcpdump = KillOnDrop(tcpdump);

    wait_capture(&pcap_path);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string()]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    // 3 concurrent clients on 2 slots. llama.cpp closes a connection after a streamed response,
    // so keep-alive is exercised as a non-streaming request followed by a streaming one on the
    // same connection; each client does that 3 times.
    let workers: Vec<_> = (0..3)
        .map(|w| {
            std::thread::spawn(move || {
                (0..3)
                    .map(|i| {
                        let mut client = Client::connect(port);
                        let topic = TOPICS[(w * 3 + i) % TOPICS.len()];
                        let plain = client.complete(&format!("({w}.{i}) One word for {topic}?"), 4);
                        let prompt = format!("({w}.{i}) Tell me two facts about {topic}.");
                        (plain, client.chat(&prompt, 12 + 4 * i as u32, None))
                    })
                    .collect::<Vec<(ClientResponse, ClientStream)>>()
            })
        })
        .collect();
    let (plain, streams): (Vec<ClientResponse>, Vec<ClientStream>) = workers
        .into_iter()
        .flat_map(|w| w.join().expect("client thread"))
        .unzip();
    // A client that hangs up after the second token.
    let aborted = Client::connect(port).chat("Write a long story about a robot.", 200, Some(2));
    let want: Vec<String> = streams
        .iter()
        .map(|s| s.response_id.clone())
        .chain(plain.iter().map(|p| p.response_id.clone()))
        .chain([aborted.response_id.clone()])
        .flatten()
        .collect();
    recorder.wait_records(
        Duration::from_secs(30),
        "every response's record",
        |records| {
            want.iter()
                .all(|id| records.iter().any(|r| r["response_id"] == id.as_str()))
        },
    );

    let records = recorder.stop();
    agent::unsafe_sigint(tcpdump.0.id());
    tcpdump.0.wait().expect("tcpdump");
    drop(engine);

    let ids = by_response_id(&records);
    let packets = pcap::read(&pcap_path);
    let wire = pcap::wire_ttfts(&packets, port);

    let mut within_1ms = 0;
    let mut compared = 0;
    for s in &streams {
        assert!(s.completed);
        let id = s.response_id.as_deref().expect("the stream carried an id");
        let matching = ids.get(id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(
            matching.len(),
            1,
            "exactly one record for {id}: {records:#?}"
        );
        let r = matching[0];
        assert_eq!(r["aborted"], false);
        assert_eq!(r["status"], 200);
        assert_eq!(r["engine"], "llamacpp");
        assert_eq!(
            r["output_chunks"].as_u64(),
            Some(s.content_chunks),
            "content chunks for {id}"
        );
        let ttft = r["ttft_ms"].as_f64().expect("ttft_ms");
        let client_ttft = s.client_ttft_ms.expect("client saw a token");
        assert!(
            ttft <= client_ttft,
            "agent TTFT {ttft} > client TTFT {client_ttft} for {id}"
        );
        assert!(
            r["arrival_wire_mono_ns"].is_u64(),
            "wire arrival known for {id}"
        );
        assert!(r["prompt_tokens"].as_u64().unwrap_or(0) > 0);
        assert!(r["completion_tokens"].as_u64().unwrap_or(0) > 0);
        assert_eq!(r["stream"], true);
        assert!(r["prompt_bytes"].as_u64().unwrap_or(0) > 10);
        let wire_ttft = *wire.get(id).unwrap_or_else(|| panic!("wire TTFT for {id}"));
        compared += 1;
        if (ttft - wire_ttft).abs() <= 1.0 {
            within_1ms += 1;
        } else {
            eprintln!("{id}: agent TTFT {ttft:.3} ms vs wire {wire_ttft:.3} ms");
        }
    }
    assert_eq!(compared, 9);
    // 99% of 9 requests is all of them.
    assert_eq!(within_1ms, compared, "agent TTFT within 1 ms of the wire");

    // Keep-alive: the non-streaming request is 0 and the stream 1 on the same connection.
    for (p, s) in plain.iter().zip(&streams) {
        let id = p.response_id.as_deref().expect("non-streaming id");
        let rp = ids.get(id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(rp.len(), 1, "exactly one record for {id}");
        let rp = rp[0];
        assert_eq!(rp["aborted"], false);
        // No "stream" in the body: false, the OpenAI default.
        assert_eq!(rp["stream"], false);
        assert_eq!(rp["completion_tokens"].as_u64(), p.completion_tokens);
        assert_eq!(rp["seq_on_connection"], 0);
        let rs = ids[s.response_id.as_deref().unwrap()][0];
        assert_eq!(rs["seq_on_connection"], 1);
        assert_eq!(rs["connection_id"], rp["connection_id"]);
        assert_eq!(p.local_port, s.local_port);
    }

    // The abandoned stream is recorded once, as aborted, with the tokens it got.
    let id = aborted.response_id.expect("aborted stream id");
    let r = ids.get(&id).expect("a record for the aborted stream");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["aborted"], true, "{:#?}", r[0]);
    assert!(r[0]["output_chunks"].as_u64().unwrap() >= 2);

    // Nothing else was invented.
    assert_eq!(records.len(), 19, "{records:#?}");
}

#[test]
fn engine_started_after_the_agent_and_bad_input_on_its_port() {
    let dir = tempdir("late");
    let port = free_port();
    // --auto: the agent has to recognise llama.cpp (xllamacpp mapped into a Python process).
    let mut recorder = Recorder::start(&dir, &["--auto"]);
    agent::wait_log(&recorder.log, "recording", Duration::from_secs(30));
    assert!(recorder.is_running());
    let engine = Engine::start(port, 2);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    use std::io::{Read, Write};
    let send_raw = |bytes: &[u8]| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    };
    // Garbage, a TLS ClientHello-like binary blob, a truncated head, and headers over the
    // capture size: none of them is a request the agent may invent a record for.
    send_raw(b"\x00\x01\x02garbage that is not HTTP\r\n\r\n");
    send_raw(&[
        0x16, 0x03, 0x01, 0x00, 0xa5, 0x01, 0x00, 0x00, 0xa1, 0x03, 0x03,
    ]);
    send_raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
    let mut huge = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 20_000));
    huge.extend_from_slice(b"\r\n\r\n");
    send_raw(&huge);

    // A good request afterwards is still recorded.
    let good = Client::connect(port).chat("Name a color.", 8, None);
    let good_id = good.response_id.clone().expect("stream id");
    recorder.wait_records(
        Duration::from_secs(30),
        "the good request's record",
        |records| records.iter().any(|r| r["response_id"] == good_id.as_str()),
    );
    assert!(recorder.is_running(), "the agent survived bad input");
    let log_path = recorder.log.clone();
    // --auto traces every engine on the machine: keep this engine's records.
    let pid = engine.pid();
    let records: Vec<Value> = recorder
        .stop()
        .into_iter()
        .filter(|r| r["pid"] == pid)
        .collect();
    drop(engine);

    let ids = by_response_id(&records);
    let id = good.response_id.expect("stream id");
    assert_eq!(ids.get(&id).map(Vec::len), Some(1), "{records:#?}");
    // Scheduler hooks attached to the engine that started after the agent.
    let late = &ids[&id][0];
    assert!(late["queue_wait_ms"].is_f64(), "{records:#?}");
    assert!(late["engine_finished_mono_ns"].is_u64(), "{records:#?}");
    let counters = agent::Counters::beside(&log_path);
    let log = std::fs::read_to_string(log_path).unwrap_or_default();
    assert!(
        counters.get("not_http") >= 1,
        "garbage counted as not_http:\n{log}"
    );
    // The ClientHello is seen as TLS by the kernel (its plaintext would come from the TLS
    // probes): counted, no record.
    assert_eq!(counters.get("kernel_tls_connections"), 1, "{log}");
    // The 20 KB head (over the 16 KiB head limit) is counted; where the server answered it, its
    // record says it is incomplete and why (nothing of the head is invented). The only other
    // records are the launcher's readiness probes (GET /health, short) and the server's answers
    // to the bytes that did not parse (a 4xx each, marked unparsed; nothing for bytes it did not
    // answer).
    assert!(counters.get("head_too_large") >= 1, "{log}");
    let oversized = records
        .iter()
        .filter(|r| r["incomplete"] == "head_too_large")
        .count();
    assert!(oversized <= 1, "{records:#?}");
    for r in records.iter().filter(|r| r["incomplete"].is_null()) {
        assert!(r["request_bytes"].as_u64().unwrap() < 1000, "{r:#?}");
        if r["request_unparsed"] == true {
            assert_eq!(r["path"], "", "{r:#?}");
            let status = r["status"]
                .as_u64()
                .expect("an answered request has a status");
            assert!((400..500).contains(&status), "{r:#?}");
        } else if r["path"] != "/v1/chat/completions" {
            assert_eq!(r["path"], "/health", "{r:#?}");
        }
    }
    let chats = records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .count();
    assert_eq!(chats, 1, "{records:#?}");
    // llama.cpp answers the garbage with a 400: users see those.
    assert!(
        records.iter().any(|r| r["request_unparsed"] == true),
        "{records:#?}"
    );
}

/// A raw non-streamed chat request (the client's own bytes, so that it controls its socket).
fn plain_request(prompt: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8,
    })
    .to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The `"id"` of a chat completion found in `bytes` (a response on the wire).
fn completion_id(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let start = text.find("\"id\":\"")? + 6;
    let len = text[start..].find('"')?;
    Some(text[start..start + len].to_owned())
}

/// A client that gives up on a queued non-streamed request closes its socket; the server
/// answers later into the half-closed socket, and its write succeeds: only the client's FIN
/// and then its reset (sock:inet_sock_set_state) tell that the answer was never read. A
/// client that half-closes after sending and reads the whole answer stays complete.
#[test]
fn client_leaving_before_a_queued_answer_and_a_half_closed_client() {
    use std::{
        io::{Read, Write},
        net::{Shutdown, TcpStream},
    };
    let dir = tempdir("fin");
    let port = free_port();
    let engine = Engine::start(port, 2);
    let pcap_path = dir.join("lo.pcap");
    let tcpdump = Command::new("tcpdump")
        .args([
            "-i",
            "lo",
            "-s",
            "0",
            "-U",
            "--time-stamp-precision=nano",
            "-w",
        ])
        .arg(&pcap_path)
        .args(["tcp", "port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting tcpdump (apt-get install tcpdump)");
    let mut tcpdump = KillOnDrop(tcpdump);
    wait_capture(&pcap_path);
    let mut recorder = Recorder::start(&dir, &["--port", &port.to_string()]);
    recorder.wait_attached(engine.pid(), Duration::from_secs(30));

    // Both slots busy with long streams: the next request waits in the engine's queue.
    let streams: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                Client::connect(port).chat(
                    &format!("({i}) Write a long story about a robot."),
                    120,
                    None,
                )
            })
        })
        .collect();
    // Traffic shaping: the two long streams take both slots before the next request comes.
    std::thread::sleep(Duration::from_millis(700));
    let mut timeout_client = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    let timeout_port = timeout_client.local_addr().expect("local address").port();
    timeout_client
        .write_all(&plain_request("One word for kites?"))
        .expect("sending");
    // Traffic shaping: the client's timeout, it closes without reading.
    std::thread::sleep(Duration::from_millis(500));
    drop(timeout_client);
    for s in streams {
        assert!(s.join().expect("stream client").completed);
    }

    // A client that says it sends nothing more, then reads the whole answer.
    let mut half = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    half.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let half_port = half.local_addr().expect("local address").port();
    half.write_all(&plain_request("One word for otters?"))
        .expect("sending");
    half.shutdown(Shutdown::Write).expect("half-closing");
    let mut answer = Vec::new();
    half.read_to_end(&mut answer).expect("reading the answer");
    drop(half);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let half_id = completion_id(&answer).expect("the half-closed client read a whole answer");
    // Two streams, the unread answer and the half-closed client's.
    recorder.wait_records(Duration::from_secs(30), "four records", |records| {
        records.len() >= 4
    });

    let records = recorder.stop();
    agent::unsafe_sigint(tcpdump.0.id());
    tcpdump.0.wait().expect("tcpdump");
    drop(engine);
    let ids = by_response_id(&records);

    // The wire: the timeout client's FIN came before any byte of the answer, which the server
    // still wrote in full, and the client's reset answered it.
    let packets = pcap::read_all(&pcap_path);
    let on = |client: u16| -> Vec<&pcap::Packet> {
        packets
            .iter()
            .filter(|p| p.src_port == client || p.dst_port == client)
            .collect()
    };
    let wire = on(timeout_port);
    let request_ns = wire
        .iter()
        .find(|p| p.src_port == timeout_port && !p.payload.is_empty())
        .expect("the request on the wire")
        .ts_ns;
    let fin_ns = wire
        .iter()
        .find(|p| p.src_port == timeout_port && p.flags & pcap::FIN != 0)
        .expect("the client's FIN")
        .ts_ns;
    let answer_bytes: Vec<u8> = wire
        .iter()
        .filter(|p| p.src_port == port)
        .flat_map(|p| p.payload.clone())
        .collect();
    let answer_ns = wire
        .iter()
        .find(|p| p.src_port == port && !p.payload.is_empty())
        .expect("the server answered the timeout client anyway")
        .ts_ns;
    assert!(
        fin_ns < answer_ns,
        "FIN after the answer began: nothing to test"
    );
    assert!(
        wire.iter()
            .any(|p| p.src_port == timeout_port && p.flags & pcap::RST != 0 && p.ts_ns > answer_ns),
        "the closed client reset the answer"
    );
    let id = completion_id(&answer_bytes).expect("an id in the unread answer");
    let r = ids.get(&id).map(Vec::as_slice).unwrap_or_default();
    assert_eq!(
        r.len(),
        1,
        "one record for the unread answer {id}: {records:#?}"
    );
    let r = r[0];
    assert_eq!(r["ended_by"], "client", "{r:#?}");
    assert_eq!(r["aborted"], true);
    assert_eq!(r["status"], 200, "what the server wrote is kept");
    assert_eq!(
        r["response_bytes"].as_u64(),
        Some(answer_bytes.len() as u64)
    );
    // It ended at the client's FIN: arrival → end equals request → FIN on the wire.
    let e2e = r["e2e_ms"].as_f64().expect("e2e_ms");
    let wire_e2e = (fin_ns - request_ns) as f64 / 1e6;
    assert!(
        (e2e - wire_e2e).abs() < 2.0,
        "e2e {e2e} ms vs the wire's request→FIN {wire_e2e} ms"
    );
    let server_answer_ms = (answer_ns - request_ns) as f64 / 1e6;
    assert!(
        e2e < server_answer_ms,
        "ended before the server answered ({server_answer_ms} ms)"
    );

    // The half-closed client's FIN also preceded its answer, which it read: complete.
    let wire = on(half_port);
    let fin_ns = wire
        .iter()
        .find(|p| p.src_port == half_port && p.flags & pcap::FIN != 0)
        .expect("the half-closed client's FIN")
        .ts_ns;
    let answer_ns = wire
        .iter()
        .find(|p| p.src_port == port && !p.payload.is_empty())
        .expect("its answer")
        .ts_ns;
    assert!(fin_ns < answer_ns, "the half-close came before the answer");
    let r = ids.get(&half_id).map(Vec::as_slice).unwrap_or_default();
    assert_eq!(r.len(), 1, "one record for {half_id}: {records:#?}");
    assert_eq!(r[0]["ended_by"], "complete", "{:#?}", r[0]);
    assert_eq!(r[0]["aborted"], false);
    assert_eq!(r[0]["response_bytes"].as_u64(), Some(answer.len() as u64));
    assert_eq!(records.len(), 4, "{records:#?}");
}
