//! HTTP/1.1 decoding of one TCP connection as seen through a server's socket
//! syscalls, reduced to what an inference timeline needs.
//!
//! The input is lossy: each syscall delivers a captured prefix plus a count of
//! bytes that moved but were not captured. Decoders keep framing across such
//! gaps where the framing makes that possible (Content-Length bodies, the data
//! of a known-size chunk) and fail loudly where it does not.
//!
//! Privacy: only sizes, counts, ids and the model name leave a decoder. Raw
//! bytes are held transiently in bounded reassembly buffers, which are wiped
//! as soon as the message or event they belong to is complete.

mod chunked;
mod counts;
mod framing;
mod handoff;
mod head;
pub(crate) mod json;
mod request;
pub(crate) mod response;
pub(crate) mod sse;
mod template;

pub use counts::{Timings, Usage};
pub use request::{RequestDecoder, RequestEvent, RequestSummary};
pub use response::{BodySummary, ResponseDecoder, ResponseEvent, SseEvent};
pub use template::{Merge, TEMPLATE_SIDE_MAX, TOKEN_TEXT_MAX, TokenTemplate};

/// The bytes of one syscall on one direction of a connection; the capture is
/// truncated, so `lost` says how much more the syscall moved after `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Captured prefix of the transferred bytes.
    pub bytes: &'a [u8],
    /// Bytes moved by the syscall after `bytes` that were not captured.
    pub lost: u64,
    /// Timestamp of the syscall, carried into the events it produces.
    pub ts_ns: u64,
}

/// Caps on per-connection buffering, so a hostile or unusual peer can cost at
/// most a known amount of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request/response head (and chunked trailer section) accepted.
    pub max_head_bytes: usize,
    /// Largest JSON body kept for parsing; bigger bodies are counted only.
    pub max_body_bytes: usize,
    /// Largest single server-sent event accepted.
    pub max_sse_event_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head_bytes: 16 * 1024,
            max_body_bytes: 64 * 1024,
            max_sse_event_bytes: 64 * 1024,
        }
    }
}

/// Why a decoder gave up on a connection direction; it stays failed until
/// `reset()`, because after any of these the byte stream can no longer be
/// framed reliably.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The bytes are not HTTP/1.x (TLS, HTTP/2, garbage).
    #[error("not http")]
    NotHttp,
    /// A head (or chunked trailer section) exceeded `max_head_bytes`.
    #[error("head too large")]
    HeadTooLarge,
    /// Bytes were lost inside a head, so it cannot be parsed.
    #[error("bytes lost inside head")]
    HeadLost,
    /// A chunk-size line or chunk terminator was malformed.
    #[error("bad chunk size")]
    BadChunkSize,
    /// Lost bytes covered chunk framing, so chunk boundaries are unknown.
    #[error("chunk framing lost")]
    FramingLost,
    /// One server-sent event exceeded `max_sse_event_bytes`.
    #[error("sse event too large")]
    SseEventTooLarge,
    /// Reserved for body-size policy violations; the current decoders count
    /// oversized bodies as truncated instead of failing.
    #[error("body too large")]
    BodyTooLarge,
}

impl ParseError {
    /// Stable snake_case label, for metric counters.
    pub fn as_str(&self) -> &'static str {
        match self {
            ParseError::NotHttp => "not_http",
            ParseError::HeadTooLarge => "head_too_large",
            ParseError::HeadLost => "head_lost",
            ParseError::BadChunkSize => "bad_chunk_size",
            ParseError::FramingLost => "framing_lost",
            ParseError::SseEventTooLarge => "sse_event_too_large",
            ParseError::BodyTooLarge => "body_too_large",
        }
    }

    /// The agent counter this failure is counted in.
    pub fn counter(&self) -> inferscope_model::Counter {
        use inferscope_model::Counter;

        match self {
            ParseError::NotHttp => Counter::NotHttp,
            ParseError::HeadTooLarge => Counter::HeadTooLarge,
            ParseError::HeadLost => Counter::HeadLost,
            ParseError::BadChunkSize => Counter::BadChunkSize,
            ParseError::FramingLost => Counter::FramingLost,
            ParseError::SseEventTooLarge => Counter::SseEventTooLarge,
            ParseError::BodyTooLarge => Counter::BodyTooLarge,
        }
    }
}

/// Longest path / header value kept.
pub(crate) const MAX_FIELD_BYTES: usize = 256;
/// Longest model name / response id kept.
pub(crate) const MAX_NAME_BYTES: usize = 128;

/// Lossy UTF-8 conversion of at most `max` bytes, cut on a char boundary.
pub(crate) fn truncated_string(bytes: &[u8], max: usize) -> String {
    let cut = bytes.get(..max).unwrap_or(bytes);
    let s = String::from_utf8_lossy(cut);
    truncated_str(&s, max).to_owned()
}

