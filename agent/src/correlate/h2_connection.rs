//! An h2c connection (HTTP/2 with prior knowledge) of a traced server: one record per stream.
//!
//! The connection tracker hands a connection here when the client's first bytes are the HTTP/2
//! preface; [`inferscope_decode::http2`] follows both directions' frames and streams, and each
//! stream that ends becomes a record: its path, status, gRPC status and message counts, with
//! TTFT at the first response message (the first token of a server-streaming completion) and
//! the token gaps between response messages.

use std::collections::VecDeque;

use inferscope_decode::{
    http::{Chunk, RequestSummary},
    http2::{
        self, EndedBy as WireEnd, Exchange, Http2Connection, MessageId, Side, Start, StreamSummary,
    },
};
use inferscope_model::{Counter, EndedBy, Http2Info, RequestRecord};

use super::{
    Peer, Stats, Work,
    arrivals::{Arrival, ArrivalIndex},
    h2_calls::{CallStreams, StreamEnd},
    h2_fields::{content_type, text, tokens_from},
    loss::{self, Ending, Reason},
    request::{RecordContext, RequestProgress},
    segment_positions::SegmentPositions,
};
use crate::{capture::SyscallEvent, engines};

pub(super) struct H2Connection {
    decoder: Http2Connection,
    /// Streams that ended during the last syscall; kept for its allocation.
    ended: Vec<StreamSummary>,
    /// The previous read: the wire arrival of a read is the first segment after it.
    last_read_ns: u64,
    /// Recent reads, oldest first: a stream's arrival is that of the read that carried its
    /// HEADERS (the n-th segment of the read for the n-th stream it opened).
    read_arrivals: VecDeque<ReadArrival>,
    /// The client's TCP segments placed in its byte stream: a stream's arrival is the segment
    /// that carried the first byte of its HEADERS (clear text only).
    positions: SegmentPositions,
    /// Taken for HTTP/2 on the server's word alone (its first write): the client's first read
    /// must agree, or the connection is not HTTP/2 (`rejected`).
    unconfirmed: bool,
    rejected: bool,
    /// Streams that carry one call per request message, and their open calls.
    calls: CallStreams,
    /// TLS: which segments a call may have come in (see [`TlsArrivals`]).
    tls: TlsArrivals,
    /// The read being fed handed over a call stream's request message.
    calls_begun: bool,
}

/// Reads whose wire arrival is remembered: enough for the streams a connection can have open.
const MAX_READ_ARRIVALS: usize = 1024;

impl H2Connection {
    /// The HTTP/2 state for a connection whose client has not spoken HTTP/1, if this read says
    /// it speaks HTTP/2: the preface, or (`joined`: the connection was joined mid-stream) whole
    /// HTTP/2 frames, as a long-lived gRPC channel that predates the agent sends.
    pub(super) fn from_read(payload: &[u8], joined: bool, stats: &mut Stats) -> Option<Box<Self>> {
        let start = if http2::starts_with_preface(payload) {
            Start::Fresh
        } else if joined && http2::whole_frames(payload) {
            Start::MidConnection
        } else {
            return None;
        };
        stats.bump(Counter::Http2Connections);
        Some(Box::new(Self::new(start)))
    }

    /// The HTTP/2 state for a connection whose server writes before reading anything, if that
    /// write is HTTP/2's SETTINGS (an HTTP/1 server never speaks first). `joined`: the
    /// connection was joined mid-stream, so this may be a later SETTINGS; the client's preface,
    /// if it comes, still marks the start.
    pub(super) fn from_first_write(
        payload: &[u8],
        joined: bool,
        stats: &mut Stats,
    ) -> Option<Box<Self>> {
        if !http2::starts_with_server_preface(payload) {
            return None;
        }
        stats.bump(Counter::Http2Connections);
        let start = if joined {
            Start::MidConnection
        } else {
            Start::Fresh
        };
        let mut h2 = Box::new(Self::new(start));
        h2.unconfirmed = true;
        Some(h2)
    }

    /// `Start::Fresh` when the client's preface (or the server's first SETTINGS) was seen;
    /// `Start::MidConnection` for a connection joined later.
    pub(super) fn new(start: Start) -> Self {
        let mut decoder = Http2Connection::new(http2::Limits::default(), start);
        decoder.pair_messages_of(engines::is_call_stream, engines::names_a_call);
        decoder.scan_ids_of(engines::rpc_id_field);
        Self {
            decoder,
            ended: Vec::new(),
            last_read_ns: 0,
            read_arrivals: VecDeque::new(),
            positions: SegmentPositions::default(),
            unconfirmed: false,
            rejected: false,
            calls: CallStreams::default(),
            tls: TlsArrivals::default(),
            calls_begun: false,
        }
    }

    /// The client did not begin with the HTTP/2 preface (or whole frames, joined mid-stream).
    pub(super) fn not_http2(&self) -> bool {
        self.rejected || self.decoder.not_http2()
    }

