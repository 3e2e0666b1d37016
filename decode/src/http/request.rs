//! Decoding of the requests a server reads: HTTP/1.1 heads, keep-alive and
//! pipelining, Content-Length and chunked bodies, and the few JSON fields
//! that describe an inference request.

use super::{
    Chunk, Limits, MAX_FIELD_BYTES, ParseError,
    chunked::Advance,
    collect_body,
    framing::{BodyHeaders, Framing, Skipped},
    head::{HeadBuf, HeadProgress, MAX_HEADERS, ParseResult, blank_lines, map_httparse_err},
    json, truncated_str, truncated_string, wipe,
};

/// What the request side of a connection reports, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestEvent {
    /// The first byte of a new request arrived: the earliest point the
    /// server could have started work on it.
    Started {
        /// Timestamp of the chunk that carried the first byte.
        ts_ns: u64,
    },
    /// The request's head and body were fully received.
    Complete(RequestSummary),
    /// The stream cannot be decoded further; the decoder ignores input
    /// until `reset()`.
    Error(ParseError),
}

/// Privacy-safe description of one request: sizes, ids and generation
/// parameters, never prompt text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestSummary {
    /// Timestamp of the chunk that completed the request.
    pub ts_ns: u64,
    /// Request method, e.g. `POST`.
    pub method: String,
    /// Request target, truncated to 256 bytes.
    pub path: String,
    /// `X-Request-Id` header, for joining with server logs (256 bytes max).
    pub x_request_id: Option<String>,
    /// W3C `traceparent` header, for joining with traces (256 bytes max).
    pub traceparent: Option<String>,
    /// Declared `Content-Length`, if any.
    pub content_length: Option<u64>,
    /// Wire size of the head.
    pub head_bytes: u64,
    /// Wire size of the body (including chunk framing), captured + lost.
    pub body_bytes: u64,
    /// Body bytes were lost or exceeded `max_body_bytes`, so the JSON fields
    /// below are unknown (`None`).
    pub body_truncated: bool,
    /// The complete body was expected to be JSON but did not parse as a
    /// request object.
    pub body_json_error: bool,
    /// `model`, truncated to 128 bytes.
    pub model: Option<String>,
    /// `stream`.
    pub stream: Option<bool>,
    /// `max_tokens`, else `max_completion_tokens`, else `n_predict`.
    pub max_tokens: Option<u64>,
    /// UTF-8 bytes of all message contents (or of `prompt`): prompt size
    /// without the prompt.
    pub prompt_bytes: Option<u64>,
    /// `stream_options.include_usage`: whether a usage event should follow.
    pub include_usage: Option<bool>,
    /// `kv_transfer_params` (disaggregated prefill/decode serving), digested: scalars, and
    /// arrays only as a length and digest.
    pub kv_transfer_params: Option<Box<inferscope_model::HandoffParams>>,
}

/// Head fields needed to frame and describe the request.
#[derive(Debug)]
struct Head {
    method: String,
    path: String,
    x_request_id: Option<String>,
    traceparent: Option<String>,
    body: BodyHeaders,
}

fn parse_head(buf: &[u8]) -> ParseResult<Head> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf).map_err(map_httparse_err)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let mut head = Head {
        method: truncated_str(req.method.unwrap_or_default(), MAX_FIELD_BYTES).to_owned(),
        path: truncated_str(req.path.unwrap_or_default(), MAX_FIELD_BYTES).to_owned(),
        x_request_id: None,
        traceparent: None,
        body: BodyHeaders::default(),
    };
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        head.body.read(name, h.value)?;
        if name.eq_ignore_ascii_case(b"x-request-id") {
            head.x_request_id = Some(truncated_string(h.value, MAX_FIELD_BYTES));
        } else if name.eq_ignore_ascii_case(b"traceparent") {
            head.traceparent = Some(truncated_string(h.value, MAX_FIELD_BYTES));
        }
    }
    Ok(Some((n, head)))
}

