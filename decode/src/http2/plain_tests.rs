//! Plain (not gRPC) HTTP/2 streams: OpenAI-style requests answered with server-sent events,
//! JSON lines or one JSON document inside DATA frames, however the frames and syscalls cut them.

use inferscope_model::Stats;

use super::{frame::kind, testwire::*, *};
use crate::http::{Chunk, Usage};

const REQUEST_BODY: &str =
    r#"{"model":"m1","stream":true,"max_tokens":7,"messages":[{"role":"user","content":"hello"}]}"#;

fn request_block(path: &str, content_type: Option<&str>, id: &str) -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    b.extend(indexed_name(4, path));
    if let Some(ct) = content_type {
        b.extend(indexed_name(31, ct));
    }
    b.extend(literal("x-request-id", id));
    b.extend(literal(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ));
    b
}

fn response_block(content_type: &str) -> Vec<u8> {
    let mut b = vec![0x88];
    b.extend(indexed_name(31, content_type));
    b
}

fn sse_event(id: &str, content: &str) -> String {
    format!(
        "data: {{\"id\":\"{id}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

fn sse_tail(id: &str) -> String {
    format!(
        "data: {{\"id\":\"{id}\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":7}}}}\n\ndata: [DONE]\n\n"
    )
}

/// One syscall each: what the client and the server wrote, in order.
enum Write {
    Client(Vec<u8>),
    Server(Vec<u8>),
}

/// Two streams on one connection, both answered with SSE whose events the server cuts across
/// DATA frames at odd places, interleaved; stream 3 is a GET without a content-type.
fn two_streams() -> Vec<Write> {
    let mut w = Vec::new();
    let mut hello = PREFACE.to_vec();
    hello.extend(settings(None));
    hello.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &request_block("/v1/chat/completions", Some("application/json"), "r1"),
    ));
    let body = REQUEST_BODY.as_bytes();
    hello.extend(frame(kind::DATA, 0, 1, &body[..30]));
    w.push(Write::Client(hello));
    w.push(Write::Client(frame(kind::DATA, END_STREAM, 1, &body[30..])));
    w.push(Write::Client(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &request_block("/v1/events", None, "r3"),
    )));
    w.push(Write::Server(settings(None)));
    w.push(Write::Server(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &response_block("text/event-stream"),
    )));
    w.push(Write::Server(frame(
        kind::HEADERS,
        END_HEADERS,
        3,
        &response_block("text/event-stream; charset=utf-8"),
    )));
    for i in 0..7 {
        let one = sse_event("cmpl-1", &format!("t{i}"));
        let three = sse_event("cmpl-3", &format!("u{i}"));
        // Stream 1: each event in two DATA frames cut mid-line; stream 3: one frame each.
        let (a, b) = one.as_bytes().split_at(11 + i);
        w.push(Write::Server(frame(kind::DATA, 0, 1, a)));
        w.push(Write::Server(frame(kind::DATA, 0, 3, three.as_bytes())));
        w.push(Write::Server(frame(kind::DATA, 0, 1, b)));
    }
    w.push(Write::Server(frame(
        kind::DATA,
        END_STREAM,
        1,
        sse_tail("cmpl-1").as_bytes(),
    )));
    w.push(Write::Server(frame(
        kind::DATA,
        END_STREAM,
        3,
        b"data: [DONE]\n\n",
    )));
    w
}

struct Run {
    conn: Http2Connection,
    stats: Stats,
    out: Vec<StreamSummary>,
}

impl Run {
    fn new() -> Self {
        Self {
            conn: Http2Connection::new(Limits::default(), Start::Fresh),
            stats: Stats::default(),
            out: Vec::new(),
        }
    }

    fn feed(&mut self, side: Side, bytes: &[u8], lost: u64, ts_ns: u64) {
        let chunk = Chunk { bytes, lost, ts_ns };
        self.conn.feed(side, chunk, &mut self.stats, &mut self.out);
    }

    /// Each write as one syscall at 10 ns steps, or cut into syscalls of `piece` bytes.
    fn play(&mut self, writes: &[Write], piece: usize) {
        for (i, w) in writes.iter().enumerate() {
            let (side, bytes) = match w {
                Write::Client(b) => (Side::Client, b),
                Write::Server(b) => (Side::Server, b),
            };
            for part in bytes.chunks(piece.max(1)) {
                self.feed(side, part, 0, (i as u64 + 1) * 10);
            }
        }
    }

    fn stream(&self, id: u32) -> &StreamSummary {
        self.out
            .iter()
            .find(|s| s.stream_id == id)
            .expect("the stream ended")
    }
}

