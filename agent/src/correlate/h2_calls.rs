//! The calls of gRPC streams that carry one call per request message (KServe's
//! `ModelStreamInfer`, as Triton serves it): one record per call, not per stream.
//!
//! The decoder hands over each message of such a stream as it ends ([`StreamMessage`]). A
//! request message opens a call, named by the id its head carries; a response message is matched
//! to its call by the id it echoes (the oldest open call when it has none), and the engine's
//! final flag ends the call. The stream's own end ends the calls still open.
//!
//! A call's arrival is the wire segment that carried its request message's first byte, its first
//! token the syscall that carried its first response message, and its token gaps those between
//! its response messages, exactly as a server-streaming stream's are.

use std::collections::VecDeque;

use inferscope_decode::http2::{Messages, Side, StreamHead, StreamMessage, StreamSummary};
use inferscope_model::{Counter, EndedBy, Http2Info, RequestRecord};
use rustc_hash::FxHashMap;

use super::{
    Stats,
    loss::{self, Reason},
    request::{RecordContext, RequestProgress},
};
use crate::engines::{self, CallStream, LastReply};

/// Calls open at once on one stream; the oldest is ended, counted, past it (a client that never
/// gets final responses would otherwise grow the stream without bound).
pub(super) const MAX_OPEN_CALLS: usize = 1024;

/// The call streams of one connection.
#[derive(Default)]
pub(super) struct CallStreams {
    streams: FxHashMap<u32, OpenStream>,
}

struct OpenStream {
    rpc: &'static CallStream,
    head: Box<StreamHead>,
    calls: VecDeque<Call>,
}

struct Call {
    id: Option<String>,
    /// The read that carried the request message's first byte, and the one that ended it.
    read_ns: u64,
    request_end_ns: u64,
    wire_ns: Option<u64>,
    request_bytes: u64,
    status: Option<u16>,
    /// Its response messages, as a stream's are counted.
    response: Messages,
    error: bool,
}

/// How the stream's end ended a call it cut.
pub(super) struct StreamEnd {
    pub ended_by: EndedBy,
    pub stream_end: &'static str,
    pub error_code: Option<u32>,
    pub incomplete: Option<Reason>,
}

impl CallStreams {
    /// One message of a call stream; `wire_ns`: a request message's wire arrival.
    pub(super) fn on_message(
        &mut self,
        m: StreamMessage,
        wire_ns: Option<u64>,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        match m.side {
            Side::Client => self.request(m, wire_ns, ctx, stats, out),
            Side::Server => self.response(m, ctx, stats, out),
        }
    }

