//! One HTTP/2 stream as an inference request: the fields of its header blocks, its gRPC
//! messages each way, how it ended. Only sizes, counts, timestamps and a few short header values
//! are kept.

use super::{
    Side, Value,
    body::{Exchange, Held, PlainBodies},
    grpc::{Message, MessageReader},
};

/// Messages one way of a stream.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Messages {
    /// gRPC messages whose end was seen.
    pub count: u32,
    /// Their lengths, summed, and the largest (the 5-byte prefixes not included).
    pub bytes: u64,
    pub max_bytes: u32,
    /// DATA payload bytes (padding excluded), messages or not.
    pub data_bytes: u64,
    /// The syscall that carried the first byte of the first message, and the one that ended the
    /// last message: first and last token of a server-streaming completion.
    pub first_ts_ns: Option<u64>,
    pub last_ts_ns: Option<u64>,
    /// DATA bytes the capture lost: sizes may be short.
    pub data_lost: bool,
    /// Message boundaries were lost: `count` stops short.
    pub framing_lost: bool,
    /// The time from each message's end to the next one's (inter-token gaps), in ns saturated
    /// at u32 (4.3 s); the first [`MAX_GAPS`] only, the rest counted in `gaps_dropped`.
    pub gaps_ns: Vec<u32>,
    pub gaps_dropped: u64,
}

/// Gaps kept per stream and direction: up to 64 KiB each, allocated as a stream grows (a
/// connection's 256 streams could otherwise hold far more than one HTTP/1 request does).
pub(super) const MAX_GAPS: usize = 16 * 1024;

impl Messages {
    /// One more message that ended.
    pub fn add(&mut self, m: &Message) {
        self.bytes = self.bytes.saturating_add(u64::from(m.len));
        self.max_bytes = self.max_bytes.max(m.len);
        self.stamp(m.first_ts_ns, m.last_ts_ns);
    }

    /// One more token event of a plain stream's token stream (SSE or JSON lines), whole at
    /// `ts_ns`.
    pub(super) fn add_event(&mut self, ts_ns: u64) {
        self.stamp(ts_ns, ts_ns);
    }

    fn stamp(&mut self, first_ts_ns: u64, last_ts_ns: u64) {
        self.count = self.count.saturating_add(1);
        self.first_ts_ns.get_or_insert(first_ts_ns);
        if let Some(previous) = self.last_ts_ns {
            if self.gaps_ns.len() < MAX_GAPS {
                let gap = last_ts_ns.saturating_sub(previous);
                self.gaps_ns.push(u32::try_from(gap).unwrap_or(u32::MAX));
            } else {
                self.gaps_dropped += 1;
            }
        }
        self.last_ts_ns = Some(last_ts_ns);
    }
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedBy {
    /// Both sides sent END_STREAM (or the server did, which ends the exchange).
    EndStream,
    /// RST_STREAM from `by`, with its error code.
    Reset { by: Side, error_code: u32 },
    /// GOAWAY from `by`: the stream was above `last_stream_id`, or still open when the
    /// connection closed after it.
    GoAway {
        by: Side,
        last_stream_id: u32,
        error_code: u32,
    },
    /// The connection closed (or the agent stopped) with the stream open.
    ConnectionClosed,
    /// The client opened the same stream id again before the stream ended.
    IdReused,
    /// The framing of the connection was lost while the stream was open.
    FramingLost,
}

/// A stream, summarised once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    pub stream_id: u32,
    pub method: Value<String>,
    pub path: Value<String>,
    pub content_type: Value<String>,
    pub x_request_id: Value<String>,
    /// The request's W3C `traceparent`, as a caller or router propagated it.
    pub traceparent: Value<String>,
    pub status: Value<u16>,
    pub grpc_status: Value<u32>,
    pub grpc_message: Value<String>,
    /// The request's HEADERS, and the request's END_STREAM.
    pub request_ts_ns: u64,
    pub request_end_ts_ns: Option<u64>,
    /// The response's (non-informational) HEADERS, and the response's END_STREAM.
    pub response_ts_ns: Option<u64>,
    pub response_end_ts_ns: Option<u64>,
    pub request: Messages,
    pub response: Messages,
    pub ended_by: EndedBy,
    pub end_ts_ns: u64,
    /// A header block of the stream could not be decoded (its fields read unknown).
    pub headers_lost: bool,
    /// How many streams the connection had opened before this one: streams opened by one
    /// syscall take its segments in this order.
    pub open_seq: u32,
    /// Where the request's HEADERS frame began in the client's bytes (see
    /// [`super::Http2Connection::client_position`]); None once a loss of unknown size hid it.
    pub request_at: Option<u64>,
    /// The request id field of the request's first gRPC message, where the stream's path names
    /// one (see [`Stream::scan_request_id`]).
    pub request_id: MessageId,
    /// The stream carries many calls, one per request message (see [`StreamMessage`]): its
    /// messages were handed over one by one as they ended.
    pub paired: bool,
    /// A plain stream's bodies (not gRPC): an OpenAI-style request and its token stream, whose
    /// content events are `response`'s messages.
    pub exchange: Option<Box<Exchange>>,
}