    /// One read of the client's bytes; `handshake_ns`: the end of the connection's TLS
    /// handshake, on its first read after it.
    pub(super) fn on_read(
        &mut self,
        ev: &SyscallEvent<'_>,
        peer: &Peer,
        handshake_ns: Option<u64>,
        arrivals: &mut ArrivalIndex,
        ctx: RecordContext<'_>,
        work: &mut Work<'_>,
    ) {
        let ts = ev.ts_exit_ns;
        if ev.ret <= 0 {
            // The client's EOF or reset: the streams still open were abandoned by it.
            self.client_left(ts, ctx, work.stats, work.out);
            return;
        }
        if self.unconfirmed {
            if !http2::starts_with_preface(ev.payload) && !http2::whole_frames(ev.payload) {
                work.stats.bump(Counter::H2NotHttp2);
                self.rejected = true;
                return;
            }
            self.unconfirmed = false;
        }
        // Taken for every read, so the socket's segments are consumed as HTTP/1's are. A
        // client's lone control frames (acks, window updates) start no call; a read that
        // carries several new streams gives them its segments in order.
        let window = (self.last_read_ns, ts);
        let mut arrived = match (peer.sock, peer.local_port, peer.remote) {
            (sock, ..) if sock != 0 => arrivals.all_on(sock, window.0, window.1),
            (_, Some(port), Some(remote)) => arrivals.all_from(port, remote, window),
            _ => Vec::new(),
        };
        self.last_read_ns = ts;
        if let Some(end) = handshake_ns {
            after_handshake(&mut arrived, end);
        }
        // Clear text with known positions places the segments; only TLS (or bytes whose
        // positions a loss made unknown) needs the read-order fallback.
        let position = self.decoder.client_position().filter(|_| !ctx.tls);
        match position {
            Some(start) => self.positions.on_read(start, ev.ret as u64, &arrived),
            None => self.positions.reset(),
        }
        let opened_before = self.decoder.opened();
        let (blocks_before, _) = self.decoder.client_blocks();
        let wires = if ctx.tls {
            self.tls.add(&arrived);
            self.tls.candidates()
        } else if position.is_none() {
            in_read_order(&arrived, CONTROL_FRAME_MAX)
        } else {
            Vec::new()
        };
        let pushed = !wires.is_empty();
        if pushed {
            if self.read_arrivals.len() >= MAX_READ_ARRIVALS {
                self.read_arrivals.pop_front();
            }
            self.read_arrivals.push_back(ReadArrival {
                ts_ns: ts,
                first_open: opened_before,
                wires,
            });
        }
        self.calls_begun = false;
        self.feed(Side::Client, ev, ts, ctx, work.stats, work.out);
        if !ctx.tls {
            return;
        }
        let (blocks, block_open) = self.decoder.client_blocks();
        let began = if self.decoder.opened() != opened_before || self.calls_begun {
            Began::Call { more: block_open }
        } else if blocks != blocks_before && block_open {
            Began::Block
        } else {
            Began::Nothing
        };
        if !matches!(began, Began::Call { .. })
            && pushed
            && self.read_arrivals.back().is_some_and(|r| r.ts_ns == ts)
        {
            // No call began here: its segments wait for the read that begins one.
            self.read_arrivals.pop_back();
        }
        self.tls.after_read(began);
    }

    pub(super) fn on_write(
        &mut self,
        ev: &SyscallEvent<'_>,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        if ev.ret < 0 {
            // EPIPE/ECONNRESET: the client went away.
            self.client_left(ev.ts_enter_ns, ctx, stats, out);
            return;
        }
        self.feed(Side::Server, ev, ev.ts_enter_ns, ctx, stats, out);
    }

    fn feed(
        &mut self,
        side: Side,
        ev: &SyscallEvent<'_>,
        ts_ns: u64,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        let chunk = Chunk {
            bytes: ev.payload,
            lost: ev.lost_bytes(),
            ts_ns,
        };
        self.decoder.feed(side, chunk, stats, &mut self.ended);
        self.drain(ctx, None, stats, out);
    }

    /// Records of the calls and streams the decoder ended: each call stream's messages first
    /// (they precede its end), then the streams; `closing`: how the connection ended, for the
    /// streams it cut.
    fn drain(
        &mut self,
        ctx: RecordContext<'_>,
        closing: Option<Ending>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        for m in self.decoder.take_paired() {
            let wire = match m.side {
                Side::Client => {
                    self.calls_begun = true;
                    let (at, read_ns) = (m.message.at, m.message.first_ts_ns);
                    wire_of(
                        &self.read_arrivals,
                        &self.positions,
                        ctx.tls,
                        at,
                        read_ns,
                        |_| 0,
                    )
                }
                Side::Server => None,
            };
            self.calls.on_message(m, wire, ctx, stats, out);
        }
        for s in self.ended.drain(..) {
            if s.paired {
                let end = stream_ending(&s, closing);
                self.calls.stream_ended(&s, &end, ctx, stats, out);
                continue;
            }
            let wire = wire_of(
                &self.read_arrivals,
                &self.positions,
                ctx.tls,
                s.request_at,
                s.request_ts_ns,
                |read| s.open_seq.wrapping_sub(read.first_open) as usize,
            );
            emit(s, wire, ctx, closing, stats, out);
        }
    }

    fn client_left(
        &mut self,
        ts_ns: u64,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        self.decoder.close(ts_ns, stats, &mut self.ended);
        self.drain(ctx, Some(Ending::Closed(EndedBy::Client)), stats, out);
    }

    /// The kernel dropped records of this connection: an unknown number of bytes each way are
    /// gone, so both directions lose their framing.
    pub(super) fn records_lost(&mut self, ts_ns: u64, stats: &mut Stats) {
        for side in [Side::Client, Side::Server] {
            let chunk = Chunk {
                bytes: &[],
                lost: u64::MAX,
                ts_ns,
            };
            self.decoder.feed(side, chunk, stats, &mut self.ended);
        }
    }

    pub(super) fn close(
        mut self,
        ts_ns: u64,
        ending: Ending,
        stats: &mut Stats,
        ctx: RecordContext<'_>,
        out: &mut Vec<RequestRecord>,
    ) {
        self.decoder.close(ts_ns, stats, &mut self.ended);
        self.drain(ctx, Some(ending), stats, out);
    }
}

/// The wire arrival of the read at `read_ns`, if it is remembered.
/// The largest segment a client's control frame alone makes on h2c: SETTINGS ack (9 bytes),
/// WINDOW_UPDATE and RST_STREAM (13), PING (17), with room for two of them.
const CONTROL_FRAME_MAX: u32 = 34;

/// The largest segment a client's control frames alone make over TLS: [`CONTROL_FRAME_MAX`]
/// plus a TLS 1.3 record's 22 bytes (header, content type, AEAD tag).
const TLS_CONTROL_RECORD_MAX: u32 = CONTROL_FRAME_MAX + 22;

/// Segments kept per read.
const MAX_READ_SEGMENTS: usize = 16;

