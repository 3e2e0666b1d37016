//! A client mix for vLLM's OpenAI server: streaming chat and completions (`n > 1`, batched
//! prompts), ids from X-Request-Id, the body's `request_id` or generated, long prompts, and
//! clients that go away mid-stream or while their request is still queued. Each client counts
//! what it received; the test joins that to the agent's records and vLLM's own ground truth.
use std::{
    io::{Read, Write},
    net::{Shutdown, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
    /// Completions with `n = 2`.
    CompletionN2,
    /// Completions with three prompts in one request.
    CompletionBatch,
    /// A chat prompt of ~3,000 tokens: its new-request message is ~9 KiB on vLLM's IPC.
    LongChat,
    /// Reads a few tokens, then closes the connection.
    AbortMidStream,
    /// Closes the connection 20 ms after sending, before the engine got to it (under load).
    AbortQueued,
}

/// How the request is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdSource {
    Header(String),
    Body(String),
    Generated,
}

#[derive(Debug, Clone)]
pub struct Job {
    pub kind: Kind,
    pub id: IdSource,
    pub max_tokens: u32,
    /// Words of the prompt (each one token in the test model's vocabulary).
    pub words: usize,
    pub seed: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The stream's `id` (first event), when one arrived.
    pub response_id: Option<String>,
    pub content_events: u64,
    pub done: bool,
    pub aborted_by_client: bool,
}

/// `count` jobs cycling through every kind and id source.
pub fn mix(count: usize, tag: &str) -> Vec<Job> {
    (0..count)
        .map(|i| {
            let (kind, max_tokens, words) = match i % 8 {
                0 => (Kind::Chat, 24, 20 + i % 30),
                1 => (Kind::Completion, 16, 30 + i % 40),
                2 => (Kind::CompletionN2, 12, 25),
                3 => (Kind::CompletionBatch, 10, 15),
                4 => (Kind::LongChat, 32, 3000),
                5 => (Kind::AbortMidStream, 200, 40),
                6 => (Kind::AbortQueued, 64, 60),
                _ => (Kind::Chat, 20, 50 + i % 20),
            };
            let id = match (i % 3, kind) {
                // An abort may leave no stream id: name it.
                (_, Kind::AbortQueued | Kind::AbortMidStream) | (0, _) => {
                    IdSource::Header(format!("{tag}-h{i}"))
                }
                (1, _) => IdSource::Body(format!("{tag}-b{i}")),
                _ => IdSource::Generated,
            };
            Job {
                kind,
                id,
                max_tokens,
                words,
                seed: i,
            }
        })
        .collect()
}

/// `n` words of the test vocabulary, ids 256..9955: 3 bytes each in msgpack, at most 6
/// characters with the space (vLLM refuses prompts over 6 characters per token of context).
fn prompt(words: usize, seed: usize) -> String {
    (0..words)
        .map(|k| format!("w{}", 256 + (seed * 7919 + k * 104_729) % 9_700))
        .collect::<Vec<_>>()
        .join(" ")
}

fn body(job: &Job) -> String {
    let text = prompt(job.words, job.seed);
    let id_field = match &job.id {
        IdSource::Body(id) => format!(r#","request_id":"{id}""#),
        _ => String::new(),
    };
    let common = format!(
        r#""model":"tiny","max_tokens":{},"stream":true,"stream_options":{{"include_usage":true}}{id_field}"#,
        job.max_tokens
    );
    match job.kind {
        Kind::Completion => format!(r#"{{"prompt":"{text}",{common}}}"#),
        Kind::CompletionN2 => format!(r#"{{"prompt":"{text}","n":2,{common}}}"#),
        Kind::CompletionBatch => {
            let p2 = prompt(job.words + 3, job.seed + 1);
            let p3 = prompt(job.words + 7, job.seed + 2);
            format!(r#"{{"prompt":["{text}","{p2}","{p3}"],{common}}}"#)
        }
        _ => format!(r#"{{"messages":[{{"role":"user","content":"{text}"}}],{common}}}"#),
    }
}

fn path(kind: Kind) -> &'static str {
    match kind {
        Kind::Completion | Kind::CompletionN2 | Kind::CompletionBatch => "/v1/completions",
        _ => "/v1/chat/completions",
    }
}

/// Runs one job on a fresh connection.
pub fn run(port: u16, job: &Job) -> Outcome {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting to vLLM");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("read timeout");
    let body = body(job);
    let header = match &job.id {
        IdSource::Header(id) => format!("X-Request-Id: {id}\r\n"),
        _ => String::new(),
    };
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{header}Content-Length: {}\r\n\r\n{body}",
        path(job.kind),
        body.len()
    );
    s.write_all(req.as_bytes()).expect("sending");
    let mut out = Outcome::default();
    if job.kind == Kind::AbortQueued {
        // Traffic shaping: the client leaves while its request waits in the queue.
        std::thread::sleep(Duration::from_millis(20));
        let _ = s.shutdown(Shutdown::Both);
        out.aborted_by_client = true;
        return out;
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        if out.response_id.is_none()
            && let Some(at) = text.find("data: {\"id\":\"")
        {
            let rest = &text[at + 13..];
            out.response_id = rest.split('"').next().map(str::to_owned);
        }
        out.content_events =
            (text.matches("\"content\":\" ").count() + text.matches("\"text\":\" ").count()) as u64;
        // A stream that ended in this read was not left mid-way, however many events it had.
        if text.contains("data: [DONE]") {
            out.done = true;
            break;
        }
        if job.kind == Kind::AbortMidStream && out.content_events >= 3 {
            let _ = s.shutdown(Shutdown::Both);
            out.aborted_by_client = true;
            return out;
        }
    }
    out
}

/// Runs `jobs` from `concurrency` clients; outcomes in job order.
pub fn run_all(port: u16, jobs: &[Job], concurrency: usize) -> Vec<Outcome> {
    let next = Arc::new(Mutex::new(0usize));
    let results = Arc::new(Mutex::new(vec![Outcome::default(); jobs.len()]));
    let jobs = Arc::new(jobs.to_vec());
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, results, jobs) = (next.clone(), results.clone(), jobs.clone());
            std::thread::spawn(move || {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap();
                        let i = *n;
                        *n += 1;
                        i
                    };
                    if i >= jobs.len() {
                        break;
                    }
                    let outcome = run(port, &jobs[i]);
                    results.lock().unwrap()[i] = outcome;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("client thread");
    }
    Arc::try_unwrap(results).unwrap().into_inner().unwrap()
}
