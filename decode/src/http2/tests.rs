//! A connection's streams from wire bytes: gRPC exchanges split at every byte, interleaved
//! streams, mid-connection attach, losses, hostile frames.

use inferscope_model::{Counter, Stats};

use super::{frame::kind, testwire::*, *};
use crate::http::Chunk;

struct Exchange {
    client: Vec<u8>,
    server: Vec<u8>,
}

/// A server-streaming call on stream 1 with every frame type and flag the decoder handles:
/// a padded, prioritised HEADERS continued by CONTINUATION, padded DATA, a message split across
/// DATA frames, PING, WINDOW_UPDATE, PRIORITY and a frame of unknown type.
fn exchange() -> Exchange {
    let mut client = PREFACE.to_vec();
    client.extend(settings(Some(8192)));
    let block = request_block("/inference.Gen/Stream");
    let (a, b) = block.split_at(5);
    let mut headers = vec![3]; // pad length
    headers.extend([0, 0, 0, 0, 16]); // priority: dependency 0, weight 16
    headers.extend(a);
    headers.extend([0, 0, 0]);
    client.extend(frame(kind::HEADERS, PADDED | PRIORITY, 1, &headers));
    client.extend(frame(kind::CONTINUATION, END_HEADERS, 1, b));
    client.extend(frame(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 32]));
    let msg = grpc_message(40);
    client.extend(frame(kind::DATA, PADDED, 1, &padded(7, &msg[..12])));
    client.extend(frame(kind::DATA, END_STREAM, 1, &msg[12..]));
    client.extend(frame(0xee, 0xff, 1, b"unknown frame type"));
    client.extend(frame(kind::PING, 0, 0, &[1; 8]));

    let mut server = settings(None);
    server.extend(frame(kind::SETTINGS, 1, 0, &[]));
    server.extend(frame(kind::WINDOW_UPDATE, 0, 0, &1000u32.to_be_bytes()));
    server.extend(frame(kind::HEADERS, END_HEADERS, 1, &response_block()));
    for len in [3, 0, 700] {
        server.extend(frame(kind::DATA, 0, 1, &grpc_message(len)));
    }
    // Two messages in one DATA frame, then one split over two.
    let mut two = grpc_message(5);
    two.extend(grpc_message(6));
    server.extend(frame(kind::DATA, PADDED, 1, &padded(1, &two)));
    let split = grpc_message(20);
    server.extend(frame(kind::DATA, 0, 1, &split[..3]));
    server.extend(frame(kind::DATA, 0, 1, &split[3..]));
    server.extend(frame(kind::PING, 1, 0, &[1; 8]));
    server.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &trailers_block("0"),
    ));
    Exchange { client, server }
}

struct Run {
    conn: Http2Connection,
    stats: Stats,
    out: Vec<StreamSummary>,
    ts: u64,
}

impl Run {
    fn new(start: Start) -> Self {
        Self::with_limits(start, Limits::default())
    }

    fn with_limits(start: Start, limits: Limits) -> Self {
        Self {
            conn: Http2Connection::new(limits, start),
            stats: Stats::default(),
            out: Vec::new(),
            ts: 0,
        }
    }

    fn feed(&mut self, side: Side, bytes: &[u8]) {
        self.feed_lost(side, bytes, 0);
    }

    fn feed_lost(&mut self, side: Side, bytes: &[u8], lost: u64) {
        self.ts += 10;
        let chunk = Chunk {
            bytes,
            lost,
            ts_ns: self.ts,
        };
        self.conn.feed(side, chunk, &mut self.stats, &mut self.out);
    }

    fn close(&mut self) {
        self.ts += 10;
        self.conn.close(self.ts, &mut self.stats, &mut self.out);
    }

    fn losses(&self) -> Vec<(Counter, u64)> {
        self.stats
            .iter()
            .filter(|(c, n)| c.kind() == inferscope_model::counters::Kind::Loss && *n > 0)
            .collect()
    }
}

fn known(s: &str) -> Value<String> {
    Value::Known(s.to_string())
}

