//! Decode + correlate throughput on one core: synthetic llama.cpp-shaped streams (request read,
//! response head, one write per SSE token event, [DONE], terminator) pushed through the same
//! `Tracker` the agent runs. Prints events/s and ns/event.
//!
//! cargo bench -p inferscope --bench pipeline

// A benchmark, like a test, stops with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use inferscope::testing::{Peer, SyscallEvent, Tracker};
use inferscope_common::SyscallKind;
use inferscope_decode::http::Limits;

const BODY: &str = r#"{"model":"smollm2","messages":[{"role":"user","content":"Write three short sentences about honeybees."}],"stream":true,"max_tokens":32}"#;

fn request() -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8089\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes()
}
const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

fn sse_chunk(token: &str) -> Vec<u8> {
    let event = format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\"{token}\"}}}}],\"created\":1796009965,\"id\":\"chatcmpl-pAfN4suyUpdwnjXli0zM2GnstiqRPzvu\",\"model\":\"SmolLM2-135M-Instruct.Q4_1.gguf\",\"system_fingerprint\":\"b0-unknown\",\"object\":\"chat.completion.chunk\"}}\n\n"
    );
    let mut chunk = format!("{:x}\r\n", event.len()).into_bytes();
    chunk.extend_from_slice(event.as_bytes());
    chunk.extend_from_slice(b"\r\n");
    chunk
}

fn event(kind: SyscallKind, fd: i32, ts: u64, payload: &[u8]) -> SyscallEvent<'_> {
    SyscallEvent {
        kind,
        tgid: 1,
        tid: 2,
        fd,
        ts_enter_ns: ts,
        ts_exit_ns: ts + 1,
        ret: payload.len() as i64,
        truncated: false,
        copy_failed: false,
        conn_gen: 0,
        conn_flags: 0,
        sock: 0,
        conn_seq: None,
        read_seq: None,
        lost_heads: 0,
        payload,
        more: false,
        chunk_offset: None,
        token: false,
    }
}

fn main() {
    let tokens_per_request: u64 = 32;
    let requests: u64 = 200_000;
    let token = sse_chunk(" hello");
    let done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n".to_vec();
    let request = request();
    let mut tracker = Tracker::new(Limits::default());
    tracker.set_engine(1, "llamacpp");
    let peer = Peer {
        local_port: Some(8089),
        remote: Some("127.0.0.1:40000".parse().unwrap()),
        ..Peer::default()
    };
    let mut out = Vec::new();
    let mut records = 0usize;
    let mut content_chunks = 0u64;
    let mut events = 0u64;
    let mut ts = 1_000u64;
    let start = Instant::now();
    for r in 0..requests {
        let fd = 10 + (r % 64) as i32;
        tracker.on_read(&event(SyscallKind::Read, fd, ts, &request), peer, &mut out);
        tracker.on_write(
            &event(SyscallKind::Write, fd, ts + 10, HEAD),
            peer,
            &mut out,
        );
        events += 2;
        for t in 0..tokens_per_request {
            ts += 1000;
            tracker.on_write(
                &event(SyscallKind::Write, fd, ts + t, &token),
                peer,
                &mut out,
            );
            events += 1;
        }
        tracker.on_write(
            &event(SyscallKind::Write, fd, ts + 100, &done),
            peer,
            &mut out,
        );
        events += 1;
        ts += 10_000;
        records += out.len();
        content_chunks += out.iter().map(|r| r.output_chunks).sum::<u64>();
        out.clear();
    }
    let elapsed = start.elapsed().as_secs_f64();
    // The work must really have happened: one record per request with every token seen.
    assert_eq!(records as u64, requests, "records");
    assert_eq!(
        content_chunks,
        requests * tokens_per_request,
        "content chunks"
    );
    println!(
        "{events} syscall events ({requests} requests x {tokens_per_request} tokens) in {elapsed:.3} s: {:.2} M events/s, {:.0} ns/event",
        events as f64 / elapsed / 1e6,
        elapsed * 1e9 / events as f64
    );
}
