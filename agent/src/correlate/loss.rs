//! Losses in user terms. A request the agent saw answered but could not follow to its end is
//! still recorded, with `incomplete` naming why; an answered request it never saw at all is
//! counted as lost. Records plus `requests_lost` add up to the requests the server answered.
use inferscope_decode::http::ParseError;
use inferscope_model::{Counter, EndedBy};

/// Counter of answered requests without a record, all reasons together.
pub(crate) const LOST_TOTAL: Counter = Counter::RequestsLost;
/// The kernel dropped the record of the response head (ring buffer full).
pub(crate) const LOST_EVENTS: Counter = Counter::RequestsLostEventsLost;
/// A response head was seen but its request was not (lost, or read before the agent looked).
pub const LOST_REQUEST_NOT_CAPTURED: Counter = Counter::RequestsLostRequestNotCaptured;
/// A fully read request was dropped because 64 requests of its connection already waited for
/// their answers (pipelining); its answer came and was skipped.
pub(crate) const LOST_WAITING_OVER_LIMIT: Counter = Counter::RequestsLostWaitingOverLimit;
/// An answer was written on a connection the agent could not track (its table was full).
pub(crate) const LOST_CONNECTIONS_OVER_LIMIT: Counter = Counter::RequestsLostConnectionsOverLimit;
/// Records emitted with `incomplete` set, all reasons together.
pub(crate) const INCOMPLETE_TOTAL: Counter = Counter::RequestsIncomplete;

/// Why a record is incomplete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The ring buffer dropped events of this connection while the request was open.
    EventsLost,
    /// The request or response head was larger than the decoder accepts.
    HeadTooLarge,
    /// Bytes of a head were not captured.
    HeadLost,
    /// A chunk-size line was malformed, or lost bytes covered chunk framing.
    ChunkFraming,
    /// One server-sent event was larger than the decoder accepts.
    SseEventTooLarge,
    /// The bytes stopped looking like HTTP/1.x.
    NotHttp,
    /// HTTP/2: the stream's header block could not be decoded, or its gRPC message boundaries
    /// were lost.
    Http2Framing,
    /// The agent stopped while the request was open.
    AgentShutdown,
    /// The server process exited (or stopped being traced) while the request was open.
    ServerExited,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::EventsLost => "events_lost",
            Reason::HeadTooLarge => "head_too_large",
            Reason::HeadLost => "head_lost",
            Reason::ChunkFraming => "chunk_framing",
            Reason::SseEventTooLarge => "sse_event_too_large",
            Reason::NotHttp => "not_http",
            Reason::Http2Framing => "http2_framing",
            Reason::AgentShutdown => "agent_shutdown",
            Reason::ServerExited => "server_exited",
        }
    }

    /// The per-reason counter of incomplete records.
    pub(crate) fn counter(self) -> Counter {
        match self {
            Reason::EventsLost => Counter::RequestsIncompleteEventsLost,
            Reason::HeadTooLarge => Counter::RequestsIncompleteHeadTooLarge,
            Reason::HeadLost => Counter::RequestsIncompleteHeadLost,
            Reason::ChunkFraming => Counter::RequestsIncompleteChunkFraming,
            Reason::SseEventTooLarge => Counter::RequestsIncompleteSseEventTooLarge,
            Reason::NotHttp => Counter::RequestsIncompleteNotHttp,
            Reason::Http2Framing => Counter::RequestsIncompleteHttp2Framing,
            Reason::AgentShutdown => Counter::RequestsIncompleteAgentShutdown,
            Reason::ServerExited => Counter::RequestsIncompleteServerExited,
        }
    }
}

impl From<ParseError> for Reason {
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::NotHttp => Reason::NotHttp,
            ParseError::HeadTooLarge => Reason::HeadTooLarge,
            ParseError::HeadLost => Reason::HeadLost,
            ParseError::BadChunkSize | ParseError::FramingLost | ParseError::BodyTooLarge => {
                Reason::ChunkFraming
            }
            ParseError::SseEventTooLarge => Reason::SseEventTooLarge,
        }
    }
}

/// Whether a read can be proven to start a request: an HTTP method token, a space, and (when
/// the line is captured whole) an `HTTP/1.x` version at its end.
pub(crate) fn starts_request(payload: &[u8]) -> bool {
    let method_len = payload
        .iter()
        .take(17)
        .take_while(|b| b.is_ascii_uppercase())
        .count();
    if !(3..=16).contains(&method_len) || payload.get(method_len) != Some(&b' ') {
        return false;
    }
    let Some(eol) = payload.windows(2).take(8192).position(|w| w == b"\r\n") else {
        return true;
    };
    let line = payload.get(..eol).unwrap_or_default();
    line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0")
}

/// Whether a write starts a response head.
pub(crate) fn starts_response(payload: &[u8]) -> bool {
    payload.starts_with(b"HTTP/1.")
}

/// How a connection's tracking ends, which decides what its open requests become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The connection ended (`by` the server, or the process or agent stopping): unanswered
    /// requests end cut by that side.
    Closed(EndedBy),
    /// Tracking stopped for another reason: open requests are `incomplete` with it.
    Incomplete(Reason),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_starts_are_proven_not_guessed() {
        assert!(starts_request(b"POST /v1/chat HTTP/1.1\r\nHost: a\r\n\r\n"));
        assert!(starts_request(b"GET /health HTTP/1.0\r\n\r\n"));
        assert!(starts_request(b"POST /v1/chat/compl")); // line cut by the capture
        assert!(!starts_request(b"{\"messages\":[]}"));
        assert!(!starts_request(b"data: {\"a\":1}\n\n"));
        assert!(!starts_request(b"POST /x SPDY/3\r\n"));
        assert!(!starts_request(b"\x16\x03\x01\x02\x00"));
        assert!(!starts_request(b"GE"));
        assert!(starts_response(b"HTTP/1.1 200 OK\r\n"));
        assert!(!starts_response(b"1a\r\ndata: x\n\n\r\n"));
    }

    #[test]
    fn every_reason_has_its_own_counter() {
        let all = [
            Reason::EventsLost,
            Reason::HeadTooLarge,
            Reason::HeadLost,
            Reason::ChunkFraming,
            Reason::SseEventTooLarge,
            Reason::NotHttp,
            Reason::AgentShutdown,
            Reason::ServerExited,
        ];
        for r in all {
            assert_eq!(
                r.counter().name(),
                format!("requests_incomplete_{}", r.as_str())
            );
        }
    }
}