fn check_exchange(s: &StreamSummary) {
    assert_eq!(s.stream_id, 1);
    assert_eq!(s.method, known("POST"));
    assert_eq!(s.path, known("/inference.Gen/Stream"));
    assert_eq!(s.content_type, known("application/grpc"));
    assert_eq!(s.status, Value::Known(200));
    assert_eq!(s.grpc_status, Value::Known(0));
    assert_eq!(s.grpc_message, known("fine"));
    assert_eq!(s.x_request_id, Value::Absent);
    assert_eq!((s.request.count, s.request.bytes), (1, 40));
    assert_eq!(s.request.data_bytes, 45);
    assert_eq!(s.request_id, MessageId::NotAsked, "no id field named");
    assert_eq!(
        (s.response.count, s.response.bytes, s.response.max_bytes),
        (6, 3 + 700 + 5 + 6 + 20, 700)
    );
    assert_eq!(s.ended_by, EndedBy::EndStream);
    assert!(!s.request.framing_lost && !s.response.framing_lost && !s.headers_lost);
    assert!(s.response.first_ts_ns <= s.response.last_ts_ns);
    assert_eq!(s.response.gaps_ns.len(), 5);
    assert!(s.response_ts_ns.unwrap() <= s.response.first_ts_ns.unwrap());
}

#[test]
fn a_grpc_exchange_fed_whole() {
    let ex = exchange();
    let mut run = Run::new(Start::Fresh);
    run.feed(Side::Client, &ex.client);
    run.feed(Side::Server, &ex.server);
    assert_eq!(run.out.len(), 1);
    check_exchange(&run.out[0]);
    assert_eq!(run.losses(), vec![]);
    assert_eq!(run.stats.get(Counter::H2Streams), 1);
}

/// Each direction cut in two at every byte offset (and the other fed whole) decodes the same,
/// and so does each direction fed a byte at a time.
#[test]
fn frames_split_at_every_offset_decode_the_same() {
    let ex = exchange();
    let mut whole = Run::new(Start::Fresh);
    whole.feed(Side::Client, &ex.client);
    whole.feed(Side::Server, &ex.server);
    let want = whole.out[0].clone();
    let strip = |mut s: StreamSummary| {
        // Timestamps depend on the cut; everything else must not.
        s.request_ts_ns = 0;
        s.request_end_ts_ns = None;
        s.response_ts_ns = None;
        s.response_end_ts_ns = None;
        s.end_ts_ns = 0;
        for m in [&mut s.request, &mut s.response] {
            m.first_ts_ns = None;
            m.last_ts_ns = None;
            m.gaps_ns.iter_mut().for_each(|g| *g = 0);
        }
        s
    };
    for cut in 0..=ex.client.len() {
        let mut run = Run::new(Start::Fresh);
        let (a, b) = ex.client.split_at(cut);
        run.feed(Side::Client, a);
        run.feed(Side::Client, b);
        run.feed(Side::Server, &ex.server);
        assert_eq!(run.out.len(), 1, "client cut at {cut}");
        assert_eq!(
            strip(run.out[0].clone()),
            strip(want.clone()),
            "client cut {cut}"
        );
        assert_eq!(run.losses(), vec![], "client cut {cut}");
    }
    for cut in 0..=ex.server.len() {
        let mut run = Run::new(Start::Fresh);
        run.feed(Side::Client, &ex.client);
        let (a, b) = ex.server.split_at(cut);
        run.feed(Side::Server, a);
        run.feed(Side::Server, b);
        assert_eq!(run.out.len(), 1, "server cut at {cut}");
        assert_eq!(
            strip(run.out[0].clone()),
            strip(want.clone()),
            "server cut {cut}"
        );
    }
    let mut run = Run::new(Start::Fresh);
    for b in ex.client.chunks(1) {
        run.feed(Side::Client, b);
    }
    for b in ex.server.chunks(1) {
        run.feed(Side::Server, b);
    }
    check_exchange(&run.out[0]);
    // Byte at a time, the first response message starts at the first byte of its DATA payload
    // and the last ends at the last byte of the last one: different syscalls.
    assert!(run.out[0].response.first_ts_ns < run.out[0].response.last_ts_ns);
}

