//! Helpers for the integration tests: the real engine, the real agent binary, a streaming
//! client that keeps its own view of each response, and a pcap reader for the wire reference.
pub mod agent;
pub mod client;
pub mod engine;
pub mod mock_cuda;
pub mod pcap;

use std::net::TcpListener;

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port on 127.0.0.1")
}