/// One message of a stream whose messages pair into calls (a bidirectional stream that carries
/// one request per request message, as KServe's `ModelStreamInfer` does), handed over as it
/// ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMessage {
    pub stream_id: u32,
    pub side: Side,
    pub message: Message,
    /// The stream's request head, on its first message only.
    pub head: Option<Box<StreamHead>>,
    /// The response's `:status`, once its head was seen.
    pub status: Option<u16>,
}

/// The header fields of a paired stream its calls share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamHead {
    pub method: Value<String>,
    pub path: Value<String>,
    pub content_type: Value<String>,
}

/// Whether a message head, from `side` of a paired stream with this `:path`, names a call (see
/// [`MessageReader::resync`]).
pub(super) type NamesACall = fn(&str, Side, &[u8]) -> bool;

/// Bytes of one DATA frame's payload from one syscall.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece<'a> {
    pub bytes: &'a [u8],
    pub ts_ns: u64,
    /// Where they begin in their direction's bytes, if known.
    pub at: Option<u64>,
    /// They begin the frame's payload.
    pub starts_frame: bool,
}

/// How much of each message of a paired stream is kept: the call's id and flags come before
/// its tensors, after at most an error text and the model's name.
pub const PAIRED_HEAD_BYTES: usize = 1024;

/// The longest request id read out of a message; a longer one reads as unread.
pub const MAX_ID_BYTES: usize = 256;

/// A request message's id field, as far as it could be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MessageId {
    /// The stream's path names no id field.
    #[default]
    NotAsked,
    Found(String),
    /// Asked for, not read: the message was compressed, a loss cut it, the field was absent,
    /// empty, longer than [`MAX_ID_BYTES`] or not UTF-8.
    Unread,
}

/// Header fields an inference record uses, as one block gave them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Fields {
    pub method: Value<String>,
    pub path: Value<String>,
    pub content_type: Value<String>,
    pub x_request_id: Value<String>,
    pub traceparent: Value<String>,
    pub status: Value<u16>,
    pub grpc_status: Value<u32>,
    pub grpc_message: Value<String>,
    /// Fields whose name came from a dynamic entry never seen.
    pub unknown: u32,
}

impl Fields {
    /// Every field unknown: the block could not be decoded.
    pub(super) fn all_unknown() -> Self {
        Self {
            method: Value::Unknown,
            path: Value::Unknown,
            content_type: Value::Unknown,
            x_request_id: Value::Unknown,
            traceparent: Value::Unknown,
            status: Value::Unknown,
            grpc_status: Value::Unknown,
            grpc_message: Value::Unknown,
            unknown: 1,
        }
    }

