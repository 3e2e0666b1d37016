//! The connection tracker's own checks: requests, responses and connections, record by record.
use inferscope_common::SyscallKind;

use crate::correlate::*;

fn ev(kind: SyscallKind, ts: u64, payload: &[u8]) -> SyscallEvent<'_> {
    SyscallEvent {
        kind,
        tgid: 1,
        tid: 2,
        fd: 5,
        ts_enter_ns: ts,
        ts_exit_ns: ts,
        ret: payload.len() as i64,
        truncated: false,
        copy_failed: false,
        conn_gen: 0,
        conn_flags: 0,
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

fn close(ts: u64) -> SyscallEvent<'static> {
    SyscallEvent {
        ret: 0,
        ..ev(SyscallKind::Close, ts, b"")
    }
}

#[test]
fn a_process_serving_http2_is_handed_to_capture_once() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    t.on_read(
        &ev(SyscallKind::Read, 5, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        peer,
        &mut out,
    );
    assert!(t.take_http2_servers().is_empty(), "HTTP/1.1 is not HTTP/2");
    let h2 = |fd, ts| SyscallEvent {
        fd,
        ..ev(SyscallKind::Read, ts, inferscope_decode::http2::PREFACE)
    };
    t.on_read(&h2(6, 10), peer, &mut out);
    t.on_read(&h2(7, 20), peer, &mut out);
    assert_eq!(t.take_http2_servers(), vec![1]);
    assert!(t.take_http2_servers().is_empty());
    // Gone and back (a pid reused): handed over again.
    t.forget_process(1, 30, &mut out);
    t.on_read(&h2(8, 40), peer, &mut out);
    assert_eq!(t.take_http2_servers(), vec![1]);
}

#[test]
fn head_then_get_on_one_connection() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    t.on_read(
        &ev(
            SyscallKind::Read,
            10,
            b"HEAD /x HTTP/1.1\r\nHost: a\r\n\r\n",
        ),
        peer,
        &mut out,
    );
    t.on_write(
        &ev(
            SyscallKind::Write,
            20,
            b"HTTP/1.1 200 OK\r\nContent-Length: 900\r\n\r\n",
        ),
        peer,
        &mut out,
    );
    t.on_read(
        &ev(SyscallKind::Read, 30, b"GET /y HTTP/1.1\r\nHost: a\r\n\r\n"),
        peer,
        &mut out,
    );
    t.on_write(
        &ev(
            SyscallKind::Write,
            40,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ),
        peer,
        &mut out,
    );
    assert_eq!(out.len(), 2, "{out:#?}");
    assert_eq!((out[0].method.as_str(), out[0].aborted), ("HEAD", false));
    assert_eq!((out[1].path.as_str(), out[1].aborted), ("/y", false));
    assert_eq!(out[1].seq_on_connection, 1);
}

#[test]
fn a_body_delimited_by_close_ends_complete() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    t.on_read(
        &ev(SyscallKind::Read, 10, b"GET /z HTTP/1.1\r\nHost: a\r\n\r\n"),
        peer,
        &mut out,
    );
    t.on_write(
        &ev(
            SyscallKind::Write,
            20,
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"id\":\"cmpl-1\"}",
        ),
        peer,
        &mut out,
    );
    assert!(out.is_empty());
    t.on_close(&close(30), &mut out);
    assert_eq!(out.len(), 1);
    assert!(!out[0].aborted);
    assert_eq!(out[0].response_id.as_deref(), Some("cmpl-1"));
    assert_eq!(out[0].end_mono_ns, 30);
}