#[test]
fn sse_inside_data_frames_gives_every_token_however_it_is_cut() {
    let writes = two_streams();
    for piece in [1, 2, 7, 64, usize::MAX] {
        let mut run = Run::new();
        run.play(&writes, piece);
        assert_eq!(run.out.len(), 2, "cut every {piece} bytes");
        let one = run.stream(1);
        assert_eq!(one.response.count, 7, "cut every {piece} bytes");
        assert!(!one.response.framing_lost && !one.request.framing_lost);
        let exchange = one.exchange.as_deref().expect("a plain stream");
        assert!(exchange.streamed);
        assert_eq!(exchange.response.id.as_deref(), Some("cmpl-1"));
        assert_eq!(
            exchange.response.usage,
            Some(Usage {
                prompt_tokens: Some(9),
                completion_tokens: Some(7),
                cached_tokens: None,
            })
        );
        assert_eq!(exchange.request.model.as_deref(), Some("m1"));
        assert_eq!(exchange.request.stream, Some(true));
        assert_eq!(exchange.request.max_tokens, Some(7));
        assert_eq!(exchange.request.prompt_bytes, Some(5));
        assert_eq!(exchange.events_unparsed, 0);
        assert_eq!(
            one.traceparent,
            Value::Known("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into())
        );
        // Each event ends with its second frame: writes 8, 11, 14, ... (ts 10 per write).
        assert_eq!(one.response.first_ts_ns, Some(90));
        assert_eq!(one.response.last_ts_ns, Some(270));
        assert_eq!(one.response.gaps_ns, vec![30; 6]);

        let three = run.stream(3);
        assert_eq!(three.response.count, 7, "a GET's SSE is not read as gRPC");
        assert!(!three.response.framing_lost);
        assert_eq!(
            three
                .exchange
                .as_deref()
                .and_then(|e| e.response.id.as_deref()),
            Some("cmpl-3")
        );
        assert_eq!(run.conn.held_bytes(), 0, "nothing held once both ended");
    }
}

#[test]
fn json_lines_and_one_json_document_are_read_too() {
    let mut w = Vec::new();
    let mut hello = PREFACE.to_vec();
    hello.extend(settings(None));
    for (id, path) in [(1, "/api/generate"), (3, "/v1/completions")] {
        hello.extend(frame(
            kind::HEADERS,
            END_HEADERS,
            id,
            &request_block(path, Some("application/json"), "x"),
        ));
        hello.extend(frame(
            kind::DATA,
            END_STREAM,
            id,
            br#"{"model":"m2","prompt":"abc"}"#,
        ));
    }
    w.push(Write::Client(hello));
    w.push(Write::Server(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &response_block("application/x-ndjson"),
    )));
    for i in 0..4 {
        let line = format!("{{\"model\":\"m2\",\"response\":\"w{i}\",\"done\":false}}\n");
        w.push(Write::Server(frame(kind::DATA, 0, 1, line.as_bytes())));
    }
    let last = br#"{"response":"","done":true,"prompt_eval_count":3,"eval_count":4}"#;
    w.push(Write::Server(frame(kind::DATA, END_STREAM, 1, last)));
    w.push(Write::Server(frame(
        kind::HEADERS,
        END_HEADERS,
        3,
        &response_block("application/json"),
    )));
    let doc = br#"{"id":"cmpl-d","choices":[{"text":"abc","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
    let (a, b) = doc.split_at(40);
    w.push(Write::Server(frame(kind::DATA, 0, 3, a)));
    w.push(Write::Server(frame(kind::DATA, END_STREAM, 3, b)));
    for piece in [1, 5, usize::MAX] {
        let mut run = Run::new();
        run.play(&w, piece);
        let lines = run.stream(1);
        assert_eq!(
            lines.response.count, 4,
            "an NDJSON line without its newline at the end"
        );
        let e = lines.exchange.as_deref().unwrap();
        assert!(e.streamed);
        assert_eq!(
            e.response.usage,
            Some(Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(4),
                cached_tokens: None,
            })
        );
        assert_eq!(e.request.model.as_deref(), Some("m2"));
        assert_eq!(e.request.prompt_bytes, Some(3));
        let document = run.stream(3);
        assert_eq!(document.response.count, 0, "not streamed: no token events");
        let e = document.exchange.as_deref().unwrap();
        assert!(!e.streamed && e.response.content && !e.response.json_error);
        assert_eq!(e.response.id.as_deref(), Some("cmpl-d"));
        assert_eq!(run.conn.held_bytes(), 0);
    }
}

#[test]
fn lost_bytes_inside_an_event_count_one_lost_token() {
    let mut run = Run::new();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/v1/events", None, "r"),
    ));
    run.feed(Side::Client, &hello, 0, 1);
    let mut head = frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &response_block("text/event-stream"),
    );
    head.extend(frame(kind::DATA, 0, 1, sse_event("c", "a").as_bytes()));
    run.feed(Side::Server, &head, 0, 2);
    // A DATA frame whose payload the capture cut after 12 bytes.
    let event = sse_event("c", "b");
    let whole = frame(kind::DATA, 0, 1, event.as_bytes());
    run.feed(Side::Server, &whole[..9 + 12], (event.len() - 12) as u64, 3);
    run.feed(
        Side::Server,
        &frame(kind::DATA, END_STREAM, 1, sse_event("c", "c").as_bytes()),
        0,
        4,
    );
    let s = run.stream(1);
    assert_eq!(s.response.count, 3);
    assert_eq!(
        (s.response.first_ts_ns, s.response.last_ts_ns),
        (Some(2), Some(4))
    );
    let e = s.exchange.as_deref().unwrap();
    assert!(e.response.truncated, "the record says the capture was cut");
    assert!(!s.response.framing_lost, "HTTP/2 framing held");
}

