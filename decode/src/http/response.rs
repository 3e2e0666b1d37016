//! Decoding of the responses a server writes: status heads, chunked /
//! Content-Length / until-close framing, server-sent token streams and
//! non-streaming JSON completions.

use super::{
    Chunk, Limits, MAX_NAME_BYTES, ParseError,
    chunked::Advance,
    collect_body,
    counts::{Timings, Usage},
    framing::{BodyHeaders, Framing, Skipped},
    head::{HeadBuf, HeadProgress, MAX_HEADERS, ParseResult, blank_lines, map_httparse_err},
    json,
    sse::{EventFormat, EventFramer, RawEvent},
    template::TokenTemplate,
    truncated_str, wipe,
};

/// What the response side of a connection reports, in stream order.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseEvent {
    /// A final (non-1xx) response head was written.
    Head {
        /// Timestamp of the chunk that completed the head.
        ts_ns: u64,
        /// Status code.
        status: u16,
        /// `Content-Type: text/event-stream` (or a JSON-lines type): a token stream follows.
        event_stream: bool,
        /// `Transfer-Encoding: chunked`.
        chunked: bool,
        /// Declared `Content-Length`, if any.
        content_length: Option<u64>,
    },
    /// One server-sent event with a data field.
    Sse(SseEvent),
    /// A complete non-streaming body.
    Body(BodySummary),
    /// The response is complete (never emitted for bodies delimited by
    /// connection close; see [`ResponseDecoder::close`]).
    End {
        /// Timestamp of the chunk that completed the response.
        ts_ns: u64,
        /// Wire size of the body (including chunk framing), captured + lost.
        body_bytes: u64,
    },
    /// The stream cannot be decoded further; the decoder ignores input
    /// until `reset()`.
    Error(ParseError),
}

/// One streamed event reduced to what token timing needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SseEvent {
    /// Timestamp of the chunk that completed the event.
    pub ts_ns: u64,
    /// The event carries generated output (content, reasoning, tool calls
    /// or completion text): the basis for TTFT and inter-token latency.
    pub content: bool,
    /// The data is `[DONE]`.
    pub done: bool,
    /// Completion id (128 bytes max), only on the first event that has one,
    /// so the per-token path does not allocate.
    pub id: Option<String>,
    /// Token counts, when the server sends a usage object.
    pub usage: Option<Usage>,
    /// llama.cpp's server-side timings.
    pub timings: Option<Timings>,
    /// Some choice has a non-null `finish_reason`.
    pub finish: bool,
    /// The data was neither JSON of the expected shape nor `[DONE]`, or
    /// bytes of it were lost.
    pub json_error: bool,
    /// Bytes of the event were not captured (the kernel cuts token writes to
    /// a prefix behind a filling ring buffer), so whether it carried output
    /// is unknown.
    pub lost: bool,
}

/// A non-streaming completion body reduced to ids and counts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BodySummary {
    /// Timestamp of the chunk that completed the body.
    pub ts_ns: u64,
    /// Completion id, truncated to 128 bytes.
    pub id: Option<String>,
    /// The body carries generated output.
    pub content: bool,
    /// Token counts, when present.
    pub usage: Option<Usage>,
    /// llama.cpp's server-side timings, when present.
    pub timings: Option<Timings>,
    /// `kv_transfer_params` (a vLLM prefill server's hand-off), digested.
    pub kv_transfer_params: Option<inferscope_model::HandoffParams>,
    /// The body was expected to be JSON but did not parse.
    pub json_error: bool,
    /// Body bytes were lost or exceeded `max_body_bytes`, so the fields
    /// above are unknown.
    pub truncated: bool,
}

#[derive(Debug)]
struct Head {
    status: u16,
    events: Option<EventFormat>,
    body: BodyHeaders,
}

fn parse_head(buf: &[u8]) -> ParseResult<Head> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(buf).map_err(map_httparse_err)? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let mut head = Head {
        status: resp.code.unwrap_or_default(),
        events: None,
        body: BodyHeaders::default(),
    };
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        head.body.read(name, h.value)?;
        if name.eq_ignore_ascii_case(b"content-type") {
            head.events = EventFormat::of_content_type(h.value);
        }
    }
    Ok(Some((n, head)))
}

#[derive(Debug)]
struct InFlight {
    framing: Framing,
    /// The body is a token stream of this format.
    events: Option<EventFormat>,
    json_body: bool,
    /// Body wire bytes so far.
    wire_bytes: u64,
    /// Body payload bytes so far (after de-chunking), captured + lost.
    payload_bytes: u64,
    truncated: bool,
    /// An id was already reported for this response.
    id_reported: bool,
}

impl InFlight {
    /// A server-sent event stream: the only body whose token events capture recognises.
    fn sse(&self) -> bool {
        self.events == Some(EventFormat::Sse)
    }
}