    /// One decoded field; `None` for a name never seen.
    pub(super) fn add(&mut self, name: Option<&[u8]>, value: Option<&[u8]>) {
        use crate::http::{MAX_FIELD_BYTES, truncated_string};
        let Some(name) = name else {
            self.unknown += 1;
            return;
        };
        let text = |v: Option<&[u8]>| match v {
            Some(v) => Value::Known(truncated_string(v, MAX_FIELD_BYTES)),
            None => Value::Unknown,
        };
        let number = |v: Option<&[u8]>| match v {
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map_or(Value::Absent, Value::Known),
            None => Value::Unknown,
        };
        match name {
            b":method" => self.method = text(value),
            b":path" => self.path = text(value),
            b"content-type" => self.content_type = text(value),
            b"x-request-id" => self.x_request_id = text(value),
            b"traceparent" => self.traceparent = text(value),
            b":status" => self.status = number(value).map(|s: u32| s.min(999) as u16),
            b"grpc-status" => self.grpc_status = number(value),
            b"grpc-message" => self.grpc_message = text(value),
            _ => {}
        }
    }

    /// After the block: a field not found is unknown, not absent, when a field of unknown name
    /// might have been it.
    pub(super) fn finish(&mut self) {
        if self.unknown == 0 {
            return;
        }
        for v in [
            &mut self.method,
            &mut self.path,
            &mut self.content_type,
            &mut self.x_request_id,
            &mut self.traceparent,
            &mut self.grpc_message,
        ] {
            v.absent_is_unknown();
        }
        self.status.absent_is_unknown();
        self.grpc_status.absent_is_unknown();
    }

    /// Whether the block surely opens a request: a `:method` or `:path` we could read. Only
    /// that evidence makes a block on a used stream id a new request.
    pub(super) fn names_a_request(&self) -> bool {
        matches!(self.method, Value::Known(_)) || matches!(self.path, Value::Known(_))
    }
}

/// A stream being followed.
#[derive(Debug)]
pub(super) struct Stream {
    pub summary: StreamSummary,
    pub request_reader: MessageReader,
    pub response_reader: MessageReader,
    pub request_ended: bool,
    pub response_ended: bool,
    /// How each side's DATA is framed: gRPC messages, or not when its content-type says
    /// another (a plain HTTP/2 body has no message framing). A request without one (a GET) is
    /// taken for gRPC until its response's head says otherwise.
    request_framing: BodyFraming,
    response_framing: BodyFraming,
    /// The bodies of a side that is not gRPC.
    plain: Option<Box<PlainBodies>>,
    held: Held,
    /// The stream's `:path` still to be handed over with its first paired message.
    path_untold: bool,
}

/// How a side's DATA is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFraming {
    Grpc,
    Plain,
    /// Its content-type came from an HPACK entry never seen (a connection joined mid-way): its
    /// first DATA byte decides (a gRPC message begins with a 0 or 1 flag byte, JSON and
    /// server-sent events with text).
    Sniff,
}

impl BodyFraming {
    fn of(content_type: &Value<String>) -> Self {
        match content_type {
            Value::Known(ct) if ct.starts_with("application/grpc") => Self::Grpc,
            Value::Known(_) => Self::Plain,
            Value::Unknown => Self::Sniff,
            Value::Absent => Self::Grpc,
        }
    }
}