#[test]
fn a_stream_cut_by_the_client_is_aborted_and_a_half_read_request_is_not_invented() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    t.on_read(&ev(SyscallKind::Read, 10, req.as_bytes()), peer, &mut out);
    t.on_write(&ev(SyscallKind::Write, 20, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"), peer, &mut out);
    let event = b"data: {\"id\":\"c-9\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let chunk = [format!("{:x}\r\n", event.len()).as_bytes(), event, b"\r\n"].concat();
    t.on_write(&ev(SyscallKind::Write, 30, &chunk), peer, &mut out);
    // EPIPE on the next write: the client is gone.
    t.on_write(
        &SyscallEvent {
            ret: -32,
            ..ev(SyscallKind::Write, 40, b"")
        },
        peer,
        &mut out,
    );
    assert_eq!(out.len(), 1);
    assert!(out[0].aborted);
    assert_eq!(out[0].output_chunks, 1);
    assert_eq!(out[0].ttft_ms, Some(20e-6));
    // Half a request, then close: no record.
    t.on_read(
        &ev(
            SyscallKind::Read,
            50,
            b"POST /v1/chat/completions HTTP/1.1\r\nContent-Le",
        ),
        peer,
        &mut out,
    );
    t.on_close(&close(60), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(t.stats().get(Counter::RequestsUnread), 1);
}

fn stream_request() -> Vec<u8> {
    let body = r#"{"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn requests_drained_after_the_servers_shutdown_are_ended_by_the_server() {
    // llama.cpp's HTTP server shuts a connection down after a stream, drains what the
    // client sent meanwhile, and closes: the client's EOF answers the server's, and the
    // drained request was never going to be answered.
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    t.on_read(
        &ev(SyscallKind::Read, 10, &stream_request()),
        peer,
        &mut out,
    );
    let body = b"data: [DONE]\n\n";
    let response = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .as_slice(),
        format!("{:x}\r\n", body.len()).as_bytes(),
        body,
        b"\r\n0\r\n\r\n",
    ]
    .concat();
    t.on_write(&ev(SyscallKind::Write, 20, &response), peer, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ended_by, EndedBy::Complete);
    t.on_shutdown(&SyscallEvent {
        ret: 1,
        ..ev(SyscallKind::Shutdown, 21, b"")
    });
    t.on_read(
        &ev(
            SyscallKind::Read,
            22,
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        peer,
        &mut out,
    );
    t.on_read(
        &SyscallEvent {
            ret: 0,
            ..ev(SyscallKind::Read, 23, b"")
        },
        peer,
        &mut out,
    );
    t.on_close(&close(24), &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1].path, "/health");
    assert_eq!(out[1].ended_by, EndedBy::Server);
    assert!(!out[1].aborted);
    assert_eq!(t.stats().get(Counter::RequestsAfterServerShutdown), 1);
    assert_eq!(t.stats().get(Counter::RequestsAborted), 0);
}

fn state(old: i32, new: i32, ts_ns: u64) -> SockState {
    SockState {
        ts_ns,
        sock: 0x77,
        local_port: 8080,
        old_state: old as u8,
        new_state: new as u8,
    }
}

const ESTABLISHED: i32 = 1;
const LAST_ACK: i32 = 9;
const PLAIN_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

/// A request read, the client's FIN, then the server's whole answer (a write that
/// succeeds into the half-closed socket).
fn answered_after_fin(t: &mut Tracker, out: &mut Vec<RequestRecord>) -> Peer {
    let peer = Peer {
        sock: 0x77,
        ..Peer::default()
    };
    t.on_read(
        &ev(SyscallKind::Read, 10, b"GET /q HTTP/1.1\r\nHost: a\r\n\r\n"),
        peer,
        out,
    );
    t.on_sock_state(&state(ESTABLISHED, inferscope_common::TCP_CLOSE_WAIT, 500));
    t.on_write(&ev(SyscallKind::Write, 900, PLAIN_ANSWER), peer, out);
    peer
}

#[test]
fn an_answer_written_after_the_client_left_and_reset_is_aborted_at_its_fin() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = answered_after_fin(&mut t, &mut out);
    // Held: whether the client reads it shows only when the socket ends.
    assert!(out.is_empty(), "{out:#?}");
    // Its reset (CLOSE_WAIT → CLOSE before the server's close): it never read it.
    t.on_sock_state(&state(
        inferscope_common::TCP_CLOSE_WAIT,
        inferscope_common::TCP_CLOSE,
        901,
    ));
    t.on_read(
        &SyscallEvent {
            ret: -32,
            ..ev(SyscallKind::Read, 950, b"")
        },
        peer,
        &mut out,
    );
    t.on_close(&close(960), &mut out);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].ended_by, EndedBy::Client);
    assert!(out[0].aborted);
    assert_eq!(out[0].status, Some(200), "what the server wrote is kept");
    assert_eq!(out[0].end_mono_ns, 500, "ended at the client's FIN");
    assert_eq!(t.stats().get(Counter::RequestsAnsweredAfterClientLeft), 1);
    assert!(t.peer_closes.is_empty());
}

#[test]
fn a_half_closed_client_that_reads_the_answer_is_complete() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = answered_after_fin(&mut t, &mut out);
    t.on_read(
        &SyscallEvent {
            ret: 0,
            ..ev(SyscallKind::Read, 950, b"")
        },
        peer,
        &mut out,
    );
    // The server closes first (CLOSE_WAIT → LAST_ACK), the client's ACK ends the socket.
    t.on_close(&close(960), &mut out);
    t.on_sock_state(&state(LAST_ACK, inferscope_common::TCP_CLOSE, 961));
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].ended_by, EndedBy::Complete);
    assert_eq!(out[0].end_mono_ns, 900);
    assert_eq!(t.stats().get(Counter::RequestsAborted), 0);
}

