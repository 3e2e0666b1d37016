//! A high-rate loopback SSE server and its load generator, for the agent's benchmarks: the
//! server answers every chat-completions request with a head, one write per token event, and a
//! terminator (the syscall pattern of a streaming engine), far faster than a real model.
//!
//! sse_load serve --port P [--tokens N] [--hold-ms H [--hold-after K]] [--write-log FILE]
//!                                          (--hold-ms: a pause of H ms after the K-th token,
//!                                           the first by default)
//!                                          (--write-log: per response, its X-Request-Id, its
//!                                           token count and CLOCK_MONOTONIC around its first and
//!                                           last token write: the server's own clock as truth)
//! sse_load load  --port P [--connections C] [--requests R] [--seconds S] [--request-ids]
//!                                          (keep-alive; stops after R requests per connection or
//!                                           S seconds; --rate N paces all connections together
//!                                           to N requests/s; --request-ids sends X-Request-Id
//!                                           load-N; prints the responses it completed)
//! sse_load hold  --port P [--connections C]                    (C requests in flight at once)

// A test tool: it stops with the value it did not expect, like the tests that run it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{Arc, Barrier, Mutex},
    time::{Duration, Instant},
};

use inferscope_model::clock::monotonic_now_ns;

/// Where `serve --write-log` appends its lines.
type WriteLog = Option<Arc<Mutex<File>>>;

const STACK: usize = 128 * 1024;

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

fn event(i: u64) -> Vec<u8> {
    let data = format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\" tok{i}\"}}}}],\"created\":1796009965,\"id\":\"chatcmpl-loadgen0000000000000000000000000\",\"model\":\"loadgen\",\"object\":\"chat.completion.chunk\"}}\n\n"
    );
    let mut chunk = format!("{:x}\r\n", data.len()).into_bytes();
    chunk.extend_from_slice(data.as_bytes());
    chunk.extend_from_slice(b"\r\n");
    chunk
}

/// A pause of the stream after its first `after` tokens.
#[derive(Clone, Copy)]
struct Hold {
    pause: Duration,
    after: usize,
}

fn serve(port: u16, tokens: u64, hold: Hold, log: WriteLog) {
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind");
    let events: Arc<Vec<Vec<u8>>> = Arc::new((0..tokens).map(event).collect());
    for stream in listener.incoming().flatten() {
        let events = Arc::clone(&events);
        let log = log.clone();
        let _ = std::thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || serve_connection(stream, &events, hold, log));
    }
}

fn serve_connection(stream: TcpStream, events: &[Vec<u8>], hold: Hold, log: WriteLog) {
    let _ = stream.set_nodelay(true);
    // Reads and writes on the same fd, as servers do (a dup'd fd would be another connection
    // to the agent, which keys connections by fd).
    let mut reader = BufReader::new(&stream);
    let mut writer = &stream;
    loop {
        let mut length = 0usize;
        let mut request_id = String::from("-");
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("x-request-id:") {
                request_id = line["x-request-id:".len()..].trim().to_string();
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        if writer.write_all(head).is_err() {
            return;
        }
        // CLOCK_MONOTONIC just before and just after the first and the last token write.
        let mut first = (0, 0);
        let mut last = (0, 0);
        for (i, e) in events.iter().enumerate() {
            if i == hold.after && !hold.pause.is_zero() {
                std::thread::sleep(hold.pause);
            }
            let before = monotonic_now_ns();
            if writer.write_all(e).is_err() {
                return;
            }
            last = (before, monotonic_now_ns());
            if i == 0 {
                first = last;
            }
        }
        if writer
            .write_all(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            .is_err()
        {
            return;
        }
        if let Some(log) = &log {
            let line = format!(
                "{request_id} {} {} {} {} {}\n",
                events.len(),
                first.0,
                first.1,
                last.0,
                last.1
            );
            // One line per write, whole: the test reads the file while the server runs.
            let _ = log.lock().unwrap().write_all(line.as_bytes());
        }
    }
}

fn request(port: u16, n: u64, with_id: bool) -> Vec<u8> {
    let body = format!(
        "{{\"model\":\"loadgen\",\"messages\":[{{\"role\":\"user\",\"content\":\"request {n}\"}}],\"stream\":true}}"
    );
    let id = if with_id {
        format!("X-Request-Id: load-{n}\r\n")
    } else {
        String::new()
    };
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{id}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads one chunked response to its terminator.
fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let mut tmp = [0u8; 65536];
    loop {
        match stream.read(&mut tmp) {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
        if buf.ends_with(b"\r\n0\r\n\r\n") {
            return true;
        }
    }
}

fn load(port: u16, connections: u64, requests: u64, seconds: u64, rate: u64, with_ids: bool) {
    let start = Instant::now();
    let limit = (seconds > 0).then(|| Duration::from_secs(seconds));
    // With a total rate, each connection sends on its own schedule of rate/connections per s.
    let interval = (rate > 0).then(|| Duration::from_secs_f64(connections as f64 / rate as f64));
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                let _ = stream.set_nodelay(true);
                let mut buf = Vec::new();
                let mut done = 0u64;
                for r in 0..requests {
                    if limit.is_some_and(|l| start.elapsed() >= l) {
                        break;
                    }
                    if let Some(every) = interval {
                        let due = start + every.mul_f64(r as f64);
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                    }
                    stream
                        .write_all(&request(port, c * requests + r, with_ids))
                        .expect("send");
                    if read_response(&mut stream, &mut buf) {
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    let done: u64 = workers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{done} requests in {secs:.3} s: {:.0} requests/s",
        done as f64 / secs
    );
}

fn hold(port: u16, connections: u64) {
    // Every client sends its request and waits at the barrier; the server holds each stream
    // after its first token, so all of them are in flight at once.
    let barrier = Arc::new(Barrier::new(connections as usize + 1));
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            let barrier = Arc::clone(&barrier);
            std::thread::Builder::new()
                .stack_size(STACK)
                .spawn(move || {
                    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok();
                    if let Some(s) = stream.as_mut() {
                        let _ = s.write_all(&request(port, c, false));
                    }
                    barrier.wait();
                    let mut buf = Vec::new();
                    stream.as_mut().is_some_and(|s| read_response(s, &mut buf))
                })
                .expect("spawn")
        })
        .collect();
    barrier.wait();
    println!("{connections} requests sent");
    let done = workers
        .into_iter()
        .map(|w| w.join().unwrap_or(false))
        .filter(|ok| *ok)
        .count();
    println!("{done} responses completed");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port = arg(&args, "--port", 18080) as u16;
    match args.get(1).map(String::as_str) {
        Some("serve") => serve(
            port,
            arg(&args, "--tokens", 32),
            Hold {
                pause: Duration::from_millis(arg(&args, "--hold-ms", 0)),
                after: arg(&args, "--hold-after", 1) as usize,
            },
            args.iter()
                .position(|a| a == "--write-log")
                .and_then(|i| args.get(i + 1))
                .map(|path| Arc::new(Mutex::new(File::create(path).expect("--write-log file")))),
        ),
        Some("load") => load(
            port,
            arg(&args, "--connections", 8),
            arg(&args, "--requests", 1000),
            arg(&args, "--seconds", 0),
            arg(&args, "--rate", 0),
            args.iter().any(|a| a == "--request-ids"),
        ),
        Some("hold") => hold(port, arg(&args, "--connections", 10_000)),
        _ => {
            eprintln!("usage: sse_load serve|load|hold --port P [...]");
            std::process::exit(2);
        }
    }
}