impl RequestSummary {
    /// The completion parameters of a whole request body; `json_body`: its Content-Type said
    /// JSON. Servers such as llama.cpp take JSON whatever the Content-Type says (curl -d sends
    /// form-urlencoded), so a body that opens like a JSON object is parsed as one.
    pub(crate) fn read_body(&mut self, body: &[u8], json_body: bool) {
        let looks_json = body
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'{');
        if !(json_body || looks_json) || self.body_truncated || body.is_empty() {
            return;
        }
        match json::parse_request(body) {
            Some(f) => {
                self.model = f.model;
                // Absent means false, as in the OpenAI API and llama.cpp's own endpoints.
                self.stream = Some(f.stream.unwrap_or(false));
                self.max_tokens = f.max_tokens;
                self.prompt_bytes = f.prompt_bytes;
                self.include_usage = f.include_usage;
                self.kv_transfer_params = f.kv_transfer_params.map(Box::new);
            }
            None => self.body_json_error = true,
        }
    }
}

#[derive(Debug)]
struct InFlight {
    summary: RequestSummary,
    framing: Framing,
    json_body: bool,
}

#[derive(Debug)]
enum State {
    Head,
    Body(Box<InFlight>),
    Failed,
}

/// Turns the bytes a server reads from one connection into request events.
#[derive(Debug)]
pub struct RequestDecoder {
    limits: Limits,
    state: State,
    /// `Started` was emitted for the request being read.
    started: bool,
    head: HeadBuf,
    /// Body bytes kept for JSON parsing (≤ `max_body_bytes`), wiped after.
    body: Vec<u8>,
}

