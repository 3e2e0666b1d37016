//! Losses never blind a connection: after dropped records or lost framing, the tracker
//! settles what was open and decodes the next request it can prove.
use inferscope_common::SyscallKind;
use inferscope_model::Counter;

use crate::correlate::*;

struct Conn {
    t: Tracker,
    out: Vec<RequestRecord>,
    seq: [u32; 2],
    lost_heads: u32,
    ts: u64,
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

fn request(path: &str) -> Vec<u8> {
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    format!(
        "POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn token(text: &str) -> Vec<u8> {
    let event = format!(
        "data: {{\"id\":\"c\",\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    );
    [
        format!("{:x}\r\n", event.len()).as_bytes(),
        event.as_bytes(),
        b"\r\n",
    ]
    .concat()
}

impl Conn {
    fn new() -> Self {
        let mut c = Self {
            t: Tracker::new(Limits {
                max_head_bytes: 1024,
                ..Limits::default()
            }),
            out: Vec::new(),
            seq: [0, 0],
            lost_heads: 0,
            ts: 0,
        };
        let accept = c.event(SyscallKind::Accept, b"", 5);
        c.t.on_accept(&accept, Peer::default(), &mut c.out);
        c
    }

    fn event<'a>(&mut self, kind: SyscallKind, payload: &'a [u8], ret: i64) -> SyscallEvent<'a> {
        self.ts += 10;
        let ev = SyscallEvent {
            kind,
            tgid: 1,
            tid: 2,
            fd: 5,
            ts_enter_ns: self.ts,
            ts_exit_ns: self.ts,
            ret,
            truncated: false,
            copy_failed: false,
            conn_gen: 0,
            conn_flags: 0,
            sock: 0,
            conn_seq: Some(match kind {
                SyscallKind::Read => self.seq[0],
                // A close carries the next write number (and the next read number).
                _ => self.seq[1],
            }),
            read_seq: (kind == SyscallKind::Close).then_some(self.seq[0]),
            lost_heads: self.lost_heads,
            payload,
            more: false,
            chunk_offset: None,
            token: false,
        };
        match kind {
            SyscallKind::Read => self.seq[0] += 1,
            SyscallKind::Write => self.seq[1] += 1,
            // The kernel numbers both directions from 0 after an accept.
            SyscallKind::Accept => self.seq = [0, 0],
            _ => {}
        }
        ev
    }

    fn read(&mut self, bytes: &[u8]) {
        let ev = self.event(SyscallKind::Read, bytes, bytes.len() as i64);
        self.t.on_read(&ev, Peer::default(), &mut self.out);
    }

    fn write(&mut self, bytes: &[u8]) {
        let ev = self.event(SyscallKind::Write, bytes, bytes.len() as i64);
        self.t.on_write(&ev, Peer::default(), &mut self.out);
    }

    /// The kernel dropped `reads` read and `writes` write records of this fd, `heads` of the
    /// writes response heads.
    fn lose(&mut self, reads: u32, writes: u32, heads: u32) {
        self.seq[0] += reads;
        self.seq[1] += writes;
        self.lost_heads += heads;
    }

    fn exchange(&mut self, path: &str, tokens: usize) {
        self.read(&request(path));
        self.write(SSE_HEAD);
        for i in 0..tokens {
            self.write(&token(&format!("t{i}")));
        }
        self.write(b"0\r\n\r\n");
    }

    fn count(&self, counter: Counter) -> u64 {
        self.t.stats().get(counter)
    }
}

#[test]
fn dropped_records_mid_stream_resynchronise_at_the_next_request() {
    let mut c = Conn::new();
    c.exchange("/a", 3);
    c.read(&request("/b"));
    c.write(SSE_HEAD);
    c.write(&token("x"));
    // Lost: the rest of /b, all of /c (read, head, tokens, end).
    c.lose(1, 8, 1);
    c.write(&token("tail of /b"));
    c.write(b"0\r\n\r\n");
    c.exchange("/d", 2);
    let paths: Vec<_> = c.out.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/a", "/b", "/d"], "{:#?}", c.out);
    assert_eq!(c.out[0].incomplete, None);
    assert_eq!(c.out[1].incomplete.as_deref(), Some("events_lost"));
    assert!(!c.out[1].aborted);
    assert_eq!(c.out[1].output_chunks, 1);
    assert_eq!(c.out[2].incomplete, None);
    assert_eq!(c.out[2].output_chunks, 2);
    assert_eq!(c.count(Counter::RequestsLostEventsLost), 1);
    assert_eq!(c.count(Counter::RequestsLost), 1);
    assert_eq!(c.count(Counter::RequestsIncompleteEventsLost), 1);
    // Records plus lost requests: the four the server answered.
    assert_eq!(c.out.len() as u64 + c.count(Counter::RequestsLost), 4);
}

#[test]
fn a_lost_head_of_a_waiting_request_is_counted_not_misattributed() {
    let mut c = Conn::new();
    c.read(&request("/a"));
    // Lost: /a's whole response.
    c.lose(0, 5, 1);
    c.exchange("/b", 1);
    assert_eq!(c.out.len(), 1, "{:#?}", c.out);
    assert_eq!(c.out[0].path, "/b");
    assert_eq!(c.out[0].incomplete, None);
    assert_eq!(c.count(Counter::RequestsLostEventsLost), 1);
}

#[test]
fn a_lost_request_read_leaves_its_answer_counted() {
    let mut c = Conn::new();
    c.exchange("/a", 1);
    c.lose(1, 0, 0); // the read of /b
    c.write(SSE_HEAD);
    c.write(&token("x"));
    c.write(b"0\r\n\r\n");
    c.exchange("/c", 1);
    let paths: Vec<_> = c.out.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/a", "/c"]);
    assert_eq!(c.count(Counter::RequestsLostRequestNotCaptured), 1);
    assert_eq!(c.out.len() as u64 + c.count(Counter::RequestsLost), 3);
}

#[test]
fn a_bad_chunk_no_longer_blinds_the_connection() {
    let mut c = Conn::new();
    c.read(&request("/a"));
    c.write(SSE_HEAD);
    c.write(&token("x"));
    c.write(b"zz\r\nnot a chunk\r\n");
    c.write(&token("y"));
    c.write(b"0\r\n\r\n");
    c.exchange("/b", 2);
    c.exchange("/c", 2);
    let paths: Vec<_> = c.out.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/a", "/b", "/c"]);
    assert_eq!(c.out[0].incomplete.as_deref(), Some("chunk_framing"));
    assert_eq!(c.out[2].incomplete, None);
    assert!(
        c.t.take_ignored().is_empty(),
        "the connection must not be ignored"
    );
    assert_eq!(c.count(Counter::BadChunkSize), 1);
}

#[test]
fn an_oversized_head_is_recorded_incomplete_and_the_next_request_decodes() {
    let mut c = Conn::new();
    c.exchange("/a", 1);
    let huge = format!(
        "POST /big HTTP/1.1\r\nX-Pad: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "p".repeat(2000)
    );
    c.read(huge.as_bytes());
    c.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n");
    c.exchange("/c", 1);
    assert_eq!(c.out.len(), 3, "{:#?}", c.out);
    assert_eq!(c.out[1].incomplete.as_deref(), Some("head_too_large"));
    assert_eq!(c.out[1].status, Some(431));
    assert_eq!(c.out[2].path, "/c");
    assert_eq!(c.out[2].incomplete, None);
}

#[test]
fn requests_open_at_shutdown_are_incomplete_not_aborted() {
    let mut c = Conn::new();
    c.read(&request("/a"));
    c.write(SSE_HEAD);
    c.write(&token("x"));
    assert_eq!(c.t.open_requests(), 1);
    c.t.finish_all(1_000, &mut c.out);
    assert_eq!(c.out.len(), 1);
    assert!(!c.out[0].aborted);
    assert_eq!(c.out[0].incomplete.as_deref(), Some("agent_shutdown"));
    assert_eq!(c.count(Counter::RequestsIncompleteAgentShutdown), 1);
}

/// The ring overflowed after a stream's last seen token: its tail, and its close, may be among
/// what was dropped, with no later record on the connection to show the gap. At shutdown it is
/// a loss (`events_lost`), not an interruption by the agent; a connection active after the loss
/// is still `agent_shutdown`.
#[test]
fn requests_open_at_shutdown_that_went_quiet_before_a_loss_are_events_lost() {
    let mut quiet = Conn::new();
    quiet.read(&request("/a"));
    quiet.write(SSE_HEAD);
    quiet.write(&token("x"));
    quiet.t.note_capture_loss(quiet.ts + 5);
    quiet.t.finish_all(1_000, &mut quiet.out);
    assert_eq!(quiet.out.len(), 1);
    assert!(!quiet.out[0].aborted);
    assert_eq!(quiet.out[0].incomplete.as_deref(), Some("events_lost"));
    assert_eq!(quiet.count(Counter::RequestsIncompleteEventsLost), 1);

    let mut active = Conn::new();
    active.read(&request("/a"));
    active.write(SSE_HEAD);
    active.t.note_capture_loss(active.ts + 5);
    active.write(&token("x"));
    active.t.finish_all(1_000, &mut active.out);
    assert_eq!(active.out[0].incomplete.as_deref(), Some("agent_shutdown"));
}

#[test]
fn a_connection_that_never_spoke_http_is_still_ignored() {
    let mut c = Conn::new();
    c.read(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03");
    // Kept until the server answers: a malformed request answered in HTTP would be a record.
    assert!(c.t.take_ignored().is_empty());
    c.write(b"\x16\x03\x03\x00\x7a\x02\x00\x00\x76\x03\x03");
    assert_eq!(c.t.take_ignored(), vec![(1, 5, 0)]);
    assert!(c.out.is_empty());
}

/// Random losses over a long keep-alive exchange: never a panic, never a connection left dark,
/// and every answered request is a record or a counted loss.
#[test]
fn random_losses_always_reconcile() {
    let mut rng = inferscope_decode::http::testutil::XorShift(0x5eed_1234_abcd);
    for round in 0..200 {
        let mut c = Conn::new();
        let answered = 40;
        for i in 0..answered {
            let path = format!("/r{i}");
            let req = request(&path);
            let mut parts: Vec<Vec<u8>> = vec![req, SSE_HEAD.to_vec()];
            for k in 0..3 {
                parts.push(token(&format!("{k}")));
            }
            parts.push(b"0\r\n\r\n".to_vec());
            for (n, part) in parts.iter().enumerate() {
                if round > 0 && rng.below(12) == 0 {
                    c.lose(u32::from(n == 0), u32::from(n != 0), u32::from(n == 1));
                } else if n == 0 {
                    c.read(part);
                } else {
                    c.write(part);
                }
            }
        }
        // The last request is always seen whole: the connection is not dark.
        c.exchange("/last", 2);
        assert_eq!(c.out.last().map(|r| r.path.as_str()), Some("/last"));
        assert_eq!(
            c.out.len() as u64 + c.count(Counter::RequestsLost),
            answered + 1,
            "round {round}: {} records, lost {}",
            c.out.len(),
            c.count(Counter::RequestsLost)
        );
    }
}

#[test]
fn token_writes_cut_to_a_prefix_still_give_ttft_and_chunk_count() {
    let mut c = Conn::new();
    c.read(&request("/cut"));
    c.write(SSE_HEAD);
    // Behind a filling ring buffer the kernel keeps only the first 16 bytes of each token
    // write (the chunk-size line and the start of the event).
    for i in 0..4 {
        let whole = token(&format!("t{i}"));
        let mut ev = c.event(SyscallKind::Write, &whole[..16], whole.len() as i64);
        ev.truncated = true;
        c.t.on_write(&ev, Peer::default(), &mut c.out);
    }
    c.write(b"0\r\n\r\n");
    assert_eq!(c.out.len(), 1, "{:#?}", c.out);
    let r = &c.out[0];
    assert_eq!(r.incomplete, None);
    assert!(r.capture_truncated);
    assert_eq!(r.output_chunks, 4);
    assert!(r.first_token_mono_ns.is_some() && r.ttft_ms.is_some());
    assert_eq!(c.count(Counter::SseEventsCut), 4);
    assert_eq!(c.count(Counter::SseJsonError), 0);
}

/// A plain (not streamed) answer with `status`.
fn answer(status: u16) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    )
    .into_bytes()
}

#[test]
fn requests_dropped_at_the_waiting_limit_are_lost_requests_and_answers_stay_aligned() {
    let mut c = Conn::new();
    // A pipelining client: 65 requests before any answer; the 65th (/64) finds 64 waiting.
    for i in 0..65 {
        c.read(&request(&format!("/{i}")));
    }
    assert_eq!(c.count(Counter::RequestsWaitingOverLimit), 1);
    c.write(&answer(200));
    // /65 queues behind /1../63, after the dropped /64.
    c.read(&request("/65"));
    for _ in 1..64 {
        c.write(&answer(200));
    }
    c.write(&answer(500)); // /64's answer: skipped, not given to /65
    c.write(&answer(201));
    c.exchange("/after", 1);
    let paths: Vec<_> = c.out.iter().map(|r| r.path.clone()).collect();
    let mut want: Vec<_> = (0..64).map(|i| format!("/{i}")).collect();
    want.extend(["/65".to_string(), "/after".to_string()]);
    assert_eq!(paths, want);
    assert!(c.out[..64].iter().all(|r| r.status == Some(200)));
    assert_eq!(c.out[64].status, Some(201), "/65 got its own answer");
    assert!(c.out.iter().all(|r| r.incomplete.is_none()));
    assert_eq!(c.count(Counter::RequestsLostWaitingOverLimit), 1);
    assert_eq!(c.count(Counter::RequestsLost), 1);
    // Records plus lost requests: the 67 the server answered.
    assert_eq!(c.out.len() as u64 + c.count(Counter::RequestsLost), 67);
}

#[test]
fn a_lost_head_of_a_request_dropped_at_the_waiting_limit_is_counted_once() {
    let mut c = Conn::new();
    for i in 0..66 {
        c.read(&request(&format!("/{i}")));
    }
    assert_eq!(c.count(Counter::RequestsWaitingOverLimit), 2);
    for _ in 0..64 {
        c.write(&answer(200));
    }
    c.write(&answer(500)); // /64's answer, skipped
    // /65's answer (head and body, one write) is dropped by the kernel.
    c.lose(0, 1, 1);
    c.exchange("/after", 1);
    assert_eq!(c.out.len(), 65, "{:#?}", c.out.last());
    assert_eq!(c.out.last().map(|r| r.path.as_str()), Some("/after"));
    assert_eq!(c.count(Counter::RequestsLostWaitingOverLimit), 1);
    assert_eq!(c.count(Counter::RequestsLostEventsLost), 1);
    assert_eq!(c.count(Counter::RequestsLost), 2);
    assert_eq!(c.out.len() as u64 + c.count(Counter::RequestsLost), 67);
}

#[test]
fn answers_on_connections_over_the_table_limit_are_lost_requests() {
    let mut c = Conn::new();
    c.t.set_max_connections(1);
    // A second connection (fd 6) finds the table full: its requests are not tracked.
    let other = |c: &mut Conn, kind: SyscallKind, payload: &[u8]| {
        let mut ev = c.event(kind, payload, payload.len() as i64);
        // fd 5's record numbers stay contiguous.
        match kind {
            SyscallKind::Read => c.seq[0] -= 1,
            _ => c.seq[1] -= 1,
        }
        ev.fd = 6;
        ev.conn_seq = None;
        if kind == SyscallKind::Read {
            c.t.on_read(&ev, Peer::default(), &mut c.out);
        } else {
            c.t.on_write(&ev, Peer::default(), &mut c.out);
        }
    };
    let (req, ans) = (request("/untracked"), answer(200));
    for _ in 0..3 {
        other(&mut c, SyscallKind::Read, &req);
        other(&mut c, SyscallKind::Write, &ans);
    }
    other(&mut c, SyscallKind::Write, b"not a head");
    c.exchange("/tracked", 2);
    assert!(c.count(Counter::ConnectionsOverLimit) >= 7);
    assert_eq!(c.count(Counter::RequestsLostConnectionsOverLimit), 3);
    assert_eq!(c.count(Counter::RequestsLost), 3);
    assert_eq!(c.out.len(), 1);
    assert_eq!(c.out.len() as u64 + c.count(Counter::RequestsLost), 4);
}