/// The segments of a TLS connection's first read after its handshake that are not the
/// handshake's: those after its end, else the last before it (with TLS 1.3 the client's Finished
/// and its first data may share a segment).
fn after_handshake(arrived: &mut Vec<Arrival>, end_ns: u64) {
    let first_after = arrived.partition_point(|a| a.ts_ns <= end_ns);
    if first_after < arrived.len() {
        arrived.drain(..first_after);
    } else if let Some(last) = arrived.pop() {
        *arrived = vec![last];
    }
}

/// One read of the client's bytes: when, how many streams the connection had opened before it,
/// and the segments it consumed (oldest first, control frames alone left out).
struct ReadArrival {
    ts_ns: u64,
    first_open: u32,
    wires: Vec<u64>,
}

/// What a TLS read began, as its decoded frames say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Began {
    /// A call: a stream opened, or a call stream's request message was handed over; `more`: a
    /// further request's header block is still being gathered.
    Call { more: bool },
    /// A request's header block, not yet whole.
    Block,
    /// Only frames of calls already begun and control frames: bytes of earlier segments.
    Nothing,
}

/// Which segments a TLS connection's next call may have come in.
///
/// TLS hides where a segment's bytes are in the plaintext, and a server may read one segment's
/// plaintext in several reads (a frame header, then its payload) while its client coalesces
/// control frames (window updates, as it receives) into segments as large as a request's. What
/// holds is the order: the server reads the plaintext in the order its segments came. So the
/// segments since the last call wait for the read that begins the next one, and a read that
/// consumed only earlier frames marks those before it as spent: the call's segment is the first
/// to arrive after that read (what it read came before it), else the latest before the call.
#[derive(Debug, Default)]
struct TlsArrivals {
    /// Request-sized segments since the last read that began a call, oldest first.
    carried: Vec<u64>,
    /// `carried[spent..]` arrived after the last read that began nothing.
    spent: usize,
    /// The latest smaller segment: a call too small to tell from a control frame.
    small: Option<u64>,
    /// A header block began before its stream opened: the candidates as they were then.
    pending: Option<(usize, usize)>,
}

impl TlsArrivals {
    fn add(&mut self, arrived: &[Arrival]) {
        for a in arrived {
            if a.len <= TLS_CONTROL_RECORD_MAX {
                self.small = Some(a.ts_ns);
            } else if self.carried.len() < MAX_READ_SEGMENTS {
                self.carried.push(a.ts_ns);
            } else {
                // Full: the oldest goes (it is the least likely).
                self.carried.remove(0);
                self.spent = self.spent.saturating_sub(1);
                if let Some((len, spent)) = self.pending.as_mut() {
                    *len = len.saturating_sub(1);
                    *spent = spent.saturating_sub(1);
                }
                self.carried.push(a.ts_ns);
            }
        }
    }

    /// The segments for the calls a read begins, in order: the first for the first call.
    fn candidates(&self) -> Vec<u64> {
        let (len, spent) = self.pending.unwrap_or((self.carried.len(), self.spent));
        let Some(upto) = self.carried.get(..len).filter(|c| !c.is_empty()) else {
            return self.small.into_iter().collect();
        };
        let start = spent.min(upto.len() - 1);
        upto.get(start..).unwrap_or_default().to_vec()
    }

    fn after_read(&mut self, began: Began) {
        match began {
            Began::Call { more } => {
                let last = self.carried.last().copied();
                *self = TlsArrivals::default();
                if more {
                    // The next request began in this read: in its last segment at the earliest.
                    self.carried.extend(last);
                    self.pending = Some((self.carried.len(), 0));
                }
            }
            Began::Block => {
                if self.pending.is_none() {
                    self.pending = Some((self.carried.len(), self.spent));
                }
            }
            Began::Nothing if self.pending.is_none() => self.spent = self.carried.len(),
            Began::Nothing => {}
        }
    }
}

/// A read's segments that may open streams, oldest first: those larger than `control_max`, the
/// most a control frame alone makes (all of them if none is), at most [`MAX_READ_SEGMENTS`].
fn in_read_order(arrived: &[Arrival], control_max: u32) -> Vec<u64> {
    let mut wires: Vec<u64> = arrived
        .iter()
        .filter(|a| a.len > control_max)
        .take(MAX_READ_SEGMENTS)
        .map(|a| a.ts_ns)
        .collect();
    if wires.is_empty() {
        wires = arrived
            .iter()
            .take(MAX_READ_SEGMENTS)
            .map(|a| a.ts_ns)
            .collect();
    }
    wires
}

/// The wire arrival of bytes the client sent: in clear text, the segment that carried the byte
/// at `at` (a stream's HEADERS, a call's message); over TLS (whose plaintext has other sizes than
/// its segments) or where the byte positions are unknown, the segment of the read at `read_ns`
/// for the `rank`-th stream it opened (the last segment for streams beyond its segments).
fn wire_of(
    reads: &VecDeque<ReadArrival>,
    positions: &SegmentPositions,
    tls: bool,
    at: Option<u64>,
    read_ns: u64,
    rank: impl FnOnce(&ReadArrival) -> usize,
) -> Option<u64> {
    if !tls && let Some(at) = at {
        return positions.arrival_of(at);
    }
    let i = reads.partition_point(|r| r.ts_ns < read_ns);
    let read = reads.get(i).filter(|r| r.ts_ns == read_ns)?;
    read.wire(rank(read))
}

impl ReadArrival {
    /// The segment of the `rank`-th stream the read opened.
    fn wire(&self, rank: usize) -> Option<u64> {
        self.wires.get(rank).or(self.wires.last()).copied()
    }
}

