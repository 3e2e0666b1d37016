//! Both directions of one HTTP/2 connection: each direction's framer and HPACK decoder, and the
//! streams they share, summarised as they end.

use inferscope_model::{Counter, Stats};
use rustc_hash::FxHashMap;

use super::{
    Limits, Side, Start,
    body::Held,
    frame::{BlockLoss, Frame, FrameDecoder},
    hpack::{self, Field},
    stream::{EndedBy, Fields, NamesACall, Piece, Stream, StreamMessage, StreamSummary},
};
use crate::http::Chunk;

/// One HTTP/2 connection seen from the server's socket.
#[derive(Debug)]
pub struct Http2Connection {
    limits: Limits,
    client: FrameDecoder,
    server: FrameDecoder,
    /// HPACK state of the client's header blocks, then the server's.
    hpack: [hpack::Decoder; 2],
    streams: FxHashMap<u32, Stream>,
    /// The highest stream id the client opened: ids only grow.
    max_client_stream: u32,
    /// Streams opened so far (followed ones).
    opened: u32,
    /// The last GOAWAY seen, for streams the close cuts afterwards.
    goaway: Option<EndedBy>,
    pairing: Option<Pairing>,
    /// The request id field of a `:path`'s first request message, if its protocol has one.
    id_field_of: Option<fn(&str) -> Option<u32>>,
    /// Messages of paired streams that ended, until taken.
    paired: Vec<StreamMessage>,
    /// Body bytes its plain streams hold (see [`super::body::MAX_HELD_BYTES`]).
    held: Held,
}

/// Which `:path`s carry one call per request message (see [`Stream::pair_messages`]), and how
/// their messages are known after a loss.
#[derive(Debug, Clone, Copy)]
struct Pairing {
    pairs: fn(&str) -> bool,
    names_a_call: NamesACall,
}

/// Paired messages held between two [`Http2Connection::take_paired`] calls; more are counted
/// and dropped (one syscall of tiny messages could otherwise queue thousands).
pub const MAX_PAIRED_MESSAGES: usize = 4096;

/// What one frame's handling needs, borrowed apart from the framer producing it.
struct Handler<'a> {
    side: Side,
    ts_ns: u64,
    limits: Limits,
    hpack: &'a mut [hpack::Decoder; 2],
    streams: &'a mut FxHashMap<u32, Stream>,
    max_client_stream: &'a mut u32,
    opened: &'a mut u32,
    held: &'a Held,
    goaway: &'a mut Option<EndedBy>,
    pairing: Option<Pairing>,
    id_field_of: Option<fn(&str) -> Option<u32>>,
    paired: &'a mut Vec<StreamMessage>,
    stats: &'a mut Stats,
    out: &'a mut Vec<StreamSummary>,
    /// Where the header block being handled began in its direction's bytes.
    block_at: Option<u64>,
}

impl Http2Connection {
    pub fn new(limits: Limits, start: Start) -> Self {
        let fresh = start == Start::Fresh;
        let table = |_| {
            if fresh {
                hpack::Decoder::fresh(limits.max_table_bytes)
            } else {
                hpack::Decoder::mid_connection(limits.max_table_bytes)
            }
        };
        Self {
            limits,
            client: FrameDecoder::new(fresh, false, limits.max_header_block_bytes),
            server: FrameDecoder::new(false, fresh, limits.max_header_block_bytes),
            hpack: [table(0), table(1)],
            streams: FxHashMap::default(),
            max_client_stream: 0,
            opened: 0,
            goaway: None,
            pairing: None,
            id_field_of: None,
            paired: Vec::new(),
            held: Held::default(),
        }
    }

    /// Streams whose `:path` `pairs` accepts carry one call per request message: their
    /// messages are handed over one by one ([`Self::take_paired`]). After a loss of their
    /// message boundaries, they take up again at a DATA frame whose message `names_a_call`.
    pub fn pair_messages_of(&mut self, pairs: fn(&str) -> bool, names_a_call: NamesACall) {
        self.pairing = Some(Pairing {
            pairs,
            names_a_call,
        });
    }