impl Stream {
    pub(super) fn open(
        stream_id: u32,
        fields: Fields,
        end_stream: bool,
        ts_ns: u64,
        held: Held,
    ) -> Self {
        let framing = BodyFraming::of(&fields.content_type);
        let plain = (framing == BodyFraming::Plain)
            .then(|| Box::new(PlainBodies::new(&fields.content_type, held.clone())));
        let summary = StreamSummary {
            stream_id,
            method: fields.method,
            path: fields.path,
            content_type: fields.content_type,
            x_request_id: fields.x_request_id,
            traceparent: fields.traceparent,
            status: Value::Absent,
            grpc_status: Value::Absent,
            grpc_message: Value::Absent,
            request_ts_ns: ts_ns,
            request_end_ts_ns: end_stream.then_some(ts_ns),
            response_ts_ns: None,
            response_end_ts_ns: None,
            request: Messages::default(),
            response: Messages::default(),
            ended_by: EndedBy::ConnectionClosed,
            end_ts_ns: ts_ns,
            headers_lost: false,
            open_seq: 0,
            request_at: None,
            request_id: MessageId::NotAsked,
            paired: false,
            exchange: None,
        };
        let mut stream = Self {
            summary,
            request_reader: MessageReader::default(),
            response_reader: MessageReader::default(),
            request_ended: end_stream,
            response_ended: false,
            request_framing: framing,
            response_framing: framing,
            plain,
            held,
            path_untold: false,
        };
        if end_stream && let Some(plain) = stream.plain.as_mut() {
            plain.request_end();
        }
        stream
    }

    /// Reads top-level field `number` of the request's first message as it passes: the request
    /// id an engine's gRPC method carries (however far into the message: token ids or text may
    /// come first).
    pub(super) fn scan_request_id(&mut self, number: u32) {
        if self.request_framing != BodyFraming::Plain {
            self.request_framing = BodyFraming::Grpc;
            self.request_reader.scan_first(number, MAX_ID_BYTES);
        }
    }

    /// From now on, each message (both ways) is handed over as it ends, with its head: the
    /// stream carries one call per request message.
    pub(super) fn pair_messages(&mut self) {
        if self.request_framing == BodyFraming::Plain {
            return;
        }
        self.request_framing = BodyFraming::Grpc;
        self.response_framing = BodyFraming::Grpc;
        self.summary.paired = true;
        self.path_untold = true;
        self.request_reader = MessageReader::with_heads(PAIRED_HEAD_BYTES);
        self.response_reader = MessageReader::with_heads(PAIRED_HEAD_BYTES);
    }

    /// A server header block: the response head, an informational head, or trailers.
    pub(super) fn server_headers(&mut self, fields: Fields, end_stream: bool, ts_ns: u64) {
        let informational = matches!(fields.status, Value::Known(100..=199));
        if self.summary.response_ts_ns.is_none() && !informational {
            self.read_response_as(&fields.content_type);
        }
        let s = &mut self.summary;
        if s.response_ts_ns.is_none() && !informational {
            s.response_ts_ns = Some(ts_ns);
            s.status = fields.status;
            // The request's content-type is kept; the response's stands in when it had none.
            if !matches!(s.content_type, Value::Known(_)) && fields.content_type != Value::Absent {
                s.content_type = fields.content_type.clone();
            }
        }
        // gRPC puts these in the trailers, or in the only header block of a trailers-only
        // response.
        if fields.grpc_status != Value::Absent {
            s.grpc_status = fields.grpc_status;
        }
        if fields.grpc_message != Value::Absent {
            s.grpc_message = fields.grpc_message;
        }
        if end_stream {
            self.end(Side::Server, ts_ns);
        }
    }

    /// The response's head says how its DATA is framed: gRPC messages only where its
    /// content-type says gRPC (or says nothing and the request did).
    fn read_response_as(&mut self, content_type: &Value<String>) {
        if self.summary.paired {
            return;
        }
        if *content_type != Value::Absent {
            self.response_framing = BodyFraming::of(content_type);
        }
        if self.response_framing == BodyFraming::Plain {
            self.plain_bodies().response_head(content_type);
        }
    }

    fn plain_bodies(&mut self) -> &mut PlainBodies {
        let held = &self.held;
        let request_type = &self.summary.content_type;
        self.plain
            .get_or_insert_with(|| Box::new(PlainBodies::new(request_type, held.clone())))
    }

    /// Whether `side`'s DATA is gRPC messages.
    fn grpc_on(&self, side: Side) -> bool {
        let framing = match side {
            Side::Client => self.request_framing,
            Side::Server => self.response_framing,
        };
        framing == BodyFraming::Grpc
    }