/// How stream `s` ended, for its record (or the records of the calls it carried). `closing`:
/// how the connection ended, for streams it cut.
fn stream_ending(s: &StreamSummary, closing: Option<Ending>) -> StreamEnd {
    let (ended_by, stream_end, error_code, mut incomplete) = match s.ended_by {
        WireEnd::EndStream => (EndedBy::Complete, "end_stream", None, None),
        WireEnd::Reset { by, error_code } => (side_ended(by), "rst_stream", Some(error_code), None),
        WireEnd::GoAway { by, error_code, .. } => {
            (side_ended(by), "goaway", Some(error_code), None)
        }
        WireEnd::IdReused => (EndedBy::Unknown, "id_reused", None, None),
        WireEnd::ConnectionClosed | WireEnd::FramingLost => match closing {
            Some(Ending::Closed(by)) => (by, "closed", None, None),
            Some(Ending::Incomplete(reason)) => (EndedBy::Unknown, "closed", None, Some(reason)),
            None => (EndedBy::Unknown, "closed", None, None),
        },
    };
    let framing_lost = s.headers_lost || s.request.framing_lost || s.response.framing_lost;
    if framing_lost && incomplete.is_none() {
        incomplete = Some(Reason::Http2Framing);
    }
    StreamEnd {
        ended_by,
        stream_end,
        error_code,
        incomplete,
    }
}

/// A stream's record. `closing`: how the connection ended, for streams it cut.
fn emit(
    s: StreamSummary,
    wire_ns: Option<u64>,
    ctx: RecordContext<'_>,
    closing: Option<Ending>,
    stats: &mut Stats,
    out: &mut Vec<RequestRecord>,
) {
    let StreamEnd {
        ended_by,
        stream_end,
        error_code,
        incomplete,
    } = stream_ending(&s, closing);
    if wire_ns.is_none() {
        stats.bump(Counter::ArrivalWireUnknown);
    }
    let mut p = RequestProgress::new(s.stream_id, 0, s.request_ts_ns, wire_ns);
    p.status = s.status.known().copied();
    p.first_byte_ns = s.response_ts_ns;
    p.request_bytes = s.request.data_bytes;
    p.response_bytes = s.response.data_bytes;
    p.truncated = s.request.data_lost || s.response.data_lost;
    p.incomplete = incomplete;
    tokens_from(&mut p, &s.response);
    // A plain response's token events are no gRPC messages.
    let grpc_response = !s.exchange.as_ref().is_some_and(|e| e.response_plain);
    let mut summary = match s.exchange {
        Some(exchange) => plain_bodies(&mut p, *exchange, stats),
        None => RequestSummary::default(),
    };
    summary.method = text(&s.method);
    summary.path = text(&s.path);
    summary.x_request_id = s.x_request_id.known().cloned();
    summary.traceparent = s.traceparent.known().cloned();
    summary.ts_ns = s.request_end_ts_ns.unwrap_or(0);
    p.summary = Some(summary);
    let end_ns = s.end_ts_ns;
    if let Some(reason) = p.incomplete {
        stats.bump(loss::INCOMPLETE_TOTAL);
        stats.bump(reason.counter());
    }
    let mut record = p.into_record(ctx, end_ns, ended_by);
    match s.request_id {
        MessageId::NotAsked => {}
        MessageId::Found(id) => {
            stats.bump(Counter::RpcRequestIdsRead);
            record.rpc_request_id = Some(id);
        }
        MessageId::Unread => stats.bump(Counter::RpcRequestIdsUnread),
    }
    record.http2 = Some(Box::new(Http2Info {
        stream_id: s.stream_id,
        content_type: content_type(&s.content_type),
        grpc_status: s.grpc_status.known().copied(),
        request_messages: s.request.count,
        request_message_bytes: s.request.bytes,
        response_messages: if grpc_response { s.response.count } else { 0 },
        response_message_bytes: s.response.bytes,
        stream_end,
        error_code,
    }));
    out.push(record);
}

/// What a plain stream's bodies add to its record (as an HTTP/1 request's would): the request's
/// completion parameters, and the response's id, token counts and server timings.
fn plain_bodies(p: &mut RequestProgress, exchange: Exchange, stats: &mut Stats) -> RequestSummary {
    let Exchange {
        request,
        response,
        events_unparsed,
        events_cut,
        event_too_large,
        ..
    } = exchange;
    if request.body_json_error {
        stats.bump(Counter::RequestBodyJsonError);
    }
    stats.add(Counter::SseJsonError, u64::from(events_unparsed));
    stats.add(Counter::SseEventsCut, u64::from(events_cut));
    if event_too_large {
        stats.bump(Counter::SseEventTooLarge);
        p.incomplete.get_or_insert(Reason::SseEventTooLarge);
    }
    p.truncated |= response.truncated;
    p.on_body(response, stats);
    request
}

fn side_ended(side: Side) -> EndedBy {
    match side {
        Side::Client => EndedBy::Client,
        Side::Server => EndedBy::Server,
    }
}

#[cfg(test)]
mod tests {
    use inferscope_common::SyscallKind;
    use inferscope_decode::{
        http::Limits,
        http2::{PREFACE, frame::kind, testwire::*},
    };
    use inferscope_model::{Counter, EndedBy};

    use crate::{
        capture::{Segment, SyscallEvent},
        correlate::{Peer, Tracker, arrivals::Arrival},
    };

    const MS: u64 = 1_000_000;

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