#[test]
fn an_answer_begun_before_the_fin_stays_complete() {
    // A stream's client that closes after its last event, before the terminating chunk.
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer {
        sock: 0x77,
        ..Peer::default()
    };
    t.on_read(
        &ev(SyscallKind::Read, 10, &stream_request()),
        peer,
        &mut out,
    );
    let body = b"data: [DONE]\n\n";
    let head_and_event = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .as_slice(),
        format!("{:x}\r\n", body.len()).as_bytes(),
        body,
        b"\r\n",
    ]
    .concat();
    t.on_write(&ev(SyscallKind::Write, 20, &head_and_event), peer, &mut out);
    t.on_sock_state(&state(ESTABLISHED, inferscope_common::TCP_CLOSE_WAIT, 30));
    t.on_write(&ev(SyscallKind::Write, 40, b"0\r\n\r\n"), peer, &mut out);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].ended_by, EndedBy::Complete);
}

#[test]
fn a_reset_seen_before_the_answer_is_processed_still_counts() {
    // On loopback the client's reset is handled inside the server's write, so its state
    // change can come through the ring before the write's own record.
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer {
        sock: 0x77,
        ..Peer::default()
    };
    t.on_read(
        &ev(SyscallKind::Read, 10, b"GET /q HTTP/1.1\r\nHost: a\r\n\r\n"),
        peer,
        &mut out,
    );
    t.on_sock_state(&state(ESTABLISHED, inferscope_common::TCP_CLOSE_WAIT, 500));
    t.on_sock_state(&state(
        inferscope_common::TCP_CLOSE_WAIT,
        inferscope_common::TCP_CLOSE,
        901,
    ));
    t.on_write(&ev(SyscallKind::Write, 900, PLAIN_ANSWER), peer, &mut out);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].ended_by, EndedBy::Client);
    assert_eq!(out[0].end_mono_ns, 500);
}

#[test]
fn a_socket_that_ends_leaves_no_arrivals_for_the_next_at_its_address() {
    let mut t = Tracker::new(Limits::default());
    t.on_segment(&Segment {
        ts_ns: 100,
        local_port: 8080,
        remote: "127.0.0.1".parse().unwrap(),
        remote_port: 40000,
        data_len: 60,
        sock: 0x77,
    });
    assert!(!t.arrivals.is_empty());
    // Reset before the server ever accepted it: its segments are nobody's.
    t.on_sock_state(&state(ESTABLISHED, inferscope_common::TCP_CLOSE, 200));
    assert!(t.arrivals.is_empty());
}

#[test]
fn a_stream_the_server_cuts_is_ended_by_the_server_not_aborted() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    t.on_read(
        &ev(SyscallKind::Read, 10, &stream_request()),
        peer,
        &mut out,
    );
    t.on_write(&ev(SyscallKind::Write, 20, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"), peer, &mut out);
    let event = b"data: {\"id\":\"c-1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    let chunk = [format!("{:x}\r\n", event.len()).as_bytes(), event, b"\r\n"].concat();
    t.on_write(&ev(SyscallKind::Write, 30, &chunk), peer, &mut out);
    // The server closes before the last chunk: its cut, not the client's.
    t.on_close(&close(40), &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ended_by, EndedBy::Server);
    assert!(!out[0].aborted);
    assert_eq!(out[0].output_chunks, 1);
    assert_eq!(t.stats().get(Counter::RequestsCutByServer), 1);
    assert_eq!(t.stats().get(Counter::RequestsAborted), 0);
}

#[test]
fn a_malformed_request_the_server_answers_is_recorded_and_one_it_ignores_is_not() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    let head = b"POST /completion HTTP/1.1\r\nContent-Length: zz\r\n\r\n";
    t.on_read(&ev(SyscallKind::Read, 10, head), peer, &mut out);
    let answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno";
    t.on_write(&ev(SyscallKind::Write, 20, answer), peer, &mut out);
    t.on_close(&close(30), &mut out);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert!(out[0].request_unparsed);
    assert_eq!(out[0].status, Some(400));
    assert_eq!(out[0].ended_by, EndedBy::Complete);
    assert_eq!(out[0].response_bytes, answer.len() as u64);
    // The same bytes, never answered: nothing invented.
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    t.on_read(&ev(SyscallKind::Read, 10, head), peer, &mut out);
    t.on_close(&close(30), &mut out);
    assert!(out.is_empty(), "{out:#?}");
    assert_eq!(t.stats().get(Counter::RequestsUnparsedUnanswered), 1);
}

