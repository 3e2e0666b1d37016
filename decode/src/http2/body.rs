//! The bodies of a plain HTTP/2 stream (not gRPC), read as HTTP/1's are: the request's
//! completion parameters, and the response as a token stream (server-sent events or JSON lines
//! inside DATA frames, however the frames cut them) or as one JSON document.
//!
//! Privacy: body bytes are held only until the document or event they belong to is whole, then
//! wiped; only ids, counts and flags leave. Memory: each body is capped by [`http::Limits`], and
//! all plain streams of a connection together hold at most [`MAX_HELD_BYTES`], so 256 streams
//! cost no more than a few HTTP/1 connections.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use super::Value;
use crate::http::{
    self, BodySummary, RequestSummary, SseEvent,
    json::parse_completion,
    response::sse_event,
    sse::{EventFormat, EventFramer},
    truncated_str, wipe,
};

/// Body bytes the plain streams of one connection hold at once; a body that would go past it is
/// read as truncated (its fields unknown), an event as lost.
pub const MAX_HELD_BYTES: usize = 1024 * 1024;

/// What the bodies of a plain stream said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exchange {
    /// The request body's fields (model, stream, max_tokens, prompt size); its head's fields
    /// are the stream's.
    pub request: RequestSummary,
    /// The response's id, usage, timings and flags: from its events, or its one document.
    pub response: BodySummary,
    /// The response was a token stream (SSE or JSON lines).
    pub streamed: bool,
    /// The response's DATA was read as a plain body (not gRPC messages).
    pub response_plain: bool,
    /// Events of the token stream that did not parse as a completion chunk.
    pub events_unparsed: u32,
    /// Events the capture cut (each counted as a token: see [`SseEvent::lost`]).
    pub events_cut: u32,
    /// An event was larger than [`http::Limits::max_sse_event_bytes`]: later ones were not read.
    pub event_too_large: bool,
}

/// A connection's count of body bytes held, shared by its plain streams.
#[derive(Debug, Clone, Default)]
pub(super) struct Held(Arc<AtomicUsize>);