/// Three calls interleaved frame by frame, the second reset by the client, the third reusing
/// the dynamic table entries of the first.
#[test]
fn interleaved_streams_each_get_their_own_record() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(settings(None));
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &request_block("/a.A/One"),
    ));
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        3,
        &request_block("/b.B/Two"),
    ));
    // Stream 5: the path and content-type by their dynamic indexes (62 = content-type of
    // stream 3, 63 = its path, 65 = stream 1's path).
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        5,
        &[0x83, 0x86, 0xc1, 0xbe],
    ));
    c.extend(frame(kind::DATA, 0, 3, &grpc_message(8)));
    c.extend(frame(kind::DATA, END_STREAM, 1, &grpc_message(9)));
    c.extend(frame(kind::DATA, END_STREAM, 5, &grpc_message(10)));
    c.extend(frame(kind::RST_STREAM, 0, 3, &8u32.to_be_bytes()));
    run.feed(Side::Client, &c);
    let mut s = settings(None);
    s.extend(frame(kind::HEADERS, END_HEADERS, 5, &response_block()));
    s.extend(frame(kind::HEADERS, END_HEADERS, 1, &response_block()));
    s.extend(frame(kind::DATA, 0, 1, &grpc_message(1)));
    s.extend(frame(kind::DATA, 0, 5, &grpc_message(2)));
    s.extend(frame(kind::DATA, 0, 1, &grpc_message(3)));
    s.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        5,
        &trailers_block("0"),
    ));
    s.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &trailers_block("13"),
    ));
    run.feed(Side::Server, &s);
    let by_id: Vec<_> = run.out.iter().map(|s| s.stream_id).collect();
    assert_eq!(by_id, vec![3, 5, 1]);
    let [three, five, one] = [&run.out[0], &run.out[1], &run.out[2]];
    assert_eq!(three.path, known("/b.B/Two"));
    assert_eq!(
        three.ended_by,
        EndedBy::Reset {
            by: Side::Client,
            error_code: 8
        }
    );
    assert_eq!((three.request.count, three.response.count), (1, 0));
    assert_eq!(five.path, known("/a.A/One"));
    assert_eq!(five.content_type, known("application/grpc"));
    assert_eq!((five.request.bytes, five.response.bytes), (10, 2));
    assert_eq!(five.grpc_status, Value::Known(0));
    assert_eq!(one.path, known("/a.A/One"));
    assert_eq!((one.request.bytes, one.response.count), (9, 2));
    assert_eq!(one.grpc_status, Value::Known(13));
    assert_eq!(run.losses(), vec![]);
}

/// Attached mid-connection: the path by a dynamic index never seen reads unknown (never a
/// guess), a literal path reads, and after the encoder empties its table everything reads.
#[test]
fn mid_connection_attach_reports_unknown_paths_until_the_table_is_known() {
    let mut run = Run::new(Start::MidConnection);
    // Stream 41: path and content-type by dynamic index.
    run.feed(
        Side::Client,
        &frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            41,
            &[0x83, 0xbf, 0xbe],
        ),
    );
    // Stream 43: a literal path.
    let mut b = vec![0x83];
    b.extend(indexed_name(4, "/x.X/Lit"));
    run.feed(
        Side::Client,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 43, &b),
    );
    // Stream 45: index 62 is 43's path now, 63 unknown.
    run.feed(
        Side::Client,
        &frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            45,
            &[0x83, 0xbe, 0xbf],
        ),
    );
    // Stream 47: the encoder empties its table (size update to 0, then back to 4096).
    let mut b = vec![0x20, 0x3f, 0xe1, 0x1f, 0x83];
    b.extend(indexed_name(4, "/y.Y/After"));
    run.feed(
        Side::Client,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 47, &b),
    );
    // The server's direction: an in-flight response of a stream opened before we attached,
    // then the answers.
    let mut s = frame(kind::DATA, 0, 39, &grpc_message(4));
    for id in [41, 43, 45, 47] {
        s.extend(frame(kind::HEADERS, END_HEADERS | END_STREAM, id, &[0x88]));
    }
    run.feed(Side::Server, &s);
    let paths: Vec<_> = run
        .out
        .iter()
        .map(|s| (s.stream_id, s.path.clone()))
        .collect();
    assert_eq!(
        paths,
        vec![
            (41, Value::Unknown),
            (43, known("/x.X/Lit")),
            (45, known("/x.X/Lit")),
            (47, known("/y.Y/After")),
        ]
    );
    assert_eq!(run.out[0].content_type, Value::Unknown);
    assert_eq!(run.out[0].method, known("POST"));
    assert_eq!(run.out[2].content_type, Value::Unknown);
    assert_eq!(run.stats.get(Counter::H2HpackUnknownFields), 3);
    assert_eq!(run.stats.get(Counter::H2HpackResyncs), 1);
    assert_eq!(run.stats.get(Counter::H2FramesUntracked), 1);
    assert!(run.out.iter().all(|s| s.status == Value::Known(200)));
}