    fn request(
        &mut self,
        m: StreamMessage,
        wire_ns: Option<u64>,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        let stream = match self.streams.entry(m.stream_id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                // The first message carries the stream's head.
                let Some((rpc, head)) = m.head.and_then(|h| {
                    let rpc = engines::call_stream(h.path.known()?)?;
                    Some((rpc, h))
                }) else {
                    return;
                };
                e.insert(OpenStream {
                    rpc,
                    head,
                    calls: VecDeque::new(),
                })
            }
        };
        let id = (stream.rpc.request_id)(&m.message.head);
        stats.bump(if id.is_some() {
            Counter::RpcRequestIdsRead
        } else {
            Counter::RpcRequestIdsUnread
        });
        if wire_ns.is_none() {
            stats.bump(Counter::ArrivalWireUnknown);
        }
        stream.calls.push_back(Call {
            id,
            read_ns: m.message.first_ts_ns,
            request_end_ns: m.message.last_ts_ns,
            wire_ns,
            request_bytes: u64::from(m.message.len),
            status: m.status,
            response: Messages::default(),
            error: false,
        });
        if stream.calls.len() > MAX_OPEN_CALLS
            && let Some(oldest) = stream.calls.pop_front()
        {
            stats.bump(Counter::GrpcStreamCallsEvicted);
            let end = StreamEnd {
                ended_by: EndedBy::Unknown,
                stream_end: "evicted",
                error_code: None,
                incomplete: None,
            };
            let end_ns = m.message.first_ts_ns;
            out.push(record(
                oldest,
                stream,
                m.stream_id,
                &end,
                None,
                end_ns,
                ctx,
                stats,
            ));
        }
    }

    fn response(
        &mut self,
        m: StreamMessage,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        let Some(stream) = self.streams.get_mut(&m.stream_id) else {
            stats.bump(Counter::GrpcStreamResponsesUnmatched);
            return;
        };
        let reply = (stream.rpc.response)(&m.message.head);
        let at = match &reply.id {
            Some(id) => stream
                .calls
                .iter()
                .position(|c| c.id.as_deref() == Some(id.as_str())),
            // Without ids, calls are answered in order.
            None => (!stream.calls.is_empty()).then_some(0),
        };
        let Some(call) = at.and_then(|i| stream.calls.get_mut(i)) else {
            stats.bump(Counter::GrpcStreamResponsesUnmatched);
            return;
        };
        let msg = &m.message;
        call.response.add(msg);
        call.error |= reply.error;
        if call.status.is_none() {
            call.status = m.status;
        }
        if reply.last != LastReply::Yes {
            return;
        }
        if let Some(call) = at.and_then(|i| stream.calls.remove(i)) {
            let end = StreamEnd {
                ended_by: EndedBy::Complete,
                stream_end: if call.error {
                    "error_response"
                } else {
                    "final_response"
                },
                error_code: None,
                incomplete: None,
            };
            out.push(record(
                call,
                stream,
                m.stream_id,
                &end,
                None,
                msg.last_ts_ns,
                ctx,
                stats,
            ));
        }
    }

    /// A call stream ended (`s`, its summary): its open calls end with it, as `end` says.
    pub(super) fn stream_ended(
        &mut self,
        s: &StreamSummary,
        end: &StreamEnd,
        ctx: RecordContext<'_>,
        stats: &mut Stats,
        out: &mut Vec<RequestRecord>,
    ) {
        let Some(mut stream) = self.streams.remove(&s.stream_id) else {
            return;
        };
        let grpc_status = s.grpc_status.known().copied();
        while let Some(call) = stream.calls.pop_front() {
            // Its final response never came: the model sent none, or the stream was cut.
            stats.bump(Counter::GrpcStreamCallsUnended);
            out.push(record(
                call,
                &stream,
                s.stream_id,
                end,
                grpc_status,
                s.end_ts_ns,
                ctx,
                stats,
            ));
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    call: Call,
    stream: &OpenStream,
    stream_id: u32,
    end: &StreamEnd,
    grpc_status: Option<u32>,
    end_ns: u64,
    ctx: RecordContext<'_>,
    stats: &mut Stats,
) -> RequestRecord {
    stats.bump(Counter::GrpcStreamCalls);
    let mut p = RequestProgress::new(stream_id, 0, call.read_ns, call.wire_ns);
    p.status = call.status;
    p.first_byte_ns = call.response.first_ts_ns;
    p.request_bytes = call.request_bytes;
    p.response_bytes = call.response.bytes;
    p.incomplete = end.incomplete;
    super::h2_fields::tokens_from(&mut p, &call.response);
    p.summary = Some(inferscope_decode::http::RequestSummary {
        method: super::h2_fields::text(&stream.head.method),
        path: super::h2_fields::text(&stream.head.path),
        ts_ns: call.request_end_ns,
        ..Default::default()
    });
    if let Some(reason) = p.incomplete {
        stats.bump(loss::INCOMPLETE_TOTAL);
        stats.bump(reason.counter());
    }
    let mut record = p.into_record(ctx, end_ns.max(call.read_ns), end.ended_by);
    record.rpc_request_id = call.id;
    record.http2 = Some(Box::new(Http2Info {
        stream_id,
        content_type: super::h2_fields::content_type(&stream.head.content_type),
        grpc_status,
        request_messages: 1,
        request_message_bytes: call.request_bytes,
        response_messages: call.response.count,
        response_message_bytes: call.response.bytes,
        stream_end: end.stream_end,
        error_code: end.error_code,
    }));
    record
}