    /// An OpenAI-style streaming request on h2c (as an ASGI server on HTTP/2 answers it): its
    /// record has the request body's parameters, the SSE events as tokens, the completion id
    /// and the usage, as an HTTP/1.1 record would.
    #[test]
    fn an_sse_stream_inside_http2_is_a_record_with_its_tokens() {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer {
            sock: 0x78,
            ..Peer::default()
        };
        let mut out = Vec::new();
        let mut block = vec![0x83, 0x86];
        block.extend(indexed_name(4, "/v1/chat/completions"));
        block.extend(indexed_name(31, "application/json"));
        block.extend(literal("x-request-id", "req-7"));
        let mut read = PREFACE.to_vec();
        read.extend(settings(None));
        read.extend(frame(kind::HEADERS, END_HEADERS, 1, &block));
        let body = br#"{"model":"m7","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hey"}]}"#;
        read.extend(frame(kind::DATA, END_STREAM, 1, body));
        t.on_read(&ev(SyscallKind::Read, 10 * MS, &read), peer, &mut out);
        let mut head = settings(None);
        let mut response = vec![0x88];
        response.extend(indexed_name(31, "text/event-stream"));
        head.extend(frame(kind::HEADERS, END_HEADERS, 1, &response));
        t.on_write(&ev(SyscallKind::Write, 11 * MS, &head), peer, &mut out);
        for (ts, text) in [(15, "a"), (19, "b"), (27, "c")] {
            let event = format!(
                "data: {{\"id\":\"cmpl-7\",\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
            );
            let data = frame(kind::DATA, 0, 1, event.as_bytes());
            t.on_write(&ev(SyscallKind::Write, ts * MS, &data), peer, &mut out);
        }
        let usage = br#"data: {"id":"cmpl-7","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}

data: [DONE]

"#;
        let end = frame(kind::DATA, END_STREAM, 1, usage);
        t.on_write(&ev(SyscallKind::Write, 30 * MS, &end), peer, &mut out);

        assert_eq!(out.len(), 1);
        let r = &out[0];
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.x_request_id.as_deref(), Some("req-7"));
        assert_eq!(r.response_id.as_deref(), Some("cmpl-7"));
        assert_eq!(r.model.as_deref(), Some("m7"));
        assert_eq!((r.stream, r.max_tokens), (Some(true), Some(3)));
        assert_eq!(r.prompt_bytes, Some(3));
        assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(4), Some(3)));
        assert_eq!(r.output_chunks, 3);
        assert_eq!(r.ttft_ms, Some(5.0));
        assert_eq!(r.itl_max_ms, Some(8.0));
        assert_eq!(r.tpot_ms, Some(6.0));
        assert_eq!(r.incomplete, None);
        assert!(!r.capture_truncated);
        assert_eq!(r.http2.as_ref().map(|h| h.response_messages), Some(0));
        assert_eq!(t.stats.get(Counter::SseJsonError), 0);
    }

    /// An h2c connection: two gRPC calls, one server-streaming to its end, one reset by the
    /// client, become one record each instead of a connection "that never spoke HTTP".
    #[test]
    fn an_h2c_connection_gives_one_record_per_stream() {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer {
            sock: 0x77,
            ..Peer::default()
        };
        let mut out = Vec::new();
        let mut read = PREFACE.to_vec();
        read.extend(settings(None));
        read.extend(frame(
            kind::HEADERS,
            END_HEADERS,
            1,
            &request_block("/vllm.Engine/Generate"),
        ));
        read.extend(frame(kind::DATA, END_STREAM, 1, &grpc_message(30)));
        let second = frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &request_block("/vllm.Engine/Abort"),
        );
        // The segments that carried the two requests, before the reads.
        for (ts, bytes) in [(9_500_000, &read), (12_800_000, &second)] {
            t.on_segment(&Segment {
                ts_ns: ts,
                local_port: 8080,
                remote: "127.0.0.1".parse().unwrap(),
                remote_port: 40000,
                data_len: bytes.len() as u32,
                sock: 0x77,
            });
        }
        // The server speaks first: its SETTINGS on accept, before it reads the client's preface.
        t.on_write(
            &ev(SyscallKind::Write, 9 * MS, &settings(None)),
            peer,
            &mut out,
        );
        t.on_read(&ev(SyscallKind::Read, 10 * MS, &read), peer, &mut out);
        let mut write = frame(kind::SETTINGS, 1, 0, &[]);
        write.extend(frame(kind::HEADERS, END_HEADERS, 1, &response_block()));
        t.on_write(&ev(SyscallKind::Write, 12 * MS, &write), peer, &mut out);
        t.on_read(&ev(SyscallKind::Read, 13 * MS, &second), peer, &mut out);
        for ts in [30, 40, 60] {
            let data = frame(kind::DATA, 0, 1, &grpc_message(7));
            t.on_write(&ev(SyscallKind::Write, ts * MS, &data), peer, &mut out);
        }
        let reset = frame(kind::RST_STREAM, 0, 3, &8u32.to_be_bytes());
        t.on_read(&ev(SyscallKind::Read, 61 * MS, &reset), peer, &mut out);
        let trailers = frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &trailers_block("0"),
        );
        t.on_write(&ev(SyscallKind::Write, 70 * MS, &trailers), peer, &mut out);
        let mut close = ev(SyscallKind::Close, 80 * MS, b"");
        close.ret = 0;
        t.on_close(&close, &mut out);

        assert_eq!(out.len(), 2);
        let (abort, call) = (&out[0], &out[1]);
        assert_eq!(abort.path, "/vllm.Engine/Abort");
        assert_eq!(abort.ended_by, EndedBy::Client);
        assert_eq!(abort.arrival_wire_mono_ns, Some(12_800_000));
        let info = abort.http2.as_ref().unwrap();
        assert_eq!((info.stream_end, info.error_code), ("rst_stream", Some(8)));

        assert_eq!(call.method, "POST");
        assert_eq!(call.path, "/vllm.Engine/Generate");
        assert_eq!(call.status, Some(200));
        assert_eq!(call.ended_by, EndedBy::Complete);
        assert_eq!(call.arrival_read_mono_ns, 10 * MS);
        assert_eq!(call.arrival_wire_mono_ns, Some(9_500_000));
        assert_eq!(call.first_byte_mono_ns, Some(12 * MS));
        assert_eq!(call.ttft_ms, Some(20.5));
        assert_eq!(call.last_token_mono_ns, Some(60 * MS));
        assert_eq!(call.tpot_ms, Some(15.0));
        assert_eq!(call.itl_p50_ms, Some(10.0));
        assert_eq!(call.itl_max_ms, Some(20.0));
        assert_eq!(call.output_chunks, 3);
        assert_eq!(call.e2e_ms, 60.5);
        assert_eq!(call.request_id, format!("1-{}-1", call.connection_id));
        assert_eq!(call.incomplete, None);
        let info = call.http2.as_ref().unwrap();
        assert_eq!(info.content_type.as_deref(), Some("application/grpc"));
        assert_eq!(info.grpc_status, Some(0));
        assert_eq!((info.request_messages, info.request_message_bytes), (1, 30));
        assert_eq!(
            (info.response_messages, info.response_message_bytes),
            (3, 21)
        );
        assert_eq!(info.stream_end, "end_stream");
        let json = serde_json::to_string(call).unwrap();
        assert!(json.contains("\"http2\":{\"stream_id\":1"), "{json}");

        assert_eq!(t.stats.get(Counter::Http2Connections), 1);
        assert_eq!(t.stats.get(Counter::ConnectionsNeverHttp), 0);
        assert_eq!(t.stats.get(Counter::ResponseWithoutRequest), 0);
        assert_eq!(t.stats.get(Counter::H2FramesMalformed), 0);
        assert_eq!(t.stats.get(Counter::H2HpackUnknownFields), 0);
        assert_eq!(t.stats.get(Counter::H2ResyncBytesSkipped), 0);
        assert_eq!(t.stats.get(Counter::H2Streams), 2);
        assert_eq!(t.stats.get(Counter::ArrivalWireUnknown), 0);
        assert!(t.arrivals.is_empty(), "every segment consumed");
    }

    /// `vllm serve --grpc`: a Generate call's record names the request id its message carried
    /// (the key of the engine join); a compressed message's id is counted unread; a method
    /// vLLM's plugin does not declare reads nothing.
    #[test]
    fn an_engine_grpc_call_carries_the_request_id_of_its_message() {
        let mut t = Tracker::new(Limits::default());
        t.set_engine(1, "vllm");
        let peer = Peer::default();
        let mut out = Vec::new();
        let generate = "/vllm.grpc.engine.VllmEngine/Generate";
        // GenerateRequest { request_id: "grpc-7", tokenized: { input_ids: [9] }, stream: true }
        let message: &[u8] = b"\x0a\x06grpc-7\x12\x03\x12\x01\x09\x28\x01";
        let mut prefixed = vec![0];
        prefixed.extend((message.len() as u32).to_be_bytes());
        prefixed.extend(message);
        let mut compressed = prefixed.clone();
        compressed[0] = 1;
        let mut read = PREFACE.to_vec();
        for (stream, path, body) in [
            (1, generate, &prefixed),
            (3, generate, &compressed),
            (5, "/vllm.grpc.engine.VllmEngine/HealthCheck", &prefixed),
        ] {
            read.extend(frame(
                kind::HEADERS,
                END_HEADERS,
                stream,
                &request_block(path),
            ));
            read.extend(frame(kind::DATA, END_STREAM, stream, body));
        }
        t.on_read(&ev(SyscallKind::Read, 10 * MS, &read), peer, &mut out);
        for stream in [1, 3, 5] {
            let mut write = frame(kind::HEADERS, END_HEADERS, stream, &response_block());
            write.extend(frame(kind::DATA, 0, stream, &grpc_message(4)));
            write.extend(frame(
                kind::HEADERS,
                END_HEADERS | END_STREAM,
                stream,
                &trailers_block("0"),
            ));
            t.on_write(&ev(SyscallKind::Write, 20 * MS, &write), peer, &mut out);
        }
        assert_eq!(out.len(), 3);
        let ids: Vec<_> = out.iter().map(|r| r.rpc_request_id.as_deref()).collect();
        assert_eq!(ids, [Some("grpc-7"), None, None]);
        assert_eq!(t.stats.get(Counter::RpcRequestIdsRead), 1);
        assert_eq!(t.stats.get(Counter::RpcRequestIdsUnread), 1);
    }

    /// A protobuf length-delimited field (under 128 bytes).
    fn pb(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut v = vec![number << 3 | 2, bytes.len() as u8];
        v.extend(bytes);
        v
    }

    fn grpc(message: &[u8]) -> Vec<u8> {
        let mut v = vec![0];
        v.extend((message.len() as u32).to_be_bytes());
        v.extend(message);
        v
    }

    /// `ModelInferRequest { model_name, id, inputs }`.
    fn infer_request(id: &str) -> Vec<u8> {
        let input = [pb(1, b"text_input"), pb(2, b"BYTES")].concat();
        grpc(&[pb(1, b"ensemble"), pb(3, id.as_bytes()), pb(5, &input)].concat())
    }

    /// `ModelStreamInferResponse { error_message, infer_response { model_name, id,
    /// parameters { "triton_final_response": { bool_param } }, outputs } }`.
    fn stream_response(id: &str, last: bool, error: &str) -> Vec<u8> {
        let flag = [
            pb(1, b"triton_final_response"),
            pb(2, &[0x08, u8::from(last)]),
        ]
        .concat();
        let inner = [
            pb(1, b"ensemble"),
            pb(3, id.as_bytes()),
            pb(4, &flag),
            pb(5, &pb(1, b"text_output")),
        ]
        .concat();
        let mut message = Vec::new();
        if !error.is_empty() {
            message.extend(pb(1, error.as_bytes()));
        }
        message.extend(pb(2, &inner));
        grpc(&message)
    }

    const STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

    /// A tracker whose connection opened a `ModelStreamInfer` stream at 10 ms and sent call "a"
    /// on it.
    fn call_stream_opened_with_a() -> (Tracker, Peer, Vec<inferscope_model::RequestRecord>) {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer::default();
        let mut out = Vec::new();
        let mut read = PREFACE.to_vec();
        read.extend(frame(
            kind::HEADERS,
            END_HEADERS,
            1,
            &request_block(STREAM_INFER),
        ));
        read.extend(frame(kind::DATA, 0, 1, &infer_request("a")));
        t.on_read(&ev(SyscallKind::Read, 10 * MS, &read), peer, &mut out);
        (t, peer, out)
    }

    /// Triton's `ModelStreamInfer`: one stream, many calls. Each request message is a record of
    /// its own, matched to its responses by id whatever their order, ended by its final flag, an
    /// error, or the stream's end; the stream itself is no record.
    #[test]
    fn a_stream_of_calls_gives_one_record_per_call() {
        let (mut t, peer, mut out) = call_stream_opened_with_a();
        // b's message split across two reads: its call starts at the first.
        let b = frame(kind::DATA, 0, 1, &infer_request("b"));
        t.on_read(&ev(SyscallKind::Read, 11 * MS, &b[..12]), peer, &mut out);
        t.on_read(
            &ev(SyscallKind::Read, 11 * MS + 500, &b[12..]),
            peer,
            &mut out,
        );
        let mut write = frame(kind::HEADERS, END_HEADERS, 1, &response_block());
        write.extend(frame(kind::DATA, 0, 1, &stream_response("a", false, "")));
        t.on_write(&ev(SyscallKind::Write, 12 * MS, &write), peer, &mut out);
        for (ts, id, last, error) in [
            (13, "b", false, ""),
            (14, "a", false, ""),
            (15, "a", true, ""),
        ] {
            let w = frame(kind::DATA, 0, 1, &stream_response(id, last, error));
            t.on_write(&ev(SyscallKind::Write, ts * MS, &w), peer, &mut out);
        }
        assert_eq!(out.len(), 1, "a ended by its final response");
        let c = frame(kind::DATA, 0, 1, &infer_request("c"));
        t.on_read(&ev(SyscallKind::Read, 16 * MS, &c), peer, &mut out);
        for (ts, id, last, error) in [(17, "c", true, "model failed"), (18, "zz", true, "")] {
            let w = frame(kind::DATA, 0, 1, &stream_response(id, last, error));
            t.on_write(&ev(SyscallKind::Write, ts * MS, &w), peer, &mut out);
        }
        assert_eq!(out.len(), 2, "c ended by its error");
        t.on_read(
            &ev(
                SyscallKind::Read,
                19 * MS,
                &frame(kind::DATA, END_STREAM, 1, b""),
            ),
            peer,
            &mut out,
        );
        let trailers = frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &trailers_block("0"),
        );
        t.on_write(&ev(SyscallKind::Write, 20 * MS, &trailers), peer, &mut out);
        assert_eq!(out.len(), 3, "b ended with the stream");

        let call = |id: &str| {
            out.iter()
                .find(|r| r.rpc_request_id.as_deref() == Some(id))
                .unwrap()
        };
        let (a, b, c) = (call("a"), call("b"), call("c"));
        for r in [a, b, c] {
            assert_eq!(r.path, STREAM_INFER);
            assert_eq!(r.method, "POST");
            let h2 = r.http2.as_ref().unwrap();
            assert_eq!((h2.stream_id, h2.request_messages), (1, 1));
        }
        assert_eq!(a.arrival_read_mono_ns, 10 * MS);
        assert_eq!(a.first_token_mono_ns, Some(12 * MS));
        assert_eq!(a.last_token_mono_ns, Some(15 * MS));
        assert_eq!(a.output_chunks, 3);
        assert_eq!(a.ended_by, EndedBy::Complete);
        assert_eq!(a.http2.as_ref().unwrap().stream_end, "final_response");
        assert_eq!(b.arrival_read_mono_ns, 11 * MS);
        assert_eq!(b.first_token_mono_ns, Some(13 * MS));
        assert_eq!(b.output_chunks, 1);
        assert_eq!(b.http2.as_ref().unwrap().stream_end, "end_stream");
        assert_eq!(b.http2.as_ref().unwrap().grpc_status, Some(0));
        assert_eq!(c.http2.as_ref().unwrap().stream_end, "error_response");
        assert_eq!(c.first_token_mono_ns, Some(17 * MS));
        assert_eq!(t.stats.get(Counter::GrpcStreamCalls), 3);
        assert_eq!(t.stats.get(Counter::GrpcStreamResponsesUnmatched), 1);
        assert_eq!(t.stats.get(Counter::GrpcStreamCallsUnended), 1);
        assert_eq!(t.stats.get(Counter::RpcRequestIdsRead), 3);
    }

    /// A cut read loses a call stream's framing: the stream takes up again at the next DATA
    /// frame that begins a call's message, instead of staying dark for the rest of its life.
    #[test]
    fn a_stream_of_calls_takes_up_again_after_a_loss() {
        let (mut t, peer, mut out) = call_stream_opened_with_a();
        // b and c in one read the capture cut inside b: c's frame header is lost with it.
        let mut cut = frame(kind::DATA, 0, 1, &infer_request("b"));
        cut.extend(frame(kind::DATA, 0, 1, &infer_request("c")));
        let mut r = ev(SyscallKind::Read, 11 * MS, &cut[..12]);
        r.ret = cut.len() as i64;
        r.truncated = true;
        t.on_read(&r, peer, &mut out);
        let d = frame(kind::DATA, 0, 1, &infer_request("d"));
        t.on_read(&ev(SyscallKind::Read, 12 * MS, &d), peer, &mut out);
        let mut write = frame(kind::HEADERS, END_HEADERS, 1, &response_block());
        for id in ["a", "d"] {
            write.extend(frame(kind::DATA, 0, 1, &stream_response(id, true, "")));
        }
        t.on_write(&ev(SyscallKind::Write, 13 * MS, &write), peer, &mut out);
        let ids: Vec<_> = out.iter().map(|r| r.rpc_request_id.as_deref()).collect();
        assert_eq!(ids, [Some("a"), Some("d")]);
        assert_eq!(out[1].arrival_read_mono_ns, 12 * MS);
        assert_eq!(t.stats.get(Counter::H2FramingLost), 1);
        assert_eq!(t.stats.get(Counter::GrpcStreamResyncs), 1);
    }

    fn seg(ts_ns: u64, len: u32) -> Arrival {
        Arrival { ts_ns, len }
    }

    /// TLS: the call's segment is the first after the last read of earlier frames, else the
    /// latest before the call; window updates coalesced as large as a request never stand for
    /// a call they came before.
    #[test]
    fn a_tls_call_takes_the_segment_its_bytes_can_be_in() {
        use super::{Began, TlsArrivals};
        // Window updates (105 bytes) read alone, then the call's segment.
        let mut t = TlsArrivals::default();
        t.add(&[seg(1, 105)]);
        t.after_read(Began::Nothing);
        t.add(&[seg(2, 176)]);
        assert_eq!(t.candidates(), [2]);
        // The call's segment, then window updates, before the server read either.
        let mut t = TlsArrivals::default();
        t.add(&[seg(1, 176), seg(2, 105)]);
        assert_eq!(t.candidates()[0], 1);
        // Both before a read of the window updates: the latest.
        let mut t = TlsArrivals::default();
        t.add(&[seg(1, 105), seg(2, 176)]);
        t.after_read(Began::Nothing);
        assert_eq!(t.candidates(), [2]);
        // A header block read over two reads keeps the candidates of its first.
        let mut t = TlsArrivals::default();
        t.add(&[seg(1, 176)]);
        t.after_read(Began::Block);
        t.add(&[seg(2, 105)]);
        assert_eq!(t.candidates(), [1]);
        t.after_read(Began::Call { more: false });
        // Control-sized segments alone: the latest of them.
        t.add(&[seg(3, 35), seg(4, 40)]);
        assert_eq!(t.candidates(), [4]);
    }

    /// A stream open when the connection closes ends with it; one whose message boundaries were
    /// lost says so.
    #[test]
    fn streams_cut_by_the_close_end_with_it() {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer::default();
        let mut out = Vec::new();
        let mut read = PREFACE.to_vec();
        read.extend(frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &request_block("/a.A/A"),
        ));
        t.on_read(&ev(SyscallKind::Read, MS, &read), peer, &mut out);
        let mut write = frame(kind::HEADERS, END_HEADERS, 1, &response_block());
        write.extend(&grpc_message(10)[..3]);
        let mut w = ev(SyscallKind::Write, 2 * MS, &write);
        w.ret += 20;
        t.on_write(&w, peer, &mut out);
        let mut close = ev(SyscallKind::Close, 3 * MS, b"");
        close.ret = 0;
        t.on_close(&close, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].ended_by, EndedBy::Server);
        assert_eq!(out[0].incomplete.as_deref(), Some("http2_framing"));
        assert!(out[0].capture_truncated);
        assert_eq!(out[0].http2.as_ref().unwrap().stream_end, "closed");
    }

    /// The client's EOF with a stream open: the record ends there, cut by the client.
    #[test]
    fn a_client_that_leaves_ends_its_open_streams() {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer::default();
        let mut out = Vec::new();
        let mut read = PREFACE.to_vec();
        read.extend(frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &request_block("/a.A/A"),
        ));
        t.on_read(&ev(SyscallKind::Read, MS, &read), peer, &mut out);
        let write = frame(kind::HEADERS, END_HEADERS, 1, &response_block());
        t.on_write(&ev(SyscallKind::Write, 2 * MS, &write), peer, &mut out);
        let mut eof = ev(SyscallKind::Read, 3 * MS, b"");
        eof.ret = 0;
        t.on_read(&eof, peer, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].ended_by, EndedBy::Client);
        assert!(out[0].aborted);
        assert_eq!(out[0].end_mono_ns, 3 * MS);
        let mut close = ev(SyscallKind::Close, 4 * MS, b"");
        close.ret = 0;
        t.on_close(&close, &mut out);
        assert_eq!(out.len(), 1);
    }

    /// A server whose first write looks like HTTP/2's SETTINGS, and a client that then sends
    /// HTTP/1.1: the connection is decoded as HTTP/1.1.
    #[test]
    fn a_settings_lookalike_before_an_http1_request_does_not_hide_it() {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer::default();
        let mut out = Vec::new();
        t.on_write(&ev(SyscallKind::Write, MS, &settings(None)), peer, &mut out);
        t.on_read(
            &ev(
                SyscallKind::Read,
                2 * MS,
                b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n",
            ),
            peer,
            &mut out,
        );
        t.on_write(
            &ev(
                SyscallKind::Write,
                3 * MS,
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            ),
            peer,
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].path, "/x");
        assert!(out[0].http2.is_none());
    }

    /// A gRPC channel that predates the agent: its reads are whole HTTP/2 frames, so it is
    /// decoded from there; the path its client sends by an HPACK index from before reads
    /// `unknown`, a path sent as a literal reads.
    #[test]
    fn an_h2c_connection_joined_mid_stream_is_decoded_from_there() {
        let mut t = Tracker::new(Limits::default());
        let peer = Peer::default();
        let mut out = Vec::new();
        let indexed = frame(kind::HEADERS, END_HEADERS | END_STREAM, 41, &[0x83, 0xbe]);
        t.on_read(&ev(SyscallKind::Read, MS, &indexed), peer, &mut out);
        let literal = frame(
            kind::HEADERS,
            END_HEADERS | END_STREAM,
            43,
            &request_block("/b.B/Known"),
        );
        t.on_read(&ev(SyscallKind::Read, 2 * MS, &literal), peer, &mut out);
        let mut write = frame(kind::HEADERS, END_HEADERS | END_STREAM, 41, &[0x88]);
        write.extend(frame(kind::HEADERS, END_HEADERS | END_STREAM, 43, &[0x88]));
        t.on_write(&ev(SyscallKind::Write, 3 * MS, &write), peer, &mut out);
        let paths: Vec<_> = out.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, vec!["unknown", "/b.B/Known"]);
        assert_eq!(t.stats.get(Counter::Http2Connections), 1);
        assert_eq!(t.stats.get(Counter::H2HpackUnknownFields), 1);
        assert_eq!(t.stats.get(Counter::ConnectionsNeverHttp), 0);
    }
}