/// Attached mid-frame: the first syscalls do not begin frames and are skipped (counted) until
/// one does.
#[test]
fn mid_connection_attach_hunts_for_a_frame_start() {
    let mut run = Run::new(Start::MidConnection);
    let data = frame(kind::DATA, 0, 7, &grpc_message(100));
    run.feed(Side::Client, &data[30..]);
    let mut b = vec![0x83];
    b.extend(indexed_name(4, "/z.Z/Found"));
    run.feed(
        Side::Client,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 9, &b),
    );
    run.feed(Side::Server, &[0x88]);
    run.feed(
        Side::Server,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 9, &[0x88]),
    );
    assert_eq!(run.out.len(), 1);
    assert_eq!(run.out[0].path, known("/z.Z/Found"));
    assert_eq!(run.stats.get(Counter::H2ResyncBytesSkipped), 84 + 1);
}

/// Records dropped by the kernel lose an unknown number of bytes: nothing is added to the
/// bytes skipped for them, only the bytes seen while hunting.
#[test]
fn an_unknown_loss_adds_no_skipped_bytes() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &request_block("/u.U/U"),
    ));
    run.feed(Side::Client, &c);
    run.feed_lost(Side::Client, &[], u64::MAX);
    run.feed_lost(Side::Client, &grpc_message(9)[..6], u64::MAX);
    run.feed(
        Side::Client,
        &frame(kind::DATA, END_STREAM, 1, &grpc_message(3)),
    );
    assert_eq!(run.stats.get(Counter::H2Resyncs), 1);
    assert_eq!(run.stats.get(Counter::H2ResyncBytesSkipped), 6);
}

/// Started mid-connection (the server spoke first, or the start was not seen), the client's
/// preface still says where the connection begins: both tables are known from there.
#[test]
fn a_preface_found_while_hunting_starts_the_connection() {
    let mut run = Run::new(Start::MidConnection);
    run.feed(Side::Server, &settings(None));
    let mut c = PREFACE.to_vec();
    c.extend(settings(None));
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &request_block("/p.P/First"),
    ));
    // The path again by its dynamic index (62 is content-type, 63 the path).
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &[0x83, 0xbf],
    ));
    run.feed(Side::Client, &c);
    run.feed(
        Side::Server,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 3, &[0x88]),
    );
    assert_eq!(run.out[0].path, known("/p.P/First"));
    assert_eq!(run.losses(), vec![]);
}

#[test]
fn a_stream_id_reused_ends_the_first_request() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/a.A/A"),
    ));
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/b.B/B"),
    ));
    run.feed(Side::Client, &c);
    run.feed(
        Side::Server,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 1, &[0x88]),
    );
    assert_eq!(run.out.len(), 2);
    assert_eq!(run.out[0].path, known("/a.A/A"));
    assert_eq!(run.out[0].ended_by, EndedBy::IdReused);
    assert_eq!(run.out[1].path, known("/b.B/B"));
    assert_eq!(run.out[1].ended_by, EndedBy::EndStream);
    assert_eq!(run.stats.get(Counter::H2StreamIdsReused), 1);
    // A lower id than one already opened, after its stream ended: reused too.
    run.feed(
        Side::Client,
        &frame(kind::HEADERS, END_HEADERS, 1, &request_block("/c.C/C")),
    );
    assert_eq!(run.stats.get(Counter::H2StreamIdsReused), 2);
    // Its trailers (no request line, END_STREAM) are not a new request.
    run.feed(
        Side::Client,
        &frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &literal("x-t", "1"),
        ),
    );
    assert_eq!(run.conn.open_streams(), 1);
}