#[derive(Debug)]
enum State {
    Head,
    Body(Box<InFlight>),
    /// After `101 Switching Protocols` the stream is no longer HTTP.
    Upgraded,
    Failed,
}

/// Turns the bytes a server writes to one connection into response events.
#[derive(Debug)]
pub struct ResponseDecoder {
    limits: Limits,
    state: State,
    head: HeadBuf,
    sse: EventFramer,
    /// Non-streaming body kept for JSON parsing, wiped after.
    body: Vec<u8>,
    /// The next response answers a HEAD request: it has no body whatever its headers say.
    next_is_head_reply: bool,
    /// Learn token event templates from writes that are one whole token event.
    learn_templates: bool,
    /// The template of the last such write, until taken.
    learned: Option<TokenTemplate>,
}

impl ResponseDecoder {
    /// A decoder for a fresh connection.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Head,
            head: HeadBuf::default(),
            sse: EventFramer::default(),
            body: Vec::new(),
            next_is_head_reply: false,
            learn_templates: false,
            learned: None,
        }
    }

    /// Turns template learning on (for connections capture can summarise token events of).
    pub fn set_learn_templates(&mut self, learn: bool) {
        self.learn_templates = learn;
    }

    /// The token event template learned from the last write that was one whole token event.
    pub fn take_template(&mut self) -> Option<TokenTemplate> {
        self.learned.take()
    }

    /// Between two events of a chunked event stream, at a chunk boundary: where a write that
    /// is one whole chunk holding one event begins, so a token record decodes as one.
    pub fn at_token_boundary(&self) -> bool {
        matches!(&self.state, State::Body(inflight)
            if inflight.sse()
                && matches!(&inflight.framing, Framing::Chunked(dec) if dec.at_chunk_start()))
            && self.sse.is_idle()
    }

    /// A write of `len` bytes that capture recognised as one whole token event of this
    /// connection's template (one chunk, one content event) and did not copy. Where this side
    /// of the stream is at a chunk boundary but inside an event (a previous chunk left a line
    /// of it), the event is reported cut; elsewhere the two views disagree (records were
    /// lost) and the bytes count as lost. It decodes as a content event exactly where
    /// [`Self::at_token_boundary`] held.
    pub fn feed_token(&mut self, ts_ns: u64, len: u64, out: &mut Vec<ResponseEvent>) {
        let at_chunk = matches!(&self.state, State::Body(inflight)
            if inflight.sse()
                && matches!(&inflight.framing, Framing::Chunked(dec) if dec.at_chunk_start()));
        if !at_chunk {
            self.feed(
                Chunk {
                    bytes: &[],
                    lost: len,
                    ts_ns,
                },
                out,
            );
            return;
        }
        let idle = self.sse.is_idle();
        if let State::Body(inflight) = &mut self.state {
            inflight.wire_bytes = inflight.wire_bytes.saturating_add(len);
            inflight.payload_bytes = inflight.payload_bytes.saturating_add(chunk_data_len(len));
        }
        let event = if idle {
            SseEvent {
                ts_ns,
                content: true,
                ..SseEvent::default()
            }
        } else {
            // The chunk ends the event a previous chunk began: what that part held is unknown
            // here, so the event is cut, as for bytes lost at a chunk boundary.
            self.sse.clear();
            SseEvent {
                ts_ns,
                json_error: true,
                lost: true,
                ..SseEvent::default()
            }
        };
        out.push(ResponseEvent::Sse(event));
    }

    /// Says whether the next response answers a HEAD request (the response alone cannot tell,
    /// and a HEAD reply's Content-Length describes a body that is never sent).
    pub fn set_next_is_head_reply(&mut self, is_head: bool) {
        if matches!(self.state, State::Head) {
            self.next_is_head_reply = is_head;
        }
    }

    /// Forgets all state (e.g. after an error or a connection reuse).
    pub fn reset(&mut self) {
        self.state = State::Head;
        self.next_is_head_reply = false;
        self.head.clear();
        self.sse.clear();
        wipe(&mut self.body);
    }

    /// The connection closed: completes a body delimited by close (emitting
    /// `Body`/`End`), then resets. Incomplete length-delimited responses
    /// produce nothing.
    pub fn close(&mut self, ts_ns: u64, out: &mut Vec<ResponseEvent>) {
        if let State::Body(inflight) = &self.state
            && matches!(inflight.framing, Framing::UntilClose)
        {
            self.complete(None, ts_ns, out);
        }
        self.reset();
    }

    /// Consumes one syscall's bytes, appending resulting events to `out`.
    pub fn feed(&mut self, chunk: Chunk<'_>, out: &mut Vec<ResponseEvent>) {
        let learn = self.learn_templates && chunk.lost == 0 && self.at_token_boundary();
        let events_before = out.len();
        let mut data = chunk.bytes;
        while !data.is_empty() && !matches!(self.state, State::Failed | State::Upgraded) {
            match self.step(data, chunk.ts_ns, out) {
                Ok(0) => break, // unreachable: every step makes progress
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(e) => return self.fail(e, out),
            }
        }
        if let Err(e) = self.skip_lost(chunk.lost, chunk.ts_ns, out) {
            self.fail(e, out);
        }
        if learn
            && self.at_token_boundary()
            && let [ResponseEvent::Sse(event)] = out.get(events_before..).unwrap_or_default()
            && event.content
            && !(event.finish || event.done || event.json_error || event.lost)
            && event.usage.is_none()
            && event.timings.is_none()
            && let Some(data) = one_chunk_data(chunk.bytes)
            && let Some(template) = TokenTemplate::learn(data)
        {
            self.learned = Some(template);
        }
    }

    fn fail(&mut self, e: ParseError, out: &mut Vec<ResponseEvent>) {
        self.reset();
        self.state = State::Failed;
        out.push(ResponseEvent::Error(e));
    }

    /// Handles a prefix of `data`, returning how much it used.
    fn step(
        &mut self,
        data: &[u8],
        ts: u64,
        out: &mut Vec<ResponseEvent>,
    ) -> Result<usize, ParseError> {
        match &mut self.state {
            State::Failed | State::Upgraded => Ok(data.len()),
            State::Head => {
                if self.head.is_empty() {
                    let blank = blank_lines(data);
                    if blank > 0 {
                        return Ok(blank);
                    }
                }
                match self
                    .head
                    .push(data, self.limits.max_head_bytes, parse_head)?
                {
                    HeadProgress::NeedMore => Ok(data.len()),
                    HeadProgress::Done {
                        consumed, value, ..
                    } => {
                        self.begin_body(value, ts, out);
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
                inflight.wire_bytes = inflight.wire_bytes.saturating_add(consumed as u64);
                let first_and_last = done && inflight.payload_bytes == 0;
                inflight.payload_bytes =
                    inflight.payload_bytes.saturating_add(payload.len() as u64);
                if inflight.events.is_some() {
                    let id_reported = &mut inflight.id_reported;
                    self.sse
                        .feed(payload, self.limits.max_sse_event_bytes, |raw| {
                            out.push(ResponseEvent::Sse(sse_event(raw, ts, id_reported)));
                        })?;
                    if done {
                        self.complete(None, ts, out);
                    }
                } else if first_and_last && payload.len() <= self.limits.max_body_bytes {
                    // The whole body is in this write: parse it in place.
                    self.complete(Some(payload), ts, out);
                } else {
                    collect_body(
                        &mut self.body,
                        &mut inflight.truncated,
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

    fn begin_body(&mut self, head: Head, ts: u64, out: &mut Vec<ResponseEvent>) {
        if head.status == 101 {
            self.state = State::Upgraded;
            return;
        }
        if (100..200).contains(&head.status) {
            return; // interim response: the final one follows
        }
        out.push(ResponseEvent::Head {
            ts_ns: ts,
            status: head.status,
            event_stream: head.events.is_some(),
            chunked: head.body.chunked,
            content_length: head.body.content_length,
        });
        let no_body = std::mem::take(&mut self.next_is_head_reply);
        let framing = if no_body || head.status == 204 || head.status == 304 {
            Framing::Length { remaining: 0 }
        } else {
            head.body.framing(self.limits.max_head_bytes, true)
        };
        let empty = framing.is_empty();
        if let Some(format) = head.events {
            self.sse.start(format);
        }
        self.state = State::Body(Box::new(InFlight {
            framing,
            events: head.events,
            json_body: head.body.json_body,
            wire_bytes: 0,
            payload_bytes: 0,
            truncated: false,
            id_reported: false,
        }));
        if empty {
            self.complete(None, ts, out);
        }
    }

    /// Finishes the in-flight response; `whole_body` is the body when it was
    /// never buffered.
    fn complete(&mut self, whole_body: Option<&[u8]>, ts: u64, out: &mut Vec<ResponseEvent>) {
        let State::Body(inflight) = std::mem::replace(&mut self.state, State::Head) else {
            return;
        };
        if inflight.events.is_some() {
            let mut id_reported = inflight.id_reported;
            self.sse.end(self.limits.max_sse_event_bytes, |raw| {
                out.push(ResponseEvent::Sse(sse_event(raw, ts, &mut id_reported)));
            });
        } else if inflight.payload_bytes > 0 {
            let mut summary = BodySummary {
                ts_ns: ts,
                truncated: inflight.truncated,
                ..BodySummary::default()
            };
            let body = whole_body.unwrap_or(&self.body);
            if inflight.json_body && !inflight.truncated {
                match json::parse_completion(body) {
                    Some(f) => {
                        summary.id = f.id.map(|id| truncated_str(&id, MAX_NAME_BYTES).to_owned());
                        summary.content = f.content;
                        summary.usage = f.usage;
                        summary.timings = f.timings;
                        summary.kv_transfer_params = f.kv_transfer_params;
                    }
                    None => summary.json_error = true,
                }
            }
            out.push(ResponseEvent::Body(summary));
        }
        wipe(&mut self.body);
        out.push(ResponseEvent::End {
            ts_ns: ts,
            body_bytes: inflight.wire_bytes,
        });
    }

    /// Accounts for bytes the syscall moved but the capture dropped.
    fn skip_lost(
        &mut self,
        mut lost: u64,
        ts: u64,
        out: &mut Vec<ResponseEvent>,
    ) -> Result<(), ParseError> {
        while lost > 0 {
            let State::Body(inflight) = &mut self.state else {
                return match self.state {
                    State::Failed | State::Upgraded => Ok(()),
                    _ => Err(ParseError::HeadLost),
                };
            };
            let Skipped {
                bytes: skipped,
                done,
                at_chunk_end,
            } = inflight.framing.skip_lost(lost)?;
            inflight.wire_bytes = inflight.wire_bytes.saturating_add(skipped);
            inflight.payload_bytes = inflight.payload_bytes.saturating_add(skipped);
            if inflight.events.is_some() {
                if at_chunk_end {
                    let id_reported = &mut inflight.id_reported;
                    self.sse.lost_at_boundary(|raw| {
                        out.push(ResponseEvent::Sse(sse_event(raw, ts, id_reported)));
                    });
                } else {
                    self.sse.lost();
                }
            } else {
                inflight.truncated = true;
                wipe(&mut self.body);
            }
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

/// The data of `write` when it is exactly one chunk (size line without extensions, data, CRLF).
fn one_chunk_data(write: &[u8]) -> Option<&[u8]> {
    let line = write.iter().position(|&b| b == b'\r')?;
    let digits = write.get(..line)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let size = usize::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
    let data_start = line + 2;
    if write.get(line..data_start)? != b"\r\n"
        || write.len() != data_start.checked_add(size)?.checked_add(2)?
        || !write.ends_with(b"\r\n")
    {
        return None;
    }
    write.get(data_start..data_start + size)
}

/// Chunk data bytes of a write that is one whole chunk of `len` bytes: the size line is the
/// shortest hex number that makes the lengths add up.
fn chunk_data_len(len: u64) -> u64 {
    (1..=16u32)
        .find_map(|digits| {
            let size = len.checked_sub(u64::from(digits) + 4)?;
            let needed = (64 - size.leading_zeros()).div_ceil(4).max(1);
            (needed == digits).then_some(size)
        })
        .unwrap_or(0)
}

/// Reduces one SSE event to flags; allocates only for the first id.
pub(crate) fn sse_event(raw: RawEvent<'_>, ts_ns: u64, id_reported: &mut bool) -> SseEvent {
    let data = match raw {
        RawEvent::Corrupt => {
            return SseEvent {
                ts_ns,
                json_error: true,
                lost: true,
                ..SseEvent::default()
            };
        }
        RawEvent::Data(d) => d,
    };
    if data == b"[DONE]" {
        return SseEvent {
            ts_ns,
            done: true,
            ..SseEvent::default()
        };
    }
    let Some(f) = json::parse_completion(data) else {
        return SseEvent {
            ts_ns,
            json_error: true,
            ..SseEvent::default()
        };
    };
    let id = match f.id {
        Some(id) if !*id_reported => {
            *id_reported = true;
            Some(truncated_str(&id, MAX_NAME_BYTES).to_owned())
        }
        _ => None,
    };
    SseEvent {
        ts_ns,
        content: f.content,
        done: false,
        id,
        usage: f.usage,
        timings: f.timings,
        finish: f.finish,
        json_error: false,
        lost: false,
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::testutil::{XorShift, chunk},
        *,
    };

    const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\n\r\n";
    const EV_ROLE: &str = r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"chatcmpl-XYZ","model":"m","object":"chat.completion.chunk"}"#;
    const EV_TOK: &str = r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":1,"id":"chatcmpl-XYZ","model":"m","object":"chat.completion.chunk"}"#;
    const EV_LAST: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-XYZ","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":8,"prompt_tokens":20,"total_tokens":28},"timings":{"prompt_n":20,"prompt_ms":12.5,"prompt_per_token_ms":0.625,"predicted_n":8,"predicted_ms":100.1}}"#;

    fn http_chunk(payload: &str) -> Vec<u8> {
        let mut v = format!("{:x}\r\n", payload.len()).into_bytes();
        v.extend_from_slice(payload.as_bytes());
        v.extend_from_slice(b"\r\n");
        v
    }

    /// The llama.cpp stream as its separate writes.
    fn llama_writes() -> Vec<Vec<u8>> {
        vec![
            SSE_HEAD.to_vec(),
            http_chunk(&format!("data: {EV_ROLE}\n\ndata: {EV_TOK}\n\n")),
            http_chunk(&format!("data: {EV_TOK}\n\n")),
            http_chunk(&format!("data: {EV_LAST}\n\n")),
            http_chunk("data: [DONE]\n\n"),
            b"0\r\n".to_vec(),
            b"\r\n".to_vec(),
        ]
    }

    fn feed_all(parts: &[Chunk<'_>]) -> Vec<ResponseEvent> {
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        for p in parts {
            d.feed(*p, &mut out);
        }
        out
    }

    fn strip_ts(events: &[ResponseEvent]) -> Vec<ResponseEvent> {
        events
            .iter()
            .map(|e| match e.clone() {
                ResponseEvent::Head {
                    status,
                    event_stream,
                    chunked,
                    content_length,
                    ..
                } => ResponseEvent::Head {
                    ts_ns: 0,
                    status,
                    event_stream,
                    chunked,
                    content_length,
                },
                ResponseEvent::Sse(s) => ResponseEvent::Sse(SseEvent { ts_ns: 0, ..s }),
                ResponseEvent::Body(b) => ResponseEvent::Body(BodySummary { ts_ns: 0, ..b }),
                ResponseEvent::End { body_bytes, .. } => ResponseEvent::End {
                    ts_ns: 0,
                    body_bytes,
                },
                e => e,
            })
            .collect()
    }

    /// Ollama's streaming shape over HTTP/1.1: one JSON document per line, chunked; the last
    /// line (its counts) needs no newline before the body ends.
    #[test]
    fn json_lines_are_token_events() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut parts: Vec<Vec<u8>> = vec![head.to_vec()];
        for word in ["a", "b", "c"] {
            let line = format!("{{\"model\":\"m\",\"response\":\"{word}\",\"done\":false}}\n");
            parts.push(format!("{:x}\r\n{line}\r\n", line.len()).into_bytes());
        }
        let last = r#"{"done":true,"prompt_eval_count":2,"eval_count":3}"#;
        parts.push(format!("{:x}\r\n{last}\r\n0\r\n\r\n", last.len()).into_bytes());
        let chunks: Vec<Chunk<'_>> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| Chunk {
                bytes: p,
                lost: 0,
                ts_ns: i as u64,
            })
            .collect();
        let out = feed_all(&chunks);
        assert!(matches!(
            out[0],
            ResponseEvent::Head {
                event_stream: true,
                ..
            }
        ));
        let events = sse(&out);
        assert_eq!(events.len(), 4);
        assert!(events[..3].iter().all(|e| e.content && !e.json_error));
        assert_eq!(
            events.iter().map(|e| e.ts_ns).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert!(events[3].finish && !events[3].content);
        assert_eq!(
            events[3].usage,
            Some(Usage {
                prompt_tokens: Some(2),
                completion_tokens: Some(3),
                cached_tokens: None,
            })
        );
        assert!(matches!(out.last(), Some(ResponseEvent::End { .. })));
    }

    fn sse(events: &[ResponseEvent]) -> Vec<&SseEvent> {
        events
            .iter()
            .filter_map(|e| match e {
                ResponseEvent::Sse(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn llama_stream() {
        let writes = llama_writes();
        let chunks: Vec<Chunk<'_>> = writes
            .iter()
            .enumerate()
            .map(|(i, w)| chunk(w, i as u64))
            .collect();
        let out = feed_all(&chunks);
        assert_eq!(
            out[0],
            ResponseEvent::Head {
                ts_ns: 0,
                status: 200,
                event_stream: true,
                chunked: true,
                content_length: None
            }
        );
        let s = sse(&out);
        assert_eq!(s.len(), 5);
        // Role-only delta is not content, but carries the id.
        assert!(!s[0].content && s[0].id.as_deref() == Some("chatcmpl-XYZ"));
        assert!(s[1].content && s[1].id.is_none() && s[1].ts_ns == 1);
        assert!(s[2].content && s[2].ts_ns == 2);
        assert!(s[3].finish && !s[3].content);
        assert_eq!(
            s[3].usage,
            Some(Usage {
                prompt_tokens: Some(20),
                completion_tokens: Some(8),
                cached_tokens: None,
            })
        );
        assert_eq!(s[3].timings.and_then(|t| t.predicted_ms), Some(100.1));
        assert!(s[4].done && !s[4].json_error && s[4].ts_ns == 4);
        let body_bytes: usize = writes[1..].iter().map(Vec::len).sum();
        assert_eq!(
            out.last(),
            Some(&ResponseEvent::End {
                ts_ns: 6,
                body_bytes: body_bytes as u64
            })
        );
        assert_eq!(out.len(), 7);
    }

    #[test]
    fn byte_at_a_time_and_random_splits_equal_whole() {
        let all: Vec<u8> = llama_writes().concat();
        let whole = strip_ts(&feed_all(&[chunk(&all, 0)]));
        let bytes: Vec<Chunk<'_>> = all.chunks(1).map(|b| chunk(b, 0)).collect();
        assert_eq!(strip_ts(&feed_all(&bytes)), whole);
        let mut rng = XorShift(42);
        for _ in 0..50 {
            let mut parts = Vec::new();
            let mut rest: &[u8] = &all;
            while !rest.is_empty() {
                let n = (rng.below(64) as usize + 1).min(rest.len());
                parts.push(chunk(&rest[..n], 0));
                rest = &rest[n..];
            }
            assert_eq!(strip_ts(&feed_all(&parts)), whole);
        }
    }

    #[test]
    fn writev_many_events_and_keep_alive() {
        // uvicorn style: several events, then the next response, in one write.
        let mut w = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..3 {
            w.extend(http_chunk(&format!("data: {EV_TOK}\r\n\r\n")));
        }
        w.extend(http_chunk("data: [DONE]\r\n\r\n"));
        w.extend_from_slice(b"0\r\n\r\n");
        w.extend_from_slice(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        );
        let out = feed_all(&[chunk(&w, 9)]);
        let s = sse(&out);
        assert_eq!(s.len(), 4);
        assert!(s[..3].iter().all(|e| e.content));
        assert_eq!(s.iter().filter(|e| e.id.is_some()).count(), 1);
        assert!(s[3].done);
        let ends = out
            .iter()
            .filter(|e| matches!(e, ResponseEvent::End { .. }))
            .count();
        assert_eq!(ends, 2);
        assert!(matches!(
            out.last(),
            Some(ResponseEvent::End { body_bytes: 2, .. })
        ));
        assert!(
            out.iter()
                .any(|e| matches!(e, ResponseEvent::Body(b) if !b.json_error && !b.content))
        );
    }

    #[test]
    fn non_streaming_json_body() {
        let body = r#"{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let expect_body = BodySummary {
            ts_ns: 0,
            id: Some("chatcmpl-1".into()),
            content: true,
            usage: Some(Usage {
                prompt_tokens: Some(9),
                completion_tokens: Some(3),
                cached_tokens: None,
            }),
            timings: None,
            kv_transfer_params: None,
            json_error: false,
            truncated: false,
        };
        for size in [1, 7, resp.len()] {
            let parts: Vec<Chunk<'_>> = resp.as_bytes().chunks(size).map(|b| chunk(b, 0)).collect();
            let out = feed_all(&parts);
            assert_eq!(
                out,
                vec![
                    ResponseEvent::Head {
                        ts_ns: 0,
                        status: 200,
                        event_stream: false,
                        chunked: false,
                        content_length: Some(body.len() as u64)
                    },
                    ResponseEvent::Body(expect_body.clone()),
                    ResponseEvent::End {
                        ts_ns: 0,
                        body_bytes: body.len() as u64
                    },
                ]
            );
        }
        // Lost bytes in a Content-Length body: framing holds, JSON unknown.
        let cut = resp.len() - body.len() + 10;
        let out = feed_all(&[Chunk {
            bytes: &resp.as_bytes()[..cut],
            lost: (body.len() - 10) as u64,
            ts_ns: 3,
        }]);
        assert!(
            matches!(&out[1], ResponseEvent::Body(b) if b.truncated && b.id.is_none() && !b.json_error)
        );
        assert_eq!(
            out[2],
            ResponseEvent::End {
                ts_ns: 3,
                body_bytes: body.len() as u64
            }
        );
    }

    /// A vLLM prefill server's answer (max_tokens 1) carries the hand-off for the decode
    /// server: kept digested, block ids only as a length and digest.
    #[test]
    fn prefill_answer_hand_off() {
        let body = r#"{"id":"chatcmpl-x","choices":[{"index":0,"text":"a","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[4,5,6],"remote_engine_id":"e-1","remote_request_id":"cmpl-x-0-1a2b3c4d","remote_host":"10.1.2.3","remote_port":5600,"tp_size":1}}"#;
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let out = feed_all(&[chunk(resp.as_bytes(), 0)]);
        let Some(ResponseEvent::Body(b)) = out.get(1) else {
            panic!("a body: {out:?}");
        };
        let p = b.kv_transfer_params.as_ref().expect("the hand-off");
        assert_eq!(p.str("remote_request_id"), Some("cmpl-x-0-1a2b3c4d"));
        assert_eq!(p.int("remote_port"), Some(5600));
        assert!(matches!(
            p.get("remote_block_ids"),
            Some(inferscope_model::HandoffValue::Digest { len: 3, .. })
        ));
    }

    #[test]
    fn content_kinds() {
        let events = [
            (
                r#"{"choices":[{"delta":{"reasoning_content":"think"}}]}"#,
                true,
            ),
            (
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}}]}}]}"#,
                true,
            ),
            (
                r#"{"choices":[{"text":"tok","index":0,"finish_reason":null}]}"#,
                true,
            ),
            (
                r#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#,
                false,
            ),
            (r#"{"choices":[{"delta":{"content":""}}]}"#, false),
        ];
        let mut w = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".to_vec();
        for (e, _) in events {
            w.extend_from_slice(format!("data: {e}\n\n").as_bytes());
        }
        w.extend_from_slice(b"data: not json\n\n");
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        d.feed(chunk(&w, 1), &mut out);
        let s = sse(&out);
        for (i, (_, content)) in events.iter().enumerate() {
            assert_eq!(s[i].content, *content, "event {i}");
            assert!(!s[i].json_error);
        }
        assert!(s[5].json_error && !s[5].content);
        // Until-close body: no End until the caller closes.
        assert!(!out.iter().any(|e| matches!(e, ResponseEvent::End { .. })));
        d.close(2, &mut out);
        assert_eq!(
            out.last(),
            Some(&ResponseEvent::End {
                ts_ns: 2,
                body_bytes: (w.len() - 52) as u64
            })
        );
    }

    #[test]
    fn lost_bytes_in_stream() {
        let ev = format!("data: {EV_TOK}\n\n");
        let c1 = http_chunk(&ev);
        // Loss inside one chunk's data: that event is corrupt, framing holds.
        let mut writes = vec![SSE_HEAD.to_vec()];
        writes.push(c1.clone());
        let out = {
            let mut d = ResponseDecoder::new(Limits::default());
            let mut out = Vec::new();
            for w in &writes {
                d.feed(chunk(w, 1), &mut out);
            }
            let head_len = c1.len() - ev.len() - 2;
            d.feed(
                Chunk {
                    bytes: &c1[..head_len + 20],
                    lost: (ev.len() - 20) as u64,
                    ts_ns: 2,
                },
                &mut out,
            );
            d.feed(chunk(&c1[c1.len() - 2..], 2), &mut out);
            d.feed(chunk(&c1, 3), &mut out);
            d.feed(chunk(b"0\r\n\r\n", 4), &mut out);
            out
        };
        let s = sse(&out);
        assert_eq!(s.len(), 3);
        assert!(s[0].content && !s[0].json_error);
        assert!(s[1].json_error && !s[1].content);
        assert!(s[2].content && !s[2].json_error);
        assert!(matches!(
            out.last(),
            Some(ResponseEvent::End { ts_ns: 4, .. })
        ));

        // Loss crossing into the next chunk-size line: framing is gone.
        let two = [c1.clone(), c1.clone()].concat();
        let out = feed_all(&[
            chunk(SSE_HEAD, 1),
            Chunk {
                bytes: &two[..10],
                lost: (two.len() - 10) as u64,
                ts_ns: 2,
            },
        ]);
        assert_eq!(
            out.last(),
            Some(&ResponseEvent::Error(ParseError::FramingLost))
        );
    }

    #[test]
    fn huge_sse_event_fails_without_panic() {
        let limits = Limits {
            max_sse_event_bytes: 1024,
            ..Limits::default()
        };
        let big = format!("data: {{\"x\":\"{}\"}}\n\n", "a".repeat(5000));
        let mut w = SSE_HEAD.to_vec();
        w.extend(http_chunk(&format!("data: {EV_TOK}\n\n")));
        w.extend(http_chunk(&big));
        w.extend(http_chunk(&format!("data: {EV_TOK}\n\n")));
        for size in [1, 100, w.len()] {
            let mut d = ResponseDecoder::new(limits);
            let mut out = Vec::new();
            for part in w.chunks(size) {
                d.feed(chunk(part, 1), &mut out);
            }
            assert_eq!(sse(&out).len(), 1);
            assert_eq!(
                out.last(),
                Some(&ResponseEvent::Error(ParseError::SseEventTooLarge))
            );
        }
    }

    #[test]
    fn interim_and_head_only_statuses() {
        let w = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
        let out = feed_all(&[chunk(w, 1)]);
        let statuses: Vec<u16> = out
            .iter()
            .filter_map(|e| match e {
                ResponseEvent::Head { status, .. } => Some(*status),
                _ => None,
            })
            .collect();
        assert_eq!(statuses, [204, 304, 404]);
        assert_eq!(
            out.iter()
                .filter(|e| **e
                    == ResponseEvent::End {
                        ts_ns: 1,
                        body_bytes: 0
                    })
                .count(),
            3
        );
        assert_eq!(out.len(), 6);

        let out = feed_all(&[chunk(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello",
            1,
        )]);
        assert!(out.is_empty());
    }

    #[test]
    fn errors() {
        assert_eq!(
            feed_all(&[chunk(b"\x00\x00\x00\x18", 1)]),
            vec![ResponseEvent::Error(ParseError::NotHttp)]
        );
        let out = feed_all(&[chunk(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nxyz\r\n",
            1,
        )]);
        assert_eq!(
            out.last(),
            Some(&ResponseEvent::Error(ParseError::BadChunkSize))
        );
        let out = feed_all(&[Chunk {
            bytes: b"HTTP/1.1 200 OK\r\n",
            lost: 10,
            ts_ns: 1,
        }]);
        assert_eq!(out, vec![ResponseEvent::Error(ParseError::HeadLost)]);
        // Failed decoders stay silent until reset.
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        d.feed(chunk(b"garbage!", 1), &mut out);
        d.feed(chunk(b"HTTP/1.1 204 No Content\r\n\r\n", 2), &mut out);
        assert_eq!(out.len(), 1);
        d.reset();
        d.feed(chunk(b"HTTP/1.1 204 No Content\r\n\r\n", 3), &mut out);
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn head_replies_have_no_body() {
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        d.set_next_is_head_reply(true);
        d.feed(
            chunk(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n", 1),
            &mut out,
        );
        assert!(
            matches!(out.last(), Some(ResponseEvent::End { .. })),
            "{out:?}"
        );
        out.clear();
        // The next response on the connection is decoded normally.
        d.feed(
            chunk(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 2),
            &mut out,
        );
        assert!(
            matches!(out.last(), Some(ResponseEvent::End { .. })),
            "{out:?}"
        );
    }

    #[test]
    fn token_writes_decode_like_the_full_writes_they_stand_for() {
        let writes = llama_writes();
        let full = feed_all(&writes.iter().map(|w| chunk(w, 0)).collect::<Vec<_>>());
        let mut d = ResponseDecoder::new(Limits::default());
        d.set_learn_templates(true);
        let mut out = Vec::new();
        // Head, then role and first token in one chunk: two events, nothing to learn.
        d.feed(chunk(&writes[0], 0), &mut out);
        d.feed(chunk(&writes[1], 0), &mut out);
        assert!(d.take_template().is_none());
        // One chunk holding one token event: its template.
        d.feed(chunk(&writes[2], 0), &mut out);
        let template = d
            .take_template()
            .expect("a template from a one-event chunk");
        let data = one_chunk_data(&writes[2]).unwrap();
        assert!(template.matches(data));
        // The kernel would now send the same write as a token record.
        let mut replayed = Vec::new();
        let mut d2 = ResponseDecoder::new(Limits::default());
        for w in &writes[..2] {
            d2.feed(chunk(w, 0), &mut replayed);
        }
        d2.feed_token(0, writes[2].len() as u64, &mut replayed);
        for w in &writes[3..] {
            d2.feed(chunk(w, 0), &mut replayed);
        }
        // The same events, the same body size: only the (already reported) id is not read.
        assert_eq!(strip_ts(&replayed), strip_ts(&full));
        // Finish, [DONE] and the terminator are not token events: nothing learned from them.
        for w in &writes[3..] {
            d.feed(chunk(w, 0), &mut out);
        }
        assert!(d.take_template().is_none());
    }

    #[test]
    fn a_token_write_where_no_event_can_start_is_lost_bytes() {
        let writes = llama_writes();
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        // No head yet: the stream's framing is unknown.
        d.feed_token(0, 40, &mut out);
        assert_eq!(out, vec![ResponseEvent::Error(ParseError::HeadLost)]);
        // Inside a chunk (half an event written): the token write cannot be a whole chunk.
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        d.feed(chunk(&writes[0], 0), &mut out);
        d.feed(chunk(&writes[2][..20], 0), &mut out);
        d.feed_token(0, 40, &mut out);
        assert!(
            out.iter()
                .all(|e| !matches!(e, ResponseEvent::Sse(s) if s.content))
        );
    }

    #[test]
    fn a_token_write_ending_an_event_a_previous_chunk_began_is_a_cut_event() {
        let writes = llama_writes();
        let mut d = ResponseDecoder::new(Limits::default());
        let mut out = Vec::new();
        d.feed(chunk(&writes[0], 0), &mut out);
        // A chunk with only an `event:` line: the framer is inside an event.
        d.feed(chunk(&http_chunk("event: message\n"), 0), &mut out);
        assert!(!d.at_token_boundary());
        out.clear();
        d.feed_token(7, writes[2].len() as u64, &mut out);
        assert_eq!(
            out,
            vec![ResponseEvent::Sse(SseEvent {
                ts_ns: 7,
                json_error: true,
                lost: true,
                ..SseEvent::default()
            })]
        );
        // Framing holds: the next events decode.
        out.clear();
        d.feed(chunk(&writes[2], 8), &mut out);
        assert!(matches!(&out[..], [ResponseEvent::Sse(s)] if s.content));
    }

    #[test]
    fn chunk_data_length_follows_the_shortest_size_line() {
        for size in [1u64, 15, 16, 255, 256, 4095, 4096, 70_000] {
            let line = format!("{size:x}\r\n").len() as u64;
            assert_eq!(chunk_data_len(line + size + 2), size, "size {size}");
        }
        let write = b"5\r\nhello\r\n";
        assert_eq!(one_chunk_data(write), Some(&b"hello"[..]));
        assert_eq!(one_chunk_data(b"5\r\nhello\r\n0\r\n\r\n"), None);
        assert_eq!(one_chunk_data(b"5;x=1\r\nhello\r\n"), None);
    }
}