    /// A stream whose `:path` `id_field_of` names a field has that field of its first request
    /// message read ([`StreamSummary::request_id`]).
    pub fn scan_ids_of(&mut self, id_field_of: fn(&str) -> Option<u32>) {
        self.id_field_of = Some(id_field_of);
    }

    /// The messages of paired streams that ended since the last call, in order.
    pub fn take_paired(&mut self) -> std::vec::Drain<'_, StreamMessage> {
        self.paired.drain(..)
    }

    /// Whether the client did not begin with the HTTP/2 preface: nothing is decoded.
    pub fn not_http2(&self) -> bool {
        self.client.failed()
    }

    /// Bytes the client sent so far (see [`FrameDecoder::position`]): where the next read's
    /// bytes begin.
    pub fn client_position(&self) -> Option<u64> {
        self.client.position()
    }

    /// The client's HEADERS frames begun so far, and whether one's header block is still being
    /// gathered: which read began a request (see [`FrameDecoder::blocks_begun`]).
    pub fn client_blocks(&self) -> (u32, bool) {
        (self.client.blocks_begun(), self.client.block_open())
    }

    /// Streams opened so far (see `StreamSummary::open_seq`).
    pub fn opened(&self) -> u32 {
        self.opened
    }

    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// One syscall's bytes: `Side::Client` for what the server read, `Side::Server` for what it
    /// wrote. Streams that end are appended to `out`.
    pub fn feed(
        &mut self,
        side: Side,
        chunk: Chunk<'_>,
        stats: &mut Stats,
        out: &mut Vec<StreamSummary>,
    ) {
        let mut h = Handler {
            side,
            ts_ns: chunk.ts_ns,
            limits: self.limits,
            hpack: &mut self.hpack,
            streams: &mut self.streams,
            max_client_stream: &mut self.max_client_stream,
            opened: &mut self.opened,
            held: &self.held,
            goaway: &mut self.goaway,
            pairing: self.pairing,
            id_field_of: self.id_field_of,
            paired: &mut self.paired,
            stats,
            out,
            block_at: None,
        };
        let frames = match side {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        };
        frames.feed(chunk.bytes, chunk.lost, &mut |f| h.frame(f));
    }

    /// Body bytes its plain streams hold now.
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.held.bytes()
    }

    /// The connection closed (or the agent stops): open streams end here.
    pub fn close(&mut self, ts_ns: u64, stats: &mut Stats, out: &mut Vec<StreamSummary>) {
        let by = self.goaway.unwrap_or(EndedBy::ConnectionClosed);
        let mut ids: Vec<u32> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(s) = self.streams.remove(&id) {
                stats.bump(Counter::H2Streams);
                if s.grpc_framing_lost() {
                    stats.bump(Counter::GrpcMessageFramingLost);
                }
                out.push(s.finish(by, ts_ns));
            }
        }
    }
}