/// A header block over the limit is skipped: its stream's fields read unknown, and so do later
/// references into the table it changed; static and literal fields still read.
#[test]
fn a_huge_header_block_is_counted_and_its_table_reads_unknown() {
    let limits = Limits {
        max_header_block_bytes: 1024,
        ..Limits::default()
    };
    let mut run = Run::with_limits(Start::Fresh, limits);
    let mut c = PREFACE.to_vec();
    let mut block = request_block("/big.Big/Call");
    for i in 0..40 {
        block.extend(literal(&format!("x-filler-{i}"), &"v".repeat(100)));
    }
    let (a, rest) = block.split_at(1000);
    let (b, d) = rest.split_at(2000);
    c.extend(frame(kind::HEADERS, END_STREAM, 1, a));
    c.extend(frame(kind::CONTINUATION, 0, 1, b));
    c.extend(frame(kind::CONTINUATION, END_HEADERS, 1, d));
    // Stream 3 refers to the path stream 1 inserted: unknown. Stream 5 has a literal.
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &[0x83, 0xbf],
    ));
    let mut lit = vec![0x83];
    lit.extend(indexed_name(4, "/small.S/Call"));
    c.extend(frame(kind::HEADERS, END_HEADERS | END_STREAM, 5, &lit));
    run.feed(Side::Client, &c);
    let mut s = Vec::new();
    for id in [1, 3, 5] {
        s.extend(frame(kind::HEADERS, END_HEADERS | END_STREAM, id, &[0x88]));
    }
    run.feed(Side::Server, &s);
    assert_eq!(run.stats.get(Counter::H2HeaderBlocksTooLarge), 1);
    let paths: Vec<_> = run.out.iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        paths,
        vec![Value::Unknown, Value::Unknown, known("/small.S/Call")]
    );
    assert!(run.out[0].headers_lost);
    assert_eq!(run.out[1].method, known("POST"));
}

#[test]
fn padding_errors_are_counted_and_framing_continues() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS,
        1,
        &request_block("/p.P/Pad"),
    ));
    // DATA whose pad length (9) is past its payload (4 bytes after the pad length byte).
    c.extend(frame(kind::DATA, PADDED | END_STREAM, 1, &[9, 0, 0, 0, 0]));
    // HEADERS whose padding swallows the block: a lost block.
    c.extend(frame(
        kind::HEADERS,
        PADDED | END_HEADERS | END_STREAM,
        3,
        &[200, 0x83],
    ));
    // A PADDED DATA frame too short to hold its pad length.
    c.extend(frame(kind::DATA, PADDED, 5, &[]));
    c.extend(frame(kind::RST_STREAM, 0, 1, &[0, 0])); // wrong length
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        7,
        &[0x83, 0x84],
    ));
    run.feed(Side::Client, &c);
    let mut s = Vec::new();
    for id in [1, 3, 7] {
        s.extend(frame(kind::HEADERS, END_HEADERS | END_STREAM, id, &[0x88]));
    }
    run.feed(Side::Server, &s);
    assert_eq!(run.stats.get(Counter::H2FramesMalformed), 4);
    assert_eq!(run.stats.get(Counter::H2HeaderBlocksLost), 1);
    let got: Vec<_> = run
        .out
        .iter()
        .map(|s| (s.stream_id, s.path.clone()))
        .collect();
    assert_eq!(
        got,
        vec![(1, known("/p.P/Pad")), (3, Value::Unknown), (7, known("/"))]
    );
    // The bad DATA frame still ended its stream's request.
    assert!(run.out[0].request_end_ts_ns.is_some());
}