impl RequestDecoder {
    /// A decoder for a fresh connection.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Head,
            started: false,
            head: HeadBuf::default(),
            body: Vec::new(),
        }
    }

    /// Forgets all state (e.g. after an error or a connection reuse).
    pub fn reset(&mut self) {
        self.state = State::Head;
        self.started = false;
        self.head.clear();
        wipe(&mut self.body);
    }

    /// Consumes one syscall's bytes, appending resulting events to `out`.
    pub fn feed(&mut self, chunk: Chunk<'_>, out: &mut Vec<RequestEvent>) {
        let mut data = chunk.bytes;
        while !data.is_empty() && !matches!(self.state, State::Failed) {
            match self.step(data, chunk.ts_ns, out) {
                Ok(0) => break, // unreachable: every step makes progress
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(e) => return self.fail(e, out),
            }
        }
        if let Err(e) = self.skip_lost(chunk.lost, chunk.ts_ns, out) {
            self.fail(e, out);
        }
    }

    fn fail(&mut self, e: ParseError, out: &mut Vec<RequestEvent>) {
        self.reset();
        self.state = State::Failed;
        out.push(RequestEvent::Error(e));
    }

    /// Handles a prefix of `data`, returning how much it used.
    fn step(
        &mut self,
        data: &[u8],
        ts: u64,
        out: &mut Vec<RequestEvent>,
    ) -> Result<usize, ParseError> {
        match &mut self.state {
            State::Failed => Ok(data.len()),
            State::Head => {
                if !self.started {
                    // Stray CRLFs between keep-alive requests are not a request.
                    let blank = blank_lines(data);
                    if blank > 0 {
                        return Ok(blank);
                    }
                    self.started = true;
                    out.push(RequestEvent::Started { ts_ns: ts });
                }
                match self
                    .head
                    .push(data, self.limits.max_head_bytes, parse_head)?
                {
                    HeadProgress::NeedMore => Ok(data.len()),
                    HeadProgress::Done {
                        consumed,
                        head_len,
                        value,
                    } => {
                        self.begin_body(value, head_len, ts, out);
                        Ok(consumed)
                    }
                }
            }
            State::Body(inflight) => {
                let Advance {
                    consumed,
                    payload,
                    done,
                } = inflight.framing.advance(data)?;
                let payload = data.get(payload).unwrap_or_default();
                let first_and_last =
                    done && inflight.summary.body_bytes == 0 && self.body.is_empty();
                inflight.summary.body_bytes =
                    inflight.summary.body_bytes.saturating_add(consumed as u64);
                if first_and_last && payload.len() <= self.limits.max_body_bytes {
                    // The whole body is in this read: parse it in place.
                    self.complete(Some(payload), ts, out);
                } else {
                    collect_body(
                        &mut self.body,
                        &mut inflight.summary.body_truncated,
                        payload,
                        self.limits.max_body_bytes,
                    );
                    if done {
                        self.complete(None, ts, out);
                    }
                }
                Ok(consumed)
            }
        }
    }

    fn begin_body(&mut self, head: Head, head_len: usize, ts: u64, out: &mut Vec<RequestEvent>) {
        let summary = RequestSummary {
            method: head.method,
            path: head.path,
            x_request_id: head.x_request_id,
            traceparent: head.traceparent,
            content_length: head.body.content_length,
            head_bytes: head_len as u64,
            ..RequestSummary::default()
        };
        // Requests without a length have no body (RFC 9112 §6.3).
        let framing = head.body.framing(self.limits.max_head_bytes, false);
        let empty = framing.is_empty();
        self.state = State::Body(Box::new(InFlight {
            summary,
            framing,
            json_body: head.body.json_body,
        }));
        if empty {
            self.complete(None, ts, out);
        }
    }

    /// Finishes the in-flight request; `whole_body` is the body when it was
    /// never buffered.
    fn complete(&mut self, whole_body: Option<&[u8]>, ts: u64, out: &mut Vec<RequestEvent>) {
        let State::Body(inflight) = std::mem::replace(&mut self.state, State::Head) else {
            return;
        };
        let InFlight {
            mut summary,
            json_body,
            ..
        } = *inflight;
        summary.ts_ns = ts;
        let body = whole_body.unwrap_or(&self.body);
        summary.read_body(body, json_body);
        wipe(&mut self.body);
        self.started = false;
        out.push(RequestEvent::Complete(summary));
    }

    /// Accounts for bytes the syscall moved but the capture dropped.
    fn skip_lost(
        &mut self,
        mut lost: u64,
        ts: u64,
        out: &mut Vec<RequestEvent>,
    ) -> Result<(), ParseError> {
        while lost > 0 {
            let State::Body(inflight) = &mut self.state else {
                return match self.state {
                    State::Failed => Ok(()),
                    // Whatever the lost bytes were, they hid (part of) a head.
                    _ => Err(ParseError::HeadLost),
                };
            };
            let Skipped {
                bytes: skipped,
                done,
                ..
            } = inflight.framing.skip_lost(lost)?;
            inflight.summary.body_bytes = inflight.summary.body_bytes.saturating_add(skipped);
            inflight.summary.body_truncated = true;
            wipe(&mut self.body);
            lost -= skipped;
            if done {
                self.complete(None, ts, out);
            } else if skipped == 0 {
                break; // unreachable: a body state always takes lost bytes
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testutil::chunk, *};

    const CHAT: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: req-1\r\ntraceparent: 00-abc-def-01\r\nContent-Length: 82\r\n\r\n{\"model\":\"llama\",\"stream\":true,\"max_tokens\":16,\"messages\":[{\"content\":\"hello\"}]}  ";

    fn feed_all(parts: &[Chunk<'_>]) -> Vec<RequestEvent> {
        let mut d = RequestDecoder::new(Limits::default());
        let mut out = Vec::new();
        for p in parts {
            d.feed(*p, &mut out);
        }
        out
    }

    fn completes(events: &[RequestEvent]) -> Vec<&RequestSummary> {
        events
            .iter()
            .filter_map(|e| match e {
                RequestEvent::Complete(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    fn strip_ts(events: &[RequestEvent]) -> Vec<RequestEvent> {
        events
            .iter()
            .map(|e| match e {
                RequestEvent::Started { .. } => RequestEvent::Started { ts_ns: 0 },
                RequestEvent::Complete(s) => RequestEvent::Complete(RequestSummary {
                    ts_ns: 0,
                    ..s.clone()
                }),
                e => e.clone(),
            })
            .collect()
    }

    #[test]
    fn chat_request_whole() {
        assert_eq!(
            CHAT.len() - CHAT.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4,
            82
        );
        let out = feed_all(&[chunk(CHAT, 7)]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], RequestEvent::Started { ts_ns: 7 });
        let s = completes(&out)[0];
        assert_eq!(s.method, "POST");
        assert_eq!(s.path, "/v1/chat/completions");
        assert_eq!(s.x_request_id.as_deref(), Some("req-1"));
        assert_eq!(s.traceparent.as_deref(), Some("00-abc-def-01"));
        assert_eq!(s.content_length, Some(82));
        assert_eq!(s.body_bytes, 82);
        assert_eq!(s.head_bytes, (CHAT.len() - 82) as u64);
        assert_eq!(s.model.as_deref(), Some("llama"));
        assert_eq!(s.stream, Some(true));
        assert_eq!(s.max_tokens, Some(16));
        assert_eq!(s.prompt_bytes, Some(5));
        assert!(!s.body_truncated && !s.body_json_error);
    }

    #[test]
    fn byte_at_a_time_equals_whole() {
        let mut input = CHAT.to_vec();
        input.extend_from_slice(b"\r\nGET /health HTTP/1.1\r\n\r\n");
        let whole = feed_all(&[chunk(&input, 1)]);
        let bytes: Vec<Chunk<'_>> = input.chunks(1).map(|b| chunk(b, 1)).collect();
        let split = feed_all(&bytes);
        assert_eq!(strip_ts(&whole), strip_ts(&split));
        assert_eq!(completes(&whole).len(), 2);
        // ts: Started at the first byte's chunk, Complete at the last byte's.
        let timed: Vec<Chunk<'_>> = input
            .chunks(1)
            .enumerate()
            .map(|(i, b)| chunk(b, i as u64))
            .collect();
        let out = feed_all(&timed);
        assert_eq!(out[0], RequestEvent::Started { ts_ns: 0 });
        assert_eq!(completes(&out)[0].ts_ns, CHAT.len() as u64 - 1);
    }

    #[test]
    fn keep_alive_and_pipelining() {
        let second = b"POST /completion HTTP/1.1\r\nContent-Length: 30\r\n\r\n{\"prompt\":\"abc\",\"n_predict\":4}";
        let out = feed_all(&[chunk(CHAT, 1), chunk(second, 2)]);
        let c = completes(&out);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (
                c[1].path.as_str(),
                c[1].prompt_bytes,
                c[1].max_tokens,
                c[1].ts_ns
            ),
            ("/completion", Some(3), Some(4), 2)
        );

        let mut pipelined = CHAT.to_vec();
        pipelined.extend_from_slice(second);
        pipelined.extend_from_slice(b"GET /metrics HTTP/1.1\r\n\r\n");
        let out = feed_all(&[chunk(&pipelined, 3)]);
        assert_eq!(out.len(), 6);
        let c = completes(&out);
        assert_eq!(
            c.iter().map(|s| s.path.as_str()).collect::<Vec<_>>(),
            ["/v1/chat/completions", "/completion", "/metrics"]
        );
        assert_eq!(c[2].body_bytes, 0);
        assert_eq!(c[2].model, None);
    }

    #[test]
    fn garbage_is_not_http_immediately() {
        let out = feed_all(&[chunk(b"\x16\x03\x01\x02\x00\x01", 1), chunk(CHAT, 2)]);
        assert_eq!(
            out,
            vec![
                RequestEvent::Started { ts_ns: 1 },
                RequestEvent::Error(ParseError::NotHttp)
            ]
        );
        let out = feed_all(&[chunk(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 1)]);
        assert_eq!(out.last(), Some(&RequestEvent::Error(ParseError::NotHttp)));
        assert!(completes(&out).is_empty());
    }

    #[test]
    fn reset_recovers_after_error() {
        let mut d = RequestDecoder::new(Limits::default());
        let mut out = Vec::new();
        d.feed(chunk(b"\x00\x01garbage", 1), &mut out);
        d.reset();
        d.feed(chunk(CHAT, 2), &mut out);
        assert_eq!(completes(&out).len(), 1);
    }

    #[test]
    fn head_limits_and_losses() {
        let limits = Limits {
            max_head_bytes: 64,
            ..Limits::default()
        };
        let mut d = RequestDecoder::new(limits);
        let mut out = Vec::new();
        d.feed(chunk(CHAT, 1), &mut out);
        assert_eq!(
            out.last(),
            Some(&RequestEvent::Error(ParseError::HeadTooLarge))
        );

        let out = feed_all(&[
            Chunk {
                bytes: b"POST /v1/chat HTTP/1.1\r\nHo",
                lost: 100,
                ts_ns: 1,
            },
            chunk(b"\r\n\r\n", 2),
        ]);
        assert_eq!(
            out,
            vec![
                RequestEvent::Started { ts_ns: 1 },
                RequestEvent::Error(ParseError::HeadLost)
            ]
        );
        // Truncated head: the connection just stops; no event beyond Started.
        let out = feed_all(&[chunk(b"POST /v1/chat HTTP/1.1\r\nHost: a", 1)]);
        assert_eq!(out, vec![RequestEvent::Started { ts_ns: 1 }]);
    }

    #[test]
    fn lost_bytes_in_body() {
        let head_len = CHAT.len() - 82;
        let first = &CHAT[..head_len + 10];
        let out = feed_all(&[
            Chunk {
                bytes: first,
                lost: 72,
                ts_ns: 5,
            },
            chunk(b"GET / HTTP/1.1\r\n\r\n", 6),
        ]);
        let c = completes(&out);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (
                c[0].body_bytes,
                c[0].body_truncated,
                c[0].model.clone(),
                c[0].ts_ns
            ),
            (82, true, None, 5)
        );
        assert!(!c[0].body_json_error);
        // Loss running past the body into the next head.
        let out = feed_all(&[Chunk {
            bytes: first,
            lost: 80,
            ts_ns: 5,
        }]);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2], RequestEvent::Error(ParseError::HeadLost));
    }

    #[test]
    fn body_over_limit_is_truncated() {
        let limits = Limits {
            max_body_bytes: 20,
            ..Limits::default()
        };
        for split in [false, true] {
            let mut d = RequestDecoder::new(limits);
            let mut out = Vec::new();
            if split {
                for b in CHAT.chunks(7) {
                    d.feed(chunk(b, 1), &mut out);
                }
            } else {
                d.feed(chunk(CHAT, 1), &mut out);
            }
            let c = completes(&out);
            assert!(c[0].body_truncated && c[0].model.is_none() && c[0].body_bytes == 82);
        }
    }

    #[test]
    fn chunked_request_body() {
        let req = b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"prompt\"\r\n0c;x=y\r\n:\"hi\",\"m\":1}\r\n0\r\nTrailer: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        for size in [1, 3, req.len()] {
            let parts: Vec<Chunk<'_>> = req.chunks(size).map(|b| chunk(b, 1)).collect();
            let out = feed_all(&parts);
            let c = completes(&out);
            assert_eq!(c.len(), 2, "split {size}");
            assert_eq!(c[0].prompt_bytes, Some(2));
            assert_eq!(c[0].content_length, None);
            let head_len = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            assert_eq!(c[0].body_bytes, (req.len() - head_len - 18) as u64);
            assert!(!c[0].body_json_error);
        }
    }

    #[test]
    fn json_errors_do_not_fail_the_request() {
        let out = feed_all(&[chunk(
            b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\n{bad}",
            1,
        )]);
        let c = completes(&out);
        assert!(c[0].body_json_error && c[0].model.is_none());
        let out = feed_all(&[chunk(
            b"POST /x HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
            1,
        )]);
        assert!(!completes(&out)[0].body_json_error);
        // A JSON-looking body is parsed whatever the Content-Type (curl -d sends form-urlencoded).
        let out = feed_all(&[chunk(
            b"POST /x HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 15\r\n\r\n{\"model\":\"abc\"}",
            1,
        )]);
        assert_eq!(completes(&out)[0].model.as_deref(), Some("abc"));
        let out = feed_all(&[chunk(b"POST /x HTTP/1.1\r\nContent-Length: zz\r\n\r\n", 1)]);
        assert_eq!(out.last(), Some(&RequestEvent::Error(ParseError::NotHttp)));
    }

    #[test]
    fn long_fields_are_truncated() {
        let long = "a".repeat(400);
        let req = format!("GET /{long} HTTP/1.1\r\nX-Request-Id: {long}\r\n\r\n");
        let out = feed_all(&[chunk(req.as_bytes(), 1)]);
        let c = completes(&out);
        assert_eq!(
            (c[0].path.len(), c[0].x_request_id.as_ref().map(String::len)),
            (256, Some(256))
        );
    }
}
