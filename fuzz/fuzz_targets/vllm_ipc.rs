//! Feeds arbitrary bytes, split at arbitrary points with arbitrary capture losses, to the ZMTP
//! stream decoder and to vLLM's IPC decoder (ZMTP → msgpack → messages → request state), and
//! walks them with the msgpack reader. Beyond "never panics" it checks the documented bounds:
//! kept frame bytes never exceed the limit, frames per message never exceed the limit, and the
//! reader never moves past its input.
//!
//! Input layout: byte 0 picks the mode (a valid greeting and READY first, so the frame parser
//! is reached quickly, or raw bytes) and the number of control bytes; the control bytes then
//! drive the syscall sizes and losses; the rest is the byte stream.
#![no_main]

use inferscope::testing::{IpcBytes, IpcDirection, engine};
use inferscope_decode::{
    msgpack::Reader,
    zmtp::{ZmtpLimits, ZmtpStream},
};
use libfuzzer_sys::fuzz_target;

/// A ZMTP 3.0 NULL greeting followed by READY(Socket-Type=PUSH).
fn greeting() -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
    let mut mech = [0u8; 20];
    mech[..4].copy_from_slice(b"NULL");
    g.extend_from_slice(&mech);
    g.extend_from_slice(&[0u8; 32]);
    let mut ready = vec![5];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&4u32.to_be_bytes());
    ready.extend_from_slice(b"PUSH");
    g.push(0x04);
    g.push(ready.len() as u8);
    g.extend_from_slice(&ready);
    g
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let n_control = usize::from(cfg >> 2).min(rest.len());
    let (control, body) = rest.split_at(n_control);
    let mut stream_bytes = if cfg & 1 == 0 { greeting() } else { Vec::new() };
    stream_bytes.extend_from_slice(body);
    let limits = ZmtpLimits {
        max_frame_keep: if cfg & 2 == 0 { 256 * 1024 } else { 16 },
        max_frames: if cfg & 2 == 0 { 16 } else { 2 },
    };

    let mut zmtp = ZmtpStream::new(limits);
    let Some(vllm) = engine("vllm") else {
        return;
    };
    let Some(mut ipc) = vllm.ipc() else {
        return;
    };
    let mut messages = Vec::new();
    let mut steps = Vec::new();
    let mut at = 0usize;
    let mut i = 0usize;
    while at < stream_bytes.len() {
        let c = control
            .get(i % control.len().max(1))
            .copied()
            .unwrap_or(0xff);
        let size = (usize::from(c & 0x7f) + 1) * if c & 0x80 != 0 { 64 } else { 1 };
        let end = (at + size).min(stream_bytes.len());
        let lost = if c % 17 == 3 { u64::from(c) } else { 0 };
        let chunk = &stream_bytes[at..end];
        zmtp.feed(chunk, lost, &mut messages);
        for direction in [IpcDirection::Read, IpcDirection::Write] {
            ipc.on_bytes(
                &IpcBytes {
                    tgid: 1,
                    tid: 1,
                    fd: 3,
                    conn_gen: 1,
                    direction,
                    data: chunk,
                    lost,
                },
                &mut steps,
            );
        }
        at = end;
        i += 1;
    }
    for message in &messages {
        assert!(message.frames.len() <= limits.max_frames);
        for frame in &message.frames {
            assert!(frame.data.len() <= limits.max_frame_keep);
            assert!(frame.data.len() as u64 <= frame.size);
        }
    }
    // The msgpack reader over the raw body: every value skipped or an error, never past the end.
    let mut reader = Reader::new(body);
    for _ in 0..1024 {
        if reader.is_empty() || reader.skip().is_err() {
            break;
        }
    }
    assert!(reader.position() <= body.len());
    let mut record = inferscope_model::RequestRecord {
        response_id: Some("chatcmpl-x".into()),
        ..Default::default()
    };
    ipc.enrich(&mut record);
    let _ = ipc.counters();
});