#[test]
fn goaway_cuts_the_streams_above_its_last_id_and_close_the_rest() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    for id in [1, 3, 5] {
        c.extend(frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &request_block("/g.G/G"),
        ));
    }
    run.feed(Side::Client, &c);
    let mut goaway = 1u32.to_be_bytes().to_vec();
    goaway.extend(0u32.to_be_bytes());
    goaway.extend(b"debug data is skipped");
    run.feed(Side::Server, &frame(kind::GOAWAY, 0, 0, &goaway));
    let cut: Vec<_> = run.out.iter().map(|s| s.stream_id).collect();
    assert_eq!(cut, vec![3, 5]);
    let by = EndedBy::GoAway {
        by: Side::Server,
        last_stream_id: 1,
        error_code: 0,
    };
    assert_eq!(run.out[0].ended_by, by);
    run.close();
    assert_eq!(run.out[2].stream_id, 1);
    assert_eq!(run.out[2].ended_by, by);
}

/// The id field of a request's first message (where engines name their request): read however
/// far into the message it comes, from the first message only, and only where its bytes mean
/// something without a codec and were captured.
#[test]
fn the_first_request_messages_id_is_read_wherever_it_is() {
    let call = |message: &[u8], lost: u64| {
        let mut run = Run::new(Start::Fresh);
        run.conn
            .scan_ids_of(|path| (path == "/e.E/Generate").then_some(7));
        let mut c = PREFACE.to_vec();
        c.extend(frame(
            kind::HEADERS,
            END_HEADERS,
            1,
            &request_block("/e.E/Generate"),
        ));
        run.feed(Side::Client, &c);
        let data = frame(kind::DATA, END_STREAM, 1, message);
        if lost == 0 {
            run.feed(Side::Client, &data);
        } else {
            let kept = data.len() - lost as usize;
            run.feed_lost(Side::Client, &data[..kept], lost);
        }
        let mut s = frame(kind::HEADERS, END_HEADERS, 1, &response_block());
        s.extend(frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &trailers_block("0"),
        ));
        run.feed(Side::Server, &s);
        assert_eq!(run.out.len(), 1);
        run.out.remove(0).request_id
    };
    let prefixed = |body: &[u8], compressed: bool| {
        let mut m = vec![u8::from(compressed)];
        m.extend((body.len() as u32).to_be_bytes());
        m.extend(body);
        m
    };
    // 2,000 bytes of token ids (field 1, packed), then the id (field 7).
    let mut body = vec![0x0a, 0xd0, 0x0f];
    body.extend([0x05; 2000]);
    body.extend(b"\x3a\x05rid-1");
    let found = MessageId::Found("rid-1".to_owned());
    assert_eq!(call(&prefixed(&body, false), 0), found);
    // Two messages: the first one's id.
    let mut two = prefixed(&body, false);
    two.extend(prefixed(b"\x3a\x05rid-2", false));
    assert_eq!(call(&two, 0), found);
    assert_eq!(call(&prefixed(&body, true), 0), MessageId::Unread);
    assert_eq!(call(&prefixed(&body[..100], false), 0), MessageId::Unread);
    // Cut by the capture before the id: unread; after it: read.
    assert_eq!(call(&prefixed(&body, false), 20), MessageId::Unread);
    let mut after = body.clone();
    after.extend([0x42, 40]);
    after.extend([b'x'; 40]);
    assert_eq!(call(&prefixed(&after, false), 30), found);
}