#[test]
fn many_large_request_bodies_at_once_stay_within_the_connections_budget() {
    let mut run = Run::new();
    let mut hello = PREFACE.to_vec();
    hello.extend(settings(None));
    run.feed(Side::Client, &hello, 0, 1);
    let chunk = vec![b' '; 16_000];
    let streams: Vec<u32> = (0..100).map(|i| 1 + 2 * i).collect();
    for &id in &streams {
        let mut w = frame(
            kind::HEADERS,
            END_HEADERS,
            id,
            &request_block("/v1/chat/completions", Some("application/json"), "r"),
        );
        w.extend(frame(kind::DATA, 0, id, b"{\"model\":\"m\","));
        for _ in 0..3 {
            w.extend(frame(kind::DATA, 0, id, &chunk));
        }
        run.feed(Side::Client, &w, 0, 2);
        assert!(run.conn.held_bytes() <= MAX_HELD_BYTES);
    }
    assert!(
        run.conn.held_bytes() > MAX_HELD_BYTES / 2,
        "bodies are held"
    );
    for &id in &streams {
        let mut w = frame(kind::DATA, END_STREAM, id, b"\"prompt\":\"p\"}");
        w.extend(frame(kind::RST_STREAM, 0, id, &8u32.to_be_bytes()));
        run.feed(Side::Client, &w, 0, 3);
    }
    assert_eq!(run.out.len(), 100);
    let parsed = run
        .out
        .iter()
        .filter(|s| {
            s.exchange
                .as_deref()
                .is_some_and(|e| e.request.model.as_deref() == Some("m"))
        })
        .count();
    let truncated = run
        .out
        .iter()
        .filter(|s| {
            s.exchange
                .as_deref()
                .is_some_and(|e| e.request.body_truncated)
        })
        .count();
    assert_eq!(parsed + truncated, 100);
    assert!(
        parsed >= 15 && truncated > 0,
        "{parsed} parsed, {truncated} truncated"
    );
    assert_eq!(run.conn.held_bytes(), 0, "every byte given back");
}

/// A connection joined mid-way: header blocks refer to HPACK entries never seen, so neither
/// side's content-type is known. The first DATA bytes tell a gRPC message (flag byte 0) from
/// JSON and server-sent events, so neither is misread as the other.
#[test]
fn unknown_content_types_are_told_apart_by_the_first_body_bytes() {
    let mut run = Run {
        conn: Http2Connection::new(Limits::default(), Start::MidConnection),
        stats: Stats::default(),
        out: Vec::new(),
    };
    // :method POST, :scheme http, then two dynamic entries the agent never saw.
    let unknown_block = [0x83, 0x86, 0xbe, 0xbf];
    let mut client = frame(kind::HEADERS, END_HEADERS, 41, &unknown_block);
    client.extend(frame(kind::DATA, END_STREAM, 41, REQUEST_BODY.as_bytes()));
    client.extend(frame(kind::HEADERS, END_HEADERS, 43, &unknown_block));
    client.extend(frame(kind::DATA, END_STREAM, 43, &grpc_message(12)));
    run.feed(Side::Client, &client, 0, 1);
    let mut server = frame(kind::HEADERS, END_HEADERS, 41, &[0x88, 0xbe]);
    server.extend(frame(kind::HEADERS, END_HEADERS, 43, &[0x88, 0xbe]));
    run.feed(Side::Server, &server, 0, 2);
    for i in 0..5 {
        let mut w = frame(kind::DATA, 0, 41, sse_event("cmpl-m", "x").as_bytes());
        w.extend(frame(kind::DATA, 0, 43, &grpc_message(3 + i)));
        run.feed(Side::Server, &w, 0, 3 + i as u64);
    }
    let mut end = frame(kind::DATA, END_STREAM, 41, sse_tail("cmpl-m").as_bytes());
    end.extend(frame(kind::HEADERS, END_HEADERS | END_STREAM, 43, &[0xbf]));
    run.feed(Side::Server, &end, 0, 9);

    let sse = run.stream(41);
    assert_eq!(sse.path, Value::Unknown, "never guessed");
    assert_eq!(sse.response.count, 5);
    assert!(!sse.response.framing_lost && !sse.request.framing_lost);
    let e = sse.exchange.as_deref().expect("read as a plain stream");
    assert!(e.streamed);
    assert_eq!(e.response.id.as_deref(), Some("cmpl-m"));
    assert_eq!(e.request.model.as_deref(), Some("m1"));
    let grpc = run.stream(43);
    assert!(grpc.exchange.is_none());
    assert_eq!((grpc.request.count, grpc.response.count), (1, 5));
    assert!(!grpc.response.framing_lost);
}
