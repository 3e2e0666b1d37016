//! A streaming chat client with its own, deliberately simple view of the response (independent
//! of the agent's decoder), so the tests compare two implementations.
use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use serde_json::Value;

#[derive(Debug, Clone, Default)]
pub struct ClientStream {
    pub local_port: u16,
    pub response_id: Option<String>,
    pub client_ttft_ms: Option<f64>,
    pub content_chunks: u64,
    pub completed: bool,
    /// The client gave up: no byte came within its read timeout, and it closed the connection.
    pub timed_out: bool,
}

pub struct Client {
    stream: TcpStream,
    port: u16,
    /// Sent with every request (e.g. traceparent, x-request-id).
    headers: Vec<(String, String)>,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the engine");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream
            .set_read_timeout(Some(Duration::from_secs(180)))
            .expect("read timeout");
        Client {
            stream,
            port,
            headers: Vec::new(),
        }
    }

    /// How long a read may wait before the client gives up and closes the connection (an
    /// impatient client; 180 s by default).
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.stream
            .set_read_timeout(Some(timeout))
            .expect("read timeout");
    }

    /// Sends this header with every following request (replacing an earlier value).
    pub fn set_header(&mut self, name: &str, value: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
    }

    /// Sends one streaming chat completion and reads it to the end (or, with `abort_after`,
    /// closes the connection after that many content chunks).
    pub fn chat(
        &mut self,
        prompt: &str,
        max_tokens: u32,
        abort_after: Option<u64>,
    ) -> ClientStream {
        let body = serde_json::json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": prompt}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": max_tokens,
        })
        .to_string();
        let mut result = ClientStream {
            local_port: self.stream.local_addr().map(|a| a.port()).unwrap_or(0),
            ..Default::default()
        };
        let start = Instant::now();
        self.post_chat(&body);
        let mut raw: Vec<u8> = Vec::new();
        let mut scanned = 0usize;
        let mut buf = [0u8; 16384];
        loop {
            let n = match self.stream.read(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    result.timed_out = true;
                    let _ = self.stream.shutdown(std::net::Shutdown::Both);
                    return result;
                }
                // A signal to the test process (a child's exit) interrupted the read: read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("reading the response: {e}"),
            };
            assert!(n > 0, "server closed the connection mid-response");
            let now_ms = start.elapsed().as_secs_f64() * 1e3;
            raw.extend_from_slice(&buf[..n]);
            // Events end with a blank line; chunk-size lines sit between events.
            while let Some(end) = find(&raw[scanned..], b"\n\n") {
                let piece = &raw[scanned..scanned + end];
                scanned += end + 2;
                let Some(at) = find(piece, b"data: ") else {
                    continue;
                };
                let data = &piece[at + 6..];
                if data == b"[DONE]" {
                    continue;
                }
                let Ok(json) = serde_json::from_slice::<Value>(data) else {
                    continue;
                };
                if result.response_id.is_none() {
                    result.response_id = json["id"].as_str().map(str::to_owned);
                }
                let has_content = json["choices"].as_array().into_iter().flatten().any(|c| {
                    c["delta"]["content"]
                        .as_str()
                        .is_some_and(|s| !s.is_empty())
                });
                if has_content {
                    result.content_chunks += 1;
                    result.client_ttft_ms.get_or_insert(now_ms);
                    if abort_after.is_some_and(|n| result.content_chunks >= n) {
                        let _ = self.stream.shutdown(std::net::Shutdown::Both);
                        return result;
                    }
                }
            }
            if raw.ends_with(b"\r\n0\r\n\r\n") {
                result.completed = true;
                return result;
            }
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ClientResponse {
    pub local_port: u16,
    pub response_id: Option<String>,
    pub completion_tokens: Option<u64>,
}

impl Client {
    /// Writes one chat-completions request with `body` in a single write (the wire reference
    /// takes a request's first packet as its start).
    fn post_chat(&mut self, body: &str) {
        let extra: String = self
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect();
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.port,
            body.len()
        );
        self.stream
            .write_all(request.as_bytes())
            .expect("sending the request");
    }

    /// One non-streaming chat completion on this (keep-alive) connection.
    pub fn complete(&mut self, prompt: &str, max_tokens: u32) -> ClientResponse {
        let body = serde_json::json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
        })
        .to_string();
        self.post_chat(&body);
        let mut raw: Vec<u8> = Vec::new();
        let mut buf = [0u8; 16384];
        loop {
            let n = match self.stream.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("reading the response: {e}"),
            };
            assert!(n > 0, "server closed the connection mid-response");
            raw.extend_from_slice(&buf[..n]);
            let Some(head_end) = find(&raw, b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a Content-Length on the non-streaming response");
            let body = &raw[head_end + 4..];
            if body.len() < length {
                continue;
            }
            let json: Value = serde_json::from_slice(&body[..length]).expect("JSON body");
            return ClientResponse {
                local_port: self.stream.local_addr().map(|a| a.port()).unwrap_or(0),
                response_id: json["id"].as_str().map(str::to_owned),
                completion_tokens: json["usage"]["completion_tokens"].as_u64(),
            };
        }
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Runs a test client that prints one JSON object per line and `done` last; its objects. A
/// client that fails, or stops before `done`, fails the test with what it printed.
pub fn json_lines(command: &mut std::process::Command) -> Vec<serde_json::Value> {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.lines().last() == Some("done"),
        "{command:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