#[test]
fn lost_bytes_inside_data_keep_the_framing_and_across_frames_do_not() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/l.L/L"),
    ));
    run.feed(Side::Client, &c);
    let mut s = frame(kind::HEADERS, END_HEADERS, 1, &response_block());
    let big = frame(kind::DATA, 0, 1, &grpc_message(1000));
    // The syscall's capture kept 100 bytes of the 1014-byte frame.
    s.extend(&big[..100]);
    run.feed_lost(Side::Server, &s, (big.len() - 100) as u64);
    run.feed(Side::Server, &frame(kind::DATA, 0, 1, &grpc_message(3)));
    assert_eq!(run.stats.get(Counter::H2DataBytesLost), 914);
    // Now a loss across the next frame header: the stream's messages stop being counted.
    run.feed_lost(
        Side::Server,
        &frame(kind::DATA, 0, 1, &grpc_message(3))[..4],
        20,
    );
    assert_eq!(run.stats.get(Counter::H2FramingLost), 1);
    // A syscall in the middle of a frame is skipped; the next that starts a frame resumes.
    run.feed(Side::Server, &grpc_message(50)[..7]);
    run.feed(
        Side::Server,
        &frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &trailers_block("0"),
        ),
    );
    assert_eq!(run.out.len(), 1);
    let r = &run.out[0].response;
    assert_eq!(r.count, 2);
    assert!(r.data_lost && r.framing_lost);
    assert_eq!(run.stats.get(Counter::GrpcMessageFramingLost), 1);
    assert_eq!(run.stats.get(Counter::H2Resyncs), 1);
    // Not the server's table: it may have changed in what was lost; its trailers used literals.
    assert_eq!(run.out[0].grpc_status, Value::Known(0));
}

#[test]
fn streams_past_the_limit_are_counted_not_followed() {
    let limits = Limits {
        max_streams: 2,
        ..Limits::default()
    };
    let mut run = Run::with_limits(Start::Fresh, limits);
    let mut c = PREFACE.to_vec();
    for id in [1, 3, 5] {
        c.extend(frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &request_block("/s.S/S"),
        ));
    }
    run.feed(Side::Client, &c);
    assert_eq!(run.conn.open_streams(), 2);
    assert_eq!(run.stats.get(Counter::H2StreamsOverLimit), 1);
}

#[test]
fn a_client_without_the_preface_is_not_http2() {
    let mut run = Run::new(Start::Fresh);
    run.feed(Side::Client, b"GET / HTTP/1.1\r\n\r\n");
    assert!(run.conn.not_http2());
    assert_eq!(run.stats.get(Counter::H2NotHttp2), 1);
    assert!(starts_with_preface(PREFACE));
    assert!(starts_with_preface(&PREFACE[..16]));
    assert!(!starts_with_preface(b"PRI * HTTP/2"));
    assert!(!starts_with_preface(b"POST / HTTP/1.1\r\n\r\n"));
    assert!(starts_with_server_preface(&settings(None)));
    assert!(starts_with_server_preface(&frame(
        kind::SETTINGS,
        0,
        0,
        &[]
    )));
    assert!(!starts_with_server_preface(&frame(
        kind::SETTINGS,
        1,
        0,
        &[]
    )));
    assert!(!starts_with_server_preface(b"HTTP/1.1 200 OK\r\n\r\n"));
    let mut two = frame(kind::HEADERS, END_HEADERS, 5, &request_block("/w.W/W"));
    two.extend(frame(kind::DATA, END_STREAM, 5, &grpc_message(3)));
    assert!(whole_frames(&two));
    assert!(!whole_frames(&two[..two.len() - 1]));
    assert!(!whole_frames(&two[1..]));
    assert!(!whole_frames(b""));
    assert!(!whole_frames(
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
    ));
    assert!(!whole_frames(b"GET / HTTP/1.1\r\n\r\n"));
}

/// The SETTINGS a client sends allow the server's encoder a larger table.
#[test]
fn settings_header_table_size_bounds_the_peer_encoder() {
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(settings(Some(16384)));
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/t.T/T"),
    ));
    run.feed(Side::Client, &c);
    // A size update to 16384 (0x3f, 16353 = e1 7f) is legal now.
    let mut b = vec![0x3f, 0xe1, 0x7f, 0x88];
    b.extend(trailers_block("0"));
    run.feed(
        Side::Server,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 1, &b),
    );
    assert_eq!(run.stats.get(Counter::H2HpackErrors), 0);
    assert_eq!(run.out[0].grpc_status, Value::Known(0));
    // Without those SETTINGS the same block is an HPACK error.
    let mut run = Run::new(Start::Fresh);
    let mut c = PREFACE.to_vec();
    c.extend(frame(
        kind::HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("/t.T/T"),
    ));
    run.feed(Side::Client, &c);
    run.feed(
        Side::Server,
        &frame(kind::HEADERS, END_HEADERS | END_STREAM, 1, &b),
    );
    assert_eq!(run.stats.get(Counter::H2HpackErrors), 1);
    assert_eq!(run.out[0].grpc_status, Value::Unknown);
}