/// `s` cut to at most `max` bytes on a char boundary.
pub(crate) fn truncated_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.get(..end).unwrap_or("")
}

/// ASCII case-insensitive substring test, without allocating.
pub(crate) fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Parses a Content-Length value; `None` when malformed.
pub(crate) fn parse_content_length(v: &[u8]) -> Option<u64> {
    let t = v.trim_ascii();
    if t.is_empty() || t.len() > 19 || !t.iter().all(u8::is_ascii_digit) {
        return None;
    }
    t.iter().try_fold(0u64, |acc, &b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Overwrites and empties a buffer that may have held request/response text,
/// so it does not linger in long-lived per-connection state.
pub(crate) fn wipe(buf: &mut Vec<u8>) {
    // Called once per SSE event, usually on an empty buffer: skip the memset call then.
    if buf.is_empty() {
        return;
    }
    buf.fill(0);
    // Release the memory too: an idle keep-alive connection should hold no buffers (10k
    // connections x a few KiB each adds up), and one allocation per request is cheap.
    *buf = Vec::new();
}

/// Appends body payload to the bounded parse buffer, or marks the body
/// truncated once it no longer fits.
pub(crate) fn collect_body(buf: &mut Vec<u8>, truncated: &mut bool, payload: &[u8], max: usize) {
    if *truncated || payload.is_empty() {
        return;
    }
    if buf.len() + payload.len() > max {
        *truncated = true;
        wipe(buf);
    } else {
        buf.extend_from_slice(payload);
    }
}

/// Helpers for tests here and in the agent (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod testutil {
    use super::Chunk;

    /// Tiny deterministic PRNG so tests need no extra crates.
    pub struct XorShift(pub u64);
    impl XorShift {
        pub fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        pub fn below(&mut self, n: u64) -> u64 {
            if n == 0 { 0 } else { self.next_u64() % n }
        }
    }

    pub fn chunk(bytes: &[u8], ts_ns: u64) -> Chunk<'_> {
        Chunk {
            bytes,
            lost: 0,
            ts_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{testutil::XorShift, *};

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncated_str("héllo", 2), "h");
        assert_eq!(truncated_string("héllo".as_bytes(), 3), "hé");
        assert_eq!(truncated_string(b"abc", 10), "abc");
        assert_eq!(truncated_string(b"\xff\xfeab", 4), "\u{fffd}");
        assert_eq!(truncated_string(b"\xffab", 8), "\u{fffd}ab");
    }

    #[test]
    fn content_length_parsing() {
        assert_eq!(parse_content_length(b" 42 "), Some(42));
        assert_eq!(parse_content_length(b"-1"), None);
        assert_eq!(parse_content_length(b""), None);
        assert_eq!(parse_content_length(b"99999999999999999999"), None);
        assert_eq!(parse_content_length(b"18446744073709551615"), None);
    }

    #[test]
    fn error_labels_are_snake_case() {
        assert_eq!(ParseError::NotHttp.as_str(), "not_http");
        assert_eq!(ParseError::SseEventTooLarge.as_str(), "sse_event_too_large");
        assert_eq!(ParseError::FramingLost.to_string(), "chunk framing lost");
    }

    /// What the decoders said about one random stream, checked against what the bytes allow.
    #[derive(Default)]
    struct Seen {
        req_failed: bool,
        req_open: u64,
        started: u64,
        completed: u64,
        /// Started requests that ended in an error, a reset or the end of the stream.
        abandoned: u64,
        resp_failed: bool,
        in_response: bool,
        heads: u64,
        sse: u64,
    }

    impl Seen {
        fn reset(&mut self) {
            self.req_failed = false;
            self.abandoned += self.req_open;
            self.req_open = 0;
            self.resp_failed = false;
            self.in_response = false;
        }

        fn request(&mut self, events: &[RequestEvent], limits: &Limits) {
            for e in events {
                // Failed stays failed until reset: nothing after an error.
                assert!(!self.req_failed, "request event after an error: {e:?}");
                match e {
                    RequestEvent::Started { .. } => {
                        assert_eq!(self.req_open, 0, "Started twice for one request");
                        self.req_open = 1;
                        self.started += 1;
                    }
                    RequestEvent::Complete(r) => {
                        assert_eq!(self.req_open, 1, "Complete without Started");
                        self.req_open = 0;
                        self.completed += 1;
                        assert!(r.path.len() <= MAX_FIELD_BYTES);
                        for field in [&r.x_request_id, &r.traceparent].into_iter().flatten() {
                            assert!(field.len() <= MAX_FIELD_BYTES);
                        }
                        assert!(r.head_bytes as usize <= limits.max_head_bytes);
                    }
                    RequestEvent::Error(_) => {
                        self.req_failed = true;
                        self.abandoned += self.req_open;
                        self.req_open = 0;
                    }
                }
            }
        }

        fn response(&mut self, events: &[ResponseEvent]) {
            for e in events {
                assert!(!self.resp_failed, "response event after an error: {e:?}");
                match e {
                    ResponseEvent::Head { .. } => {
                        assert!(!self.in_response, "a second head inside a response");
                        self.in_response = true;
                        self.heads += 1;
                    }
                    ResponseEvent::Sse(ev) => {
                        assert!(self.in_response, "an event outside a response");
                        assert!(ev.id.as_ref().is_none_or(|id| id.len() <= MAX_NAME_BYTES));
                        self.sse += 1;
                    }
                    ResponseEvent::Body(b) => {
                        assert!(self.in_response, "a body outside a response");
                        assert!(b.id.as_ref().is_none_or(|id| id.len() <= MAX_NAME_BYTES));
                    }
                    ResponseEvent::End { .. } => {
                        assert!(self.in_response, "an end outside a response");
                        self.in_response = false;
                    }
                    ResponseEvent::Error(_) => self.resp_failed = true,
                }
            }
        }
    }

    /// Random bytes, random split points and random losses must never panic either decoder,
    /// and what they report must be well formed (nothing after an error until reset, no body
    /// outside a response, no request completed twice), bounded (fields within their caps)
    /// and never invented: every head needs its blank line in the captured bytes, every event
    /// its line end.
    #[test]
    fn random_input_never_panics() {
        let seeds: &[&[u8]] = &[
            b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n10\r\ndata: {\"id\":1}\n\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"id\":\"x\"}\n\n",
            b"GET / HTTP/1.1\r\n\r\n",
        ];
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let limits = Limits {
            max_head_bytes: 512,
            max_body_bytes: 256,
            max_sse_event_bytes: 128,
        };
        let (mut total_completed, mut total_heads, mut total_sse) = (0, 0, 0);
        for round in 0..3000u64 {
            let mut input: Vec<u8> = Vec::new();
            let len = rng.below(600) as usize;
            let seed = seeds[(round % seeds.len() as u64) as usize];
            // Mostly a plausible message with noise: heavy on even rounds, sparse on odd ones
            // (so whole messages get through and the checks below see decoded output).
            let noise = if round % 2 == 0 { 4 } else { 200 };
            for i in 0..len {
                let b = match rng.below(noise) {
                    0 => rng.next_u64() as u8,
                    _ => seed[i % seed.len()],
                };
                input.push(b);
            }
            let mut req = RequestDecoder::new(limits);
            let mut resp = ResponseDecoder::new(limits);
            let mut req_out = Vec::new();
            let mut resp_out = Vec::new();
            let mut seen = Seen::default();
            let mut rest: &[u8] = &input;
            let mut ts = 0;
            while !rest.is_empty() {
                let n = (rng.below(40) as usize + 1).min(rest.len());
                let (now, later) = rest.split_at(n);
                rest = later;
                ts += 1;
                let lost = if rng.below(8) == 0 { rng.below(50) } else { 0 };
                let c = Chunk {
                    bytes: now,
                    lost,
                    ts_ns: ts,
                };
                req_out.clear();
                resp_out.clear();
                req.feed(c, &mut req_out);
                resp.feed(c, &mut resp_out);
                seen.request(&req_out, &limits);
                seen.response(&resp_out);
                if rng.below(50) == 0 {
                    req.reset();
                    resp.reset();
                    seen.reset();
                }
            }
            resp_out.clear();
            resp.close(ts, &mut resp_out);
            seen.response(&resp_out);
            // A head ends at a blank line (CRLF CRLF, or bare LFs), an event at a line end:
            // no more of either than the captured bytes hold.
            let blank_lines = input
                .windows(2)
                .filter(|w| w == b"\n\n")
                .count()
                .saturating_add(input.windows(3).filter(|w| w == b"\n\r\n").count())
                as u64;
            let line_ends = input.iter().filter(|b| **b == b'\n').count() as u64;
            // Every request started is completed or given up, once.
            assert_eq!(
                seen.started,
                seen.completed + seen.abandoned + seen.req_open,
                "round {round}"
            );
            assert!(
                seen.completed <= blank_lines,
                "round {round}: {} requests from {blank_lines} blank lines",
                seen.completed
            );
            assert!(
                seen.heads <= blank_lines,
                "round {round}: {} responses from {blank_lines} blank lines",
                seen.heads
            );
            assert!(seen.sse <= line_ends, "round {round}: events invented");
            total_completed += seen.completed;
            total_heads += seen.heads;
            total_sse += seen.sse;
        }
        // The mutated streams still hold whole messages often enough for the checks above to
        // bite on decoded output, not only on errors.
        assert!(total_completed > 1000, "{total_completed} requests decoded");
        assert!(total_heads > 100, "{total_heads} responses decoded");
        assert!(total_sse > 100, "{total_sse} events decoded");
    }
}