    /// A side whose content-type is unknown: framed as its first DATA bytes say, if these are
    /// its first (bytes after a loss say nothing: the body is then plain and opaque).
    fn sniff(&mut self, side: Side, bytes: &[u8]) {
        let (framing, msgs) = match side {
            Side::Client => (self.request_framing, &self.summary.request),
            Side::Server => (self.response_framing, &self.summary.response),
        };
        if framing != BodyFraming::Sniff || bytes.is_empty() {
            return;
        }
        let at_start = msgs.data_bytes == 0 && !msgs.data_lost;
        let grpc = at_start && matches!(bytes.first(), Some(0 | 1));
        let decided = if grpc {
            BodyFraming::Grpc
        } else {
            BodyFraming::Plain
        };
        match side {
            Side::Client => self.request_framing = decided,
            Side::Server => {
                self.response_framing = decided;
                if !grpc {
                    let first = if at_start { bytes } else { &[] };
                    self.plain_bodies().response_sniffed(first);
                }
            }
        }
        if !grpc && side == Side::Client {
            let plain = self.plain_bodies();
            if !at_start {
                plain.request_data(&[], 1);
            }
        }
    }

    /// DATA bytes from `side` (see [`Piece`]). Messages of a paired stream go to `paired` as
    /// they end; `names_a_call` lets such a stream whose message boundaries were lost take up
    /// again at a DATA frame that begins a call's message. Whether it did.
    pub(super) fn data(
        &mut self,
        side: Side,
        piece: Piece<'_>,
        paired: &mut Vec<StreamMessage>,
        names_a_call: Option<NamesACall>,
    ) -> bool {
        let Piece {
            bytes,
            ts_ns,
            at,
            starts_frame,
        } = piece;
        self.sniff(side, bytes);
        let grpc = self.grpc_on(side);
        let mut resynced = false;
        if starts_frame
            && self.summary.paired
            && let (Some(check), Value::Known(path)) = (names_a_call, &self.summary.path)
        {
            let reader = match side {
                Side::Client => &mut self.request_reader,
                Side::Server => &mut self.response_reader,
            };
            resynced = reader.resync(bytes, |head| check(path, side, head));
        }
        let pair = self.summary.paired;
        let mut ended = Vec::new();
        let plain = self.plain.as_deref_mut().filter(|_| !grpc);
        let (reader, msgs) = match side {
            Side::Client => (&mut self.request_reader, &mut self.summary.request),
            Side::Server => (&mut self.response_reader, &mut self.summary.response),
        };
        msgs.data_bytes = msgs.data_bytes.saturating_add(bytes.len() as u64);
        match (plain, side) {
            (None, _) => reader.data(bytes, ts_ns, at, &mut |m| {
                msgs.add(&m);
                if pair {
                    ended.push(m);
                }
            }),
            (Some(plain), Side::Client) => plain.request_data(bytes, 0),
            (Some(plain), Side::Server) => {
                plain.response_data(bytes, ts_ns, &mut |ts| msgs.add_event(ts))
            }
        }
        self.hand_over(side, ended, paired);
        resynced
    }

    pub(super) fn data_lost(
        &mut self,
        side: Side,
        len: u64,
        ts_ns: u64,
        paired: &mut Vec<StreamMessage>,
    ) {
        let grpc = self.grpc_on(side);
        if !grpc && let Some(plain) = self.plain.as_mut() {
            match side {
                Side::Client => plain.request_data(&[], len),
                Side::Server => plain.response_lost(),
            }
        }
        let pair = self.summary.paired;
        let mut ended = Vec::new();
        let (reader, msgs) = self.side(side);
        msgs.data_lost = true;
        msgs.data_bytes = msgs.data_bytes.saturating_add(len);
        if grpc {
            reader.lost(len, ts_ns, &mut |m| {
                msgs.add(&m);
                if pair {
                    ended.push(m);
                }
            });
            msgs.framing_lost |= !reader.in_step();
        }
        self.hand_over(side, ended, paired);
    }