/// Pseudo-random bytes and mutations of a valid exchange, split and lost at random, never panic
/// and keep every bound.
#[test]
fn random_and_mutated_input_never_panics() {
    let mut rng = crate::http::testutil::XorShift(0x42);
    let ex = exchange();
    for round in 0..3000 {
        let start = if round % 2 == 0 {
            Start::Fresh
        } else {
            Start::MidConnection
        };
        let limits = Limits {
            max_header_block_bytes: 256,
            max_table_bytes: 256,
            max_streams: 4,
        };
        let mut run = Run::with_limits(start, limits);
        for (side, base) in [(Side::Client, &ex.client), (Side::Server, &ex.server)] {
            let mut bytes = base.clone();
            if round % 3 == 0 {
                bytes = (0..rng.below(600)).map(|_| rng.next_u64() as u8).collect();
            } else {
                for _ in 0..rng.below(6) {
                    let i = rng.below(bytes.len() as u64) as usize;
                    bytes[i] = rng.next_u64() as u8;
                }
            }
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let n = (rng.below(64) as usize + 1).min(rest.len());
                let (now, later) = rest.split_at(n);
                rest = later;
                let lost = if rng.below(20) == 0 { rng.below(50) } else { 0 };
                run.feed_lost(side, now, lost);
                assert!(run.conn.open_streams() <= 4);
            }
        }
        run.close();
        assert_eq!(run.conn.open_streams(), 0);
        for s in &run.out {
            for v in [&s.path, &s.method, &s.content_type, &s.grpc_message] {
                assert!(v.known().is_none_or(|v| v.len() <= 256));
            }
        }
    }
}

/// A real connection between grpcio's C core client and server (tests/fixtures/grpc_h2c): every
/// call is one stream with the client's own counts, and every header field is known (the
/// connection was seen from its start).
#[test]
fn a_real_grpcio_connection_decodes_to_the_clients_counts() {
    let client = include_bytes!("../../../tests/fixtures/grpc_h2c/client.bin");
    let server = include_bytes!("../../../tests/fixtures/grpc_h2c/server.bin");
    let calls: Vec<serde_json::Value> =
        include_str!("../../../tests/fixtures/grpc_h2c/calls.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    for split in [usize::MAX, 1000, 7] {
        let mut run = Run::new(Start::Fresh);
        for piece in client.chunks(split.min(client.len())) {
            run.feed(Side::Client, piece);
        }
        for piece in server.chunks(split.min(server.len())) {
            run.feed(Side::Server, piece);
        }
        run.close();
        assert_eq!(run.losses(), vec![], "split {split}");
        assert_eq!(run.stats.get(Counter::H2HpackUnknownFields), 0);
        assert_eq!(run.out.len(), calls.len());
        for call in &calls {
            let size = call["request_bytes"].as_u64().unwrap();
            let s = run
                .out
                .iter()
                .find(|s| s.request.bytes == size)
                .unwrap_or_else(|| panic!("no stream for {call}"));
            assert_eq!(s.method, known("POST"));
            assert_eq!(s.path, known(call["path"].as_str().unwrap()));
            assert_eq!(s.content_type, known("application/grpc"));
            assert_eq!(s.status, Value::Known(200));
            let status = call["grpc_status"].as_u64().unwrap() as u32;
            assert_eq!(s.grpc_status, Value::Known(status), "{call}");
            assert_eq!(s.request.count, 1);
            assert_eq!(
                u64::from(s.response.count),
                call["messages"].as_u64().unwrap()
            );
            assert_eq!(s.response.bytes, call["bytes"].as_u64().unwrap());
            assert_eq!(s.ended_by, EndedBy::EndStream);
        }
    }
}
