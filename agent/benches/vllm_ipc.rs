//! vLLM IPC decode throughput on one core: the vLLM 0.33.0 fixture streams (tests/fixtures/vllm,
//! the API server's view: its input socket both ways and the engine's outputs) replayed through
//! the agent's IPC decoder (ZMTP → msgpack → request state → step records), one syscall per
//! 4096 bytes. A fresh decoder per round (the decoder drops a message it has already seen).
//! Prints messages/s, MB/s and ns/message.
//!
//! cargo bench -p inferscope --bench vllm_ipc

// A benchmark, like a test, stops with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use inferscope::testing::{IpcBytes, IpcDirection, engine};

fn main() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/vllm/0.33.0");
    let read = |name: &str| std::fs::read(format!("{dir}/{name}")).expect("fixture");
    let streams = [
        (read("ipc-input.from_engine.bin"), 7, IpcDirection::Read),
        (read("ipc-input.to_engine.bin"), 7, IpcDirection::Write),
        (read("ipc-output.to_engine.bin"), 8, IpcDirection::Write),
        (read("ipc-output.from_engine.bin"), 8, IpcDirection::Read),
    ];
    let bytes: usize = streams.iter().map(|s| s.0.len()).sum();
    // 1 start-up message, 5 inputs, 6 outputs per round.
    let messages_per_round = 12u64;
    let vllm = engine("vllm").expect("vllm engine");
    let rounds = 20_000u64;
    let mut steps = Vec::new();
    let start = Instant::now();
    for _ in 0..rounds {
        let mut ipc = vllm.ipc().expect("vllm decodes IPC");
        for (data, fd, direction) in &streams {
            for chunk in data.chunks(4096) {
                ipc.on_bytes(
                    &IpcBytes {
                        tgid: 1,
                        tid: 1,
                        fd: *fd,
                        conn_gen: 1,
                        direction: *direction,
                        data: chunk,
                        lost: 0,
                    },
                    &mut steps,
                );
            }
        }
        steps.clear();
    }
    let secs = start.elapsed().as_secs_f64();
    let messages = rounds * messages_per_round;
    println!(
        "vllm_ipc: {rounds} rounds, {messages} messages, {:.0} messages/s, {:.1} MB/s, {:.0} ns/message",
        messages as f64 / secs,
        (rounds as f64 * bytes as f64) / secs / 1e6,
        secs * 1e9 / messages as f64
    );
}