    /// A paired stream's ended messages, handed over with what its calls need of the stream.
    fn hand_over(&mut self, side: Side, ended: Vec<Message>, paired: &mut Vec<StreamMessage>) {
        for message in ended {
            let head = (self.path_untold && side == Side::Client).then(|| {
                self.path_untold = false;
                Box::new(StreamHead {
                    method: self.summary.method.clone(),
                    path: self.summary.path.clone(),
                    content_type: self.summary.content_type.clone(),
                })
            });
            paired.push(StreamMessage {
                stream_id: self.summary.stream_id,
                side,
                message,
                head,
                status: self.summary.status.known().copied(),
            });
        }
    }

    /// The connection's framing was lost on `side`: this stream's data is no longer followed.
    pub(super) fn abandon(&mut self, side: Side) {
        if !self.grpc_on(side)
            && let Some(plain) = self.plain.as_mut()
        {
            match side {
                Side::Client => plain.request_data(&[], 1),
                Side::Server => plain.response_lost(),
            }
        }
        let (reader, msgs) = self.side(side);
        reader.abandon();
        msgs.framing_lost = true;
        msgs.data_lost = true;
    }

    /// A DATA frame from `side` ended (not the stream).
    pub(super) fn data_frame_end(&mut self, side: Side, ts_ns: u64) {
        if side == Side::Server
            && !self.grpc_on(Side::Server)
            && let Some(plain) = self.plain.as_mut()
        {
            let tokens = &mut self.summary.response;
            plain.response_frame_end(ts_ns, &mut |ts| tokens.add_event(ts));
        }
    }

    pub(super) fn end(&mut self, side: Side, ts_ns: u64) {
        let grpc = self.grpc_on(side);
        let plain = self.plain.as_deref_mut().filter(|_| !grpc);
        match side {
            Side::Client => {
                if !self.request_ended
                    && let Some(plain) = plain
                {
                    plain.request_end();
                }
                self.request_ended = true;
                self.summary.request_end_ts_ns.get_or_insert(ts_ns);
            }
            Side::Server => {
                if !self.response_ended
                    && let Some(plain) = plain
                {
                    let tokens = &mut self.summary.response;
                    plain.response_end(ts_ns, &mut |ts| tokens.add_event(ts));
                }
                self.response_ended = true;
                self.summary.response_end_ts_ns.get_or_insert(ts_ns);
            }
        }
        let (reader, msgs) = self.side(side);
        // A stream that ends inside a message did not deliver it whole.
        msgs.framing_lost |= reader.mid_message();
    }

    /// The exchange is over once the server ended its side: the server has answered.
    pub(super) fn done(&self) -> bool {
        self.response_ended
    }

    /// Whether the stream carried gRPC messages whose boundaries were lost.
    pub(super) fn grpc_framing_lost(&self) -> bool {
        (self.grpc_on(Side::Client) && self.summary.request.framing_lost)
            || (self.grpc_on(Side::Server) && self.summary.response.framing_lost)
    }

    pub(super) fn finish(mut self, ended_by: EndedBy, ts_ns: u64) -> StreamSummary {
        self.summary.ended_by = ended_by;
        self.summary.end_ts_ns = ts_ns;
        self.summary.exchange = self.plain.take().map(|plain| Box::new(plain.finish()));
        self.summary.request_id = match self.request_reader.first_field() {
            None => MessageId::NotAsked,
            Some(Some(id)) => match std::str::from_utf8(id) {
                Ok(id) if !id.is_empty() => MessageId::Found(id.to_owned()),
                _ => MessageId::Unread,
            },
            Some(None) => MessageId::Unread,
        };
        self.summary
    }

    fn side(&mut self, side: Side) -> (&mut MessageReader, &mut Messages) {
        match side {
            Side::Client => (&mut self.request_reader, &mut self.summary.request),
            Side::Server => (&mut self.response_reader, &mut self.summary.response),
        }
    }
}