impl Held {
    /// Takes `n` more bytes if the connection's budget allows.
    fn take(&self, n: usize) -> bool {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(n).filter(|&total| total <= MAX_HELD_BYTES)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.0.fetch_sub(n, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
enum Response {
    /// Before the response's head.
    Unknown,
    Events {
        framer: EventFramer,
        held: usize,
    },
    /// JSON, kept until it ends.
    Document(Vec<u8>),
    /// Anything else: counted only.
    Opaque,
}

/// A plain stream's two bodies as they pass.
#[derive(Debug)]
pub(super) struct PlainBodies {
    limits: http::Limits,
    held: Held,
    request: Vec<u8>,
    request_json: bool,
    response: Response,
    id_reported: bool,
    exchange: Exchange,
}

impl PlainBodies {
    pub(super) fn new(request_content_type: &Value<String>, held: Held) -> Self {
        Self {
            limits: http::Limits::default(),
            held,
            request: Vec::new(),
            request_json: matches!(request_content_type, Value::Known(ct) if is_json(ct)),
            response: Response::Unknown,
            id_reported: false,
            exchange: Exchange::default(),
        }
    }

    /// Request body bytes; `lost`: as many more went uncaptured.
    pub(super) fn request_data(&mut self, bytes: &[u8], lost: u64) {
        let summary = &mut self.exchange.request;
        summary.body_bytes = summary
            .body_bytes
            .saturating_add(bytes.len() as u64)
            .saturating_add(lost);
        if summary.body_truncated {
            return;
        }
        let fits = lost == 0
            && self.request.len() + bytes.len() <= self.limits.max_body_bytes
            && self.held.take(bytes.len());
        if fits {
            self.request.extend_from_slice(bytes);
        } else {
            summary.body_truncated = true;
            self.held.give_back(self.request.len());
            wipe(&mut self.request);
        }
    }

    /// The request's END_STREAM: its body is whole.
    pub(super) fn request_end(&mut self) {
        self.exchange
            .request
            .read_body(&self.request, self.request_json);
        self.held.give_back(self.request.len());
        wipe(&mut self.request);
    }

    /// The response's head: its content-type says how to read the body.
    pub(super) fn response_head(&mut self, content_type: &Value<String>) {
        match content_type {
            Value::Known(ct) => {
                self.read_response_as(EventFormat::of_content_type(ct.as_bytes()), is_json(ct))
            }
            Value::Absent | Value::Unknown => self.read_response_as(None, false),
        }
    }

    /// The response's head did not say its content-type (an HPACK entry never seen): its first
    /// bytes do, if these are its first (`first` empty: they are not).
    pub(super) fn response_sniffed(&mut self, first: &[u8]) {
        let text = first.trim_ascii_start();
        let sse = [&b"data:"[..], b"event:", b"id:", b"retry:", b":"]
            .iter()
            .any(|field| text.starts_with(field));
        let json = text.starts_with(b"{");
        let format = if sse {
            Some(EventFormat::Sse)
        } else if json && self.exchange.request.stream == Some(true) {
            Some(EventFormat::Lines)
        } else {
            None
        };
        self.read_response_as(format, json);
    }

    /// From now on the response is a token stream of `format`, else one JSON document
    /// (`json`), else counted only.
    fn read_response_as(&mut self, format: Option<EventFormat>, json: bool) {
        self.exchange.response_plain = true;
        self.response = match format {
            Some(format) => {
                self.exchange.streamed = true;
                Response::Events {
                    framer: EventFramer::new(format),
                    held: 0,
                }
            }
            None if json => Response::Document(Vec::new()),
            None => Response::Opaque,
        };
    }

    /// Response body bytes written at `ts_ns`; each token event's time goes to `tokens`.
    pub(super) fn response_data(&mut self, bytes: &[u8], ts_ns: u64, tokens: &mut dyn FnMut(u64)) {
        let max_event = self.limits.max_sse_event_bytes;
        let max_body = self.limits.max_body_bytes;
        let Self {
            held: budget,
            response,
            id_reported,
            exchange,
            ..
        } = self;
        match response {
            Response::Events { framer, held } => {
                if exchange.event_too_large {
                    return;
                }
                let result = framer.feed(bytes, max_event, |raw| {
                    on_event(exchange, tokens, sse_event(raw, ts_ns, id_reported));
                });
                if result.is_err() {
                    exchange.event_too_large = true;
                    exchange.response.truncated = true;
                }
                // What the framer holds now is the tail of an event: charged to the budget, or
                // given up as lost when the budget is spent.
                let now = framer.held();
                if now > *held && !budget.take(now - *held) {
                    framer.lost();
                    budget.give_back(*held);
                    *held = 0;
                } else {
                    budget.give_back(held.saturating_sub(now));
                    *held = now;
                }
            }
            Response::Document(kept) => {
                if exchange.response.truncated {
                    return;
                }
                if kept.len() + bytes.len() <= max_body && budget.take(bytes.len()) {
                    kept.extend_from_slice(bytes);
                } else {
                    exchange.response.truncated = true;
                    budget.give_back(kept.len());
                    wipe(kept);
                }
            }
            Response::Unknown | Response::Opaque => {}
        }
    }

    /// `len` response body bytes went uncaptured.
    pub(super) fn response_lost(&mut self) {
        match &mut self.response {
            Response::Events { framer, held } => {
                framer.lost();
                self.held.give_back(*held);
                *held = 0;
                self.exchange.response.truncated = true;
            }
            Response::Document(kept) => {
                self.exchange.response.truncated = true;
                self.held.give_back(kept.len());
                wipe(kept);
            }
            Response::Unknown | Response::Opaque => {}
        }
    }

    /// A DATA frame of the response ended at `ts_ns`. Servers write one event per frame, so
    /// an event whose bytes the capture lost ends here: reported now (one lost token) instead
    /// of merged with the next.
    pub(super) fn response_frame_end(&mut self, ts_ns: u64, tokens: &mut dyn FnMut(u64)) {
        let Self {
            response,
            id_reported,
            exchange,
            ..
        } = self;
        if let Response::Events { framer, .. } = response
            && framer.is_corrupt()
        {
            framer.lost_at_boundary(|raw| {
                on_event(exchange, tokens, sse_event(raw, ts_ns, id_reported));
            });
        }
    }

    /// The response's END_STREAM at `ts_ns`: a document is whole, and so is a last JSON line
    /// without its newline.
    pub(super) fn response_end(&mut self, ts_ns: u64, tokens: &mut dyn FnMut(u64)) {
        let max_event = self.limits.max_sse_event_bytes;
        let Self {
            held: budget,
            response,
            id_reported,
            exchange,
            ..
        } = self;
        if let Response::Events { framer, held } = response {
            framer.end(max_event, |raw| {
                on_event(exchange, tokens, sse_event(raw, ts_ns, id_reported));
            });
            budget.give_back(*held);
            *held = 0;
            return;
        }
        let Response::Document(kept) = &mut self.response else {
            return;
        };
        let response = &mut self.exchange.response;
        response.ts_ns = ts_ns;
        if !response.truncated && !kept.is_empty() {
            match parse_completion(kept) {
                Some(f) => {
                    response.id =
                        f.id.map(|id| truncated_str(&id, http::MAX_NAME_BYTES).to_owned());
                    response.content = f.content;
                    response.usage = f.usage;
                    response.timings = f.timings;
                }
                None => response.json_error = true,
            }
        }
        self.held.give_back(kept.len());
        wipe(kept);
    }

    pub(super) fn finish(mut self) -> Exchange {
        std::mem::take(&mut self.exchange)
    }
}

impl Drop for PlainBodies {
    fn drop(&mut self) {
        let response = match &self.response {
            Response::Events { held, .. } => *held,
            Response::Document(kept) => kept.len(),
            Response::Unknown | Response::Opaque => 0,
        };
        self.held.give_back(self.request.len() + response);
        wipe(&mut self.request);
        if let Response::Document(kept) = &mut self.response {
            wipe(kept);
        }
    }
}

/// One event of a token stream: content (or bytes the capture lost, which nearly always
/// carried tokens, as on HTTP/1) is a token; ids, usage and timings are kept.
fn on_event(exchange: &mut Exchange, tokens: &mut dyn FnMut(u64), event: SseEvent) {
    if event.content || event.lost {
        tokens(event.ts_ns);
    }
    let response = &mut exchange.response;
    response.content |= event.content;
    response.truncated |= event.lost;
    if event.lost {
        exchange.events_cut = exchange.events_cut.saturating_add(1);
    } else if event.json_error {
        exchange.events_unparsed = exchange.events_unparsed.saturating_add(1);
    }
    if response.id.is_none() {
        response.id = event.id;
    }
    if event.usage.is_some() {
        response.usage = event.usage;
    }
    if event.timings.is_some() {
        response.timings = event.timings;
    }
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")
}