impl Handler<'_> {
    fn frame(&mut self, frame: Frame<'_>) {
        let side = self.side;
        let ts = self.ts_ns;
        match frame {
            Frame::Data {
                stream_id,
                bytes,
                at,
                starts_frame,
            } => {
                if let Some(s) = self.streams.get_mut(&stream_id) {
                    let piece = Piece {
                        bytes,
                        ts_ns: ts,
                        at,
                        starts_frame,
                    };
                    if s.data(
                        side,
                        piece,
                        self.paired,
                        self.pairing.map(|p| p.names_a_call),
                    ) {
                        self.stats.bump(Counter::GrpcStreamResyncs);
                    }
                    self.bound_paired();
                }
            }
            Frame::DataLost { stream_id, len } => {
                self.stats.add(Counter::H2DataBytesLost, len);
                if let Some(s) = self.streams.get_mut(&stream_id) {
                    s.data_lost(side, len, ts, self.paired);
                    self.bound_paired();
                }
            }
            Frame::DataEnd {
                stream_id,
                end_stream,
            } => match self.streams.get_mut(&stream_id) {
                Some(s) if end_stream => {
                    s.data_frame_end(side, ts);
                    s.end(side, ts);
                    self.finish_if_done(stream_id);
                }
                Some(s) => s.data_frame_end(side, ts),
                None => self.stats.bump(Counter::H2FramesUntracked),
            },
            Frame::HeaderBlock {
                stream_id,
                block,
                end_stream,
                push,
                at,
            } => {
                self.block_at = at;
                let fields = self.decode(block);
                if !push {
                    self.headers(stream_id, fields, end_stream, false);
                }
            }
            Frame::HeaderBlockLost {
                stream_id,
                end_stream,
                push,
                why,
                at,
            } => {
                self.block_at = at;
                self.stats.bump(match why {
                    BlockLoss::TooLarge => Counter::H2HeaderBlocksTooLarge,
                    BlockLoss::Broken => Counter::H2HeaderBlocksLost,
                });
                self.hpack_of(side).desync();
                if !push {
                    self.headers(stream_id, Fields::all_unknown(), end_stream, true);
                }
            }
            Frame::RstStream {
                stream_id,
                error_code,
            } => {
                if let Some(s) = self.streams.remove(&stream_id) {
                    self.emit(
                        s,
                        EndedBy::Reset {
                            by: side,
                            error_code,
                        },
                    );
                } else {
                    self.stats.bump(Counter::H2FramesUntracked);
                }
            }
            Frame::GoAway {
                last_stream_id,
                error_code,
            } => self.goaway(last_stream_id, error_code),
            Frame::Settings {
                ack: false,
                header_table_size: Some(size),
            } => {
                // A peer's SETTINGS bound the other side's encoder.
                self.hpack_of(side.other()).peer_allows(size);
            }
            Frame::Settings { .. }
            | Frame::Ping { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Priority { .. }
            | Frame::Unknown { .. } => {}
            Frame::Malformed { .. } => self.stats.bump(Counter::H2FramesMalformed),
            Frame::FramingLost => {
                self.stats.bump(Counter::H2FramingLost);
                self.hpack_of(side).desync();
                for s in self.streams.values_mut() {
                    s.abandon(side);
                }
            }
            Frame::Resynced { skipped } => {
                self.stats.bump(Counter::H2Resyncs);
                self.stats.add(Counter::H2ResyncBytesSkipped, skipped);
            }
            Frame::NotHttp2 => self.stats.bump(Counter::H2NotHttp2),
            Frame::Preface => {
                // Nothing was encoded before the preface: both tables are empty and known.
                let cap = self.limits.max_table_bytes;
                *self.hpack = [hpack::Decoder::fresh(cap), hpack::Decoder::fresh(cap)];
            }
        }
    }

    fn bound_paired(&mut self) {
        if self.paired.len() > MAX_PAIRED_MESSAGES {
            let over = self.paired.len() - MAX_PAIRED_MESSAGES;
            self.paired.truncate(MAX_PAIRED_MESSAGES);
            self.stats
                .add(Counter::GrpcPairedMessagesDropped, over as u64);
        }
    }

    fn hpack_of(&mut self, side: Side) -> &mut hpack::Decoder {
        let [client, server] = &mut *self.hpack;
        match side {
            Side::Client => client,
            Side::Server => server,
        }
    }

    fn decode(&mut self, block: &[u8]) -> Fields {
        let mut fields = Fields::default();
        let result = self.hpack_of(self.side).decode(block, &mut |h| {
            fields.add(known(h.name), known(h.value));
        });
        match result {
            Ok(block_stats) => {
                if block_stats.resynced {
                    self.stats.bump(Counter::H2HpackResyncs);
                }
            }
            Err(_) => {
                self.stats.bump(Counter::H2HpackErrors);
                // Fields after the error are unknown; so may be the ones it hid.
                fields.unknown += 1;
            }
        }
        self.stats
            .add(Counter::H2HpackUnknownFields, u64::from(fields.unknown));
        fields.finish();
        fields
    }

    fn headers(&mut self, stream_id: u32, fields: Fields, end_stream: bool, lost: bool) {
        let ts = self.ts_ns;
        match self.side {
            Side::Client => self.client_headers(stream_id, fields, end_stream, lost),
            Side::Server => match self.streams.get_mut(&stream_id) {
                Some(s) => {
                    s.summary.headers_lost |= lost;
                    s.server_headers(fields, end_stream, ts);
                    self.finish_if_done(stream_id);
                }
                None => {
                    // Its request was not followed: opened before we attached, or over the
                    // stream limit.
                    self.stats.bump(Counter::H2FramesUntracked);
                }
            },
        }
    }

    fn client_headers(&mut self, stream_id: u32, fields: Fields, end_stream: bool, lost: bool) {
        let ts = self.ts_ns;
        if let Some(s) = self.streams.get_mut(&stream_id) {
            if !s.request_ended {
                // A second block before the request's END_STREAM is its trailers (RFC 9113
                // §8.1), whatever fields we could or could not read in it.
                s.summary.headers_lost |= lost;
                if end_stream {
                    s.end(Side::Client, ts);
                }
                return;
            }
            if !fields.names_a_request() {
                self.stats.bump(Counter::H2FramesUntracked);
                return;
            }
            // A new request on an id in use: RFC 9113 §5.1.1 forbids it; end the old one.
            self.stats.bump(Counter::H2StreamIdsReused);
            if let Some(old) = self.streams.remove(&stream_id) {
                self.emit(old, EndedBy::IdReused);
            }
        } else if stream_id <= *self.max_client_stream {
            if !fields.names_a_request() {
                // Trailers of a stream already summarised (the server ended first), or of one
                // not followed.
                self.stats.bump(Counter::H2FramesUntracked);
                return;
            }
            self.stats.bump(Counter::H2StreamIdsReused);
        }
        *self.max_client_stream = (*self.max_client_stream).max(stream_id);
        if self.streams.len() >= self.limits.max_streams {
            self.stats.bump(Counter::H2StreamsOverLimit);
            return;
        }
        let pairs = self
            .pairing
            .zip(fields.path.known())
            .is_some_and(|(pairing, path)| (pairing.pairs)(path));
        let id_field = self
            .id_field_of
            .zip(fields.path.known())
            .and_then(|(id_field_of, path)| id_field_of(path));
        let mut s = Stream::open(stream_id, fields, end_stream, ts, self.held.clone());
        if pairs {
            s.pair_messages();
        }
        if let Some(number) = id_field {
            s.scan_request_id(number);
        }
        s.summary.headers_lost = lost;
        s.summary.open_seq = *self.opened;
        s.summary.request_at = self.block_at;
        *self.opened = self.opened.wrapping_add(1);
        self.streams.insert(stream_id, s);
    }

    /// GOAWAY from `side`: the streams its peer opened above `last_stream_id` were not and will
    /// not be processed.
    fn goaway(&mut self, last_stream_id: u32, error_code: u32) {
        let by = EndedBy::GoAway {
            by: self.side,
            last_stream_id,
            error_code,
        };
        *self.goaway = Some(by);
        if self.side == Side::Client {
            // It concerns streams the server pushed: none are followed.
            return;
        }
        let mut cut: Vec<u32> = self
            .streams
            .keys()
            .copied()
            .filter(|&id| id > last_stream_id)
            .collect();
        cut.sort_unstable();
        for id in cut {
            if let Some(s) = self.streams.remove(&id) {
                self.emit(s, by);
            }
        }
    }

    fn finish_if_done(&mut self, stream_id: u32) {
        if self.streams.get(&stream_id).is_some_and(Stream::done)
            && let Some(s) = self.streams.remove(&stream_id)
        {
            self.emit(s, EndedBy::EndStream);
        }
    }

    fn emit(&mut self, s: Stream, by: EndedBy) {
        self.stats.bump(Counter::H2Streams);
        if s.grpc_framing_lost() {
            self.stats.bump(Counter::GrpcMessageFramingLost);
        }
        self.out.push(s.finish(by, self.ts_ns));
    }
}

fn known(f: Field<'_>) -> Option<&[u8]> {
    match f {
        Field::Known(b) => Some(b),
        Field::Unknown => None,
    }
}
