//! A small streaming load for the demo: workers send chat completions with varied prompts (the
//! engine caches prompt prefixes) and read the SSE streams. llama.cpp's server closes the
//! connection after a streamed response, so each request gets its own connection.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use inferscope_decode::http::{Chunk, Limits, ResponseDecoder, ResponseEvent};

const TOPICS: &[&str] = &[
    "lighthouses",
    "volcanoes",
    "tea ceremonies",
    "honeybees",
    "glaciers",
    "chess openings",
    "coral reefs",
    "bridges",
    "comets",
    "sourdough",
    "owls",
    "deserts",
    "jazz",
    "maple trees",
    "submarines",
    "origami",
];

#[derive(Debug, Clone)]
pub(super) struct ClientResult {
    pub response_id: Option<String>,
    pub client_ttft_ms: Option<f64>,
    pub content_chunks: u64,
}

pub(super) struct LoadSpec {
    pub port: u16,
    pub requests: usize,
    pub concurrency: usize,
    pub max_tokens: u32,
}

pub(super) fn run(spec: &LoadSpec) -> Vec<ClientResult> {
    let next = Arc::new(AtomicUsize::new(0));
    let salt = std::process::id();
    let workers: Vec<_> = (0..spec.concurrency)
        .map(|_| {
            let next = Arc::clone(&next);
            let (port, total, max_tokens) = (spec.port, spec.requests, spec.max_tokens);
            std::thread::spawn(move || {
                let mut results = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let prompt = format!(
                        "({salt}-{i}) Write three short sentences about {}.",
                        TOPICS[i % TOPICS.len()]
                    );
                    match one_request(port, &prompt, max_tokens) {
                        Ok(r) => results.push(r),
                        Err(e) => eprintln!("demo request {i} failed: {e}"),
                    }
                }
                results
            })
        })
        .collect();
    workers
        .into_iter()
        .flat_map(|w| w.join().unwrap_or_default())
        .collect()
}

fn one_request(port: u16, prompt: &str, max_tokens: u32) -> std::io::Result<ClientResult> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    stream.set_nodelay(true)?;
    let body = serde_json::json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": max_tokens,
    })
    .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let start = Instant::now();
    stream.write_all(request.as_bytes())?;
    let mut decoder = ResponseDecoder::new(Limits::default());
    let mut events = Vec::new();
    let mut buf = vec![0u8; 16384];
    let mut result = ClientResult {
        response_id: None,
        client_ttft_ms: None,
        content_chunks: 0,
    };
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::other("connection closed mid-response"));
        }
        let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
        decoder.feed(
            Chunk {
                bytes: &buf[..n],
                lost: 0,
                ts_ns: 0,
            },
            &mut events,
        );
        for event in events.drain(..) {
            match event {
                ResponseEvent::Sse(sse) => {
                    if result.response_id.is_none() {
                        result.response_id = sse.id;
                    }
                    if sse.content {
                        result.content_chunks += 1;
                        result.client_ttft_ms.get_or_insert(elapsed_ms);
                    }
                }
                ResponseEvent::End { .. } => return Ok(result),
                ResponseEvent::Error(e) => return Err(std::io::Error::other(e.to_string())),
                _ => {}
            }
        }
    }
}