#[test]
fn a_reused_socket_address_does_not_lend_its_old_segments_to_a_new_connection() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let sock = 0xffff_8880_1234_5600;
    let conn = inferscope_common::CONN_ID_BIT | 300;
    let flags = inferscope_common::CONN_KNOWN | inferscope_common::CONN_INET;
    let on = |e: SyscallEvent<'static>| SyscallEvent {
        conn_gen: conn,
        conn_flags: flags,
        sock,
        ..e
    };
    let segment = |ts_ns| Segment {
        ts_ns,
        local_port: 8080,
        remote: "127.0.0.1".parse().unwrap(),
        remote_port: 40000,
        data_len: 60,
        sock,
    };
    // A connection the agent never tracked sent bytes on this socket address 5 s ago.
    let second = 1_000_000_000u64;
    t.on_segment(&segment(10 * second));
    // A new connection with the same address: accepted at 15 s, its bytes came 20 ms
    // before the accept.
    t.on_segment(&segment(15 * second - 20_000_000));
    let peer = Peer {
        sock,
        ..Peer::default()
    };
    let mut accept = on(ev(SyscallKind::Accept, 15 * second, b""));
    accept.ret = 10;
    t.on_accept(&accept, peer, &mut out);
    t.on_read(
        &on(ev(
            SyscallKind::Read,
            15 * second + 1_000,
            b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n",
        )),
        peer,
        &mut out,
    );
    t.on_write(
        &on(ev(
            SyscallKind::Write,
            15 * second + 2_000,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        )),
        peer,
        &mut out,
    );
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(out[0].arrival_wire_mono_ns, Some(15 * second - 20_000_000));
}

/// A TLS connection's first request: the segments before the handshake's end are the
/// handshake's (ClientHello, the client's key exchange), except with TLS 1.3 the last one
/// when the request came right behind the client's Finished.
#[test]
fn a_tls_requests_wire_arrival_is_its_segment_not_the_handshakes() {
    let run = |segments: &[u64], handshake_ns: u64| {
        let mut t = Tracker::new(Limits::default());
        let mut out = Vec::new();
        let sock = 0xffff_8880_1234_5600;
        let flags = inferscope_common::CONN_KNOWN
            | inferscope_common::CONN_INET
            | inferscope_common::CONN_TLS;
        let on = |e: SyscallEvent<'static>| SyscallEvent {
            conn_gen: inferscope_common::CONN_ID_BIT | 300,
            conn_flags: flags,
            sock,
            ..e
        };
        for &ts_ns in segments {
            t.on_segment(&Segment {
                ts_ns,
                local_port: 8443,
                remote: "127.0.0.1".parse().unwrap(),
                remote_port: 40000,
                data_len: 300,
                sock,
            });
        }
        let peer = Peer {
            sock,
            tls: true,
            ..Peer::default()
        };
        let mut accept = on(ev(SyscallKind::Accept, 1_000, b""));
        accept.ret = 10;
        t.on_accept(&accept, peer, &mut out);
        let mut done = on(ev(SyscallKind::Tls, handshake_ns, b""));
        done.ret = 1;
        t.on_tls_handshake(&done);
        let get = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n";
        t.on_read(&on(ev(SyscallKind::Read, 50_000, get)), peer, &mut out);
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        t.on_write(&on(ev(SyscallKind::Write, 60_000, ok)), peer, &mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        assert!(out[0].tls);
        out[0].arrival_wire_mono_ns
    };
    // TLS 1.2: ClientHello, key exchange; the server's Finished ends its handshake; then
    // the request.
    assert_eq!(run(&[2_000, 10_000, 30_000], 20_000), Some(30_000));
    // TLS 1.3: ClientHello; the client's Finished and the request, both read before the
    // server's handshake ended.
    assert_eq!(run(&[2_000, 18_000, 18_500], 20_000), Some(18_500));
    // TLS 1.3, the request behind the handshake's end.
    assert_eq!(run(&[2_000, 18_000, 25_000], 20_000), Some(25_000));
}

#[test]
fn the_kernels_connection_id_keeps_a_reused_fd_number_apart() {
    let mut t = Tracker::new(Limits::default());
    let mut out = Vec::new();
    let peer = Peer::default();
    let on = |conn_gen, e: SyscallEvent<'static>| SyscallEvent {
        conn_gen,
        conn_flags: inferscope_common::CONN_KNOWN | inferscope_common::CONN_INET,
        ..e
    };
    let first = inferscope_common::CONN_ID_BIT | 100;
    let second = inferscope_common::CONN_ID_BIT | 200;
    t.on_read(
        &on(
            first,
            ev(SyscallKind::Read, 10, b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n"),
        ),
        peer,
        &mut out,
    );
    // Same fd number, another connection (the first one's close came later in the stream):
    // its request and answer stay its own.
    t.on_read(
        &on(
            second,
            ev(SyscallKind::Read, 20, b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n"),
        ),
        peer,
        &mut out,
    );
    t.on_write(
        &on(
            second,
            ev(
                SyscallKind::Write,
                30,
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ),
        ),
        peer,
        &mut out,
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].path, "/b");
    t.on_close(&on(first, close(40)), &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(
        (out[1].path.as_str(), out[1].ended_by),
        ("/a", EndedBy::Server)
    );
}
