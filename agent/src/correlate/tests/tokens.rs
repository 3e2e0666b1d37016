//! Token events: templates learned per connection and seeded per process, and token records
//! decoded exactly as the full writes they stand for.
use inferscope_common::{CONN_KNOWN, SyscallKind};

use crate::correlate::*;

const CONN_A: u64 = (1 << 63) | 1;
const CONN_B: u64 = (1 << 63) | 2;

fn event(fd: i32, conn_gen: u64, kind: SyscallKind, ts: u64, payload: &[u8]) -> SyscallEvent<'_> {
    SyscallEvent {
        kind,
        tgid: 1,
        tid: 2,
        fd,
        ts_enter_ns: ts,
        ts_exit_ns: ts,
        ret: payload.len() as i64,
        truncated: false,
        copy_failed: false,
        conn_gen,
        conn_flags: CONN_KNOWN,
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

fn chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

/// A vLLM-shaped stream: role event, `tokens`, finish event, `[DONE]`, terminator.
fn response_writes(id: &str, tokens: &[&str]) -> Vec<Vec<u8>> {
    let event = |delta: &str, finish: &str| {
        chunk(&format!(
            "data: {{\"id\":\"chatcmpl-{id}\",\"object\":\"chat.completion.chunk\",\"created\":17000,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
        ))
    };
    let mut writes = vec![
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            .to_vec(),
        event("{\"role\":\"assistant\",\"content\":\"\"}", "null"),
    ];
    for t in tokens {
        writes.push(event(&format!("{{\"content\":\"{t}\"}}"), "null"));
    }
    writes.push(event("{}", "\"stop\""));
    writes.push(chunk("data: [DONE]\n\n"));
    writes.push(b"0\r\n\r\n".to_vec());
    writes
}

const REQUEST: &[u8] =
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\n\r\n{\"stream\":1}\n";

/// One request and its streamed answer on `fd`; writes from index `tokens_from` that `token`
/// says are token events go as payload-free token records, the rest in full.
fn exchange(
    t: &mut Tracker,
    fd: i32,
    conn: u64,
    ts: u64,
    writes: &[Vec<u8>],
    token: impl Fn(usize) -> bool,
) -> Vec<RequestRecord> {
    let mut out = Vec::new();
    let peer = Peer::default();
    t.on_read(
        &event(fd, conn, SyscallKind::Read, ts, REQUEST),
        peer,
        &mut out,
    );
    for (i, w) in writes.iter().enumerate() {
        let ts = ts + 1_000 * (i as u64 + 1);
        let full = event(fd, conn, SyscallKind::Write, ts, w);
        let ev = if token(i) {
            SyscallEvent {
                payload: b"",
                token: true,
                ..full
            }
        } else {
            full
        };
        t.on_write(&ev, peer, &mut out);
    }
    out
}

/// Records without the one field that depends on when the tracker was made.
fn comparable(records: Vec<RequestRecord>) -> Vec<RequestRecord> {
    records
        .into_iter()
        .map(|r| RequestRecord {
            arrival_unix_ns: 0,
            ..r
        })
        .collect()
}

#[test]
fn token_records_decode_as_the_full_writes_they_stand_for() {
    let tokens = ["Hello", ",", " world", "\\n", "!"];
    let mut full = Tracker::new(Limits::default());
    let reference = comparable(exchange(
        &mut full,
        5,
        CONN_A,
        0,
        &response_writes("abc", &tokens),
        |_| false,
    ));
    let mut t = Tracker::new(Limits::default());
    let learned = comparable(exchange(
        &mut t,
        5,
        CONN_A,
        0,
        &response_writes("abc", &tokens),
        |_| false,
    ));
    assert_eq!(learned, reference);
    // One template from the first one-event write; the next ones fit it as it is.
    let updates = t.take_templates();
    assert_eq!(updates.len(), 1, "{updates:#?}");
    assert_eq!(updates[0].tgid, 1);
    for w in &response_writes("abc", &tokens)[2..7] {
        let data = &w[w.iter().position(|&b| b == b'\n').unwrap() + 1..w.len() - 2];
        assert!(updates[0].template.matches(data));
    }
    // The kernel now sends the token writes (indexes 2 to 6) as token records.
    let mut t2 = Tracker::new(Limits::default());
    let summarised = comparable(exchange(
        &mut t2,
        5,
        CONN_A,
        0,
        &response_writes("abc", &tokens),
        |i| (2..7).contains(&i),
    ));
    assert_eq!(summarised, reference);
    assert_eq!(summarised[0].output_chunks, 5);
    assert!(!summarised[0].capture_truncated);
    assert_eq!(summarised[0].response_id.as_deref(), Some("chatcmpl-abc"));
}

#[test]
fn another_response_widens_the_process_template_and_a_new_connection_fits_it() {
    let mut t = Tracker::new(Limits::default());
    exchange(
        &mut t,
        5,
        CONN_A,
        0,
        &response_writes("abc", &["a", "b"]),
        |_| false,
    );
    assert_eq!(t.take_templates().len(), 1);
    // Another id of the same length: the id's bytes become free.
    exchange(
        &mut t,
        5,
        CONN_A,
        100_000,
        &response_writes("xyz", &["a", "b"]),
        |_| false,
    );
    let widened = t.take_templates();
    assert_eq!(widened.len(), 1);
    assert_eq!(
        widened[0]
            .template
            .prefix_mask
            .iter()
            .filter(|&&m| m == 0)
            .count(),
        3
    );
    // The same shape again, the kernel sending the tokens as token records: nothing new.
    exchange(
        &mut t,
        5,
        CONN_A,
        200_000,
        &response_writes("qrs", &["a", "b"]),
        |i| (2..4).contains(&i),
    );
    assert!(t.take_templates().is_empty());
    // A new connection of the process fits the process's template: nothing new to install
    // (the kernel gives the connection its copy at the stream's head).
    let writes = response_writes("new", &["c", "d", "e"]);
    let records = exchange(&mut t, 7, CONN_B, 300_000, &writes, |i| (3..5).contains(&i));
    assert!(t.take_templates().is_empty());
    assert_eq!(
        (records[0].output_chunks, records[0].capture_truncated),
        (3, false)
    );
}

#[test]
fn connections_the_kernel_does_not_know_learn_nothing() {
    let mut t = Tracker::new(Limits::default());
    exchange(
        &mut t,
        5,
        0,
        0,
        &response_writes("abc", &["a", "b"]),
        |_| false,
    );
    assert!(t.take_templates().is_empty());
}

#[test]
fn a_token_record_out_of_step_is_a_loss_not_a_token() {
    let mut t = Tracker::new(Limits::default());
    let writes = response_writes("abc", &["a", "b"]);
    // Half of an event was written, then a token record: user space's view of the stream
    // says no event can start there (the kernel's says one whole chunk did).
    let mut parts: Vec<Vec<u8>> = writes[..2].to_vec();
    parts.push(writes[2][..20].to_vec());
    parts.push(writes[2][20..].to_vec());
    let mut out = exchange(&mut t, 5, CONN_A, 0, &parts, |i| i == 3);
    let close = SyscallEvent {
        ret: 0,
        ..event(5, CONN_A, SyscallKind::Close, 100_000, b"")
    };
    t.on_close(&close, &mut out);
    assert_eq!(out.len(), 1, "{out:#?}");
    // Counted as a cut event (an output chunk of unknown content), as for bytes the kernel
    // cut behind a filling ring, and said on the record.
    assert_eq!(out[0].output_chunks, 1, "{out:#?}");
    assert!(out[0].capture_truncated, "{out:#?}");
    assert_eq!(t.stats().get(Counter::TokenEventsOutOfStep), 1);
    assert_eq!(t.stats().get(Counter::SseEventsCut), 1);
}
