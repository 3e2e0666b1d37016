//! Token-stream framing: server-sent events (split at blank lines, the joined `data:` field)
//! or newline-delimited JSON (one document per line, as Ollama and other NDJSON servers stream),
//! buffering only an event that spans several writes.

use super::{ParseError, contains_ignore_case, wipe};

/// How a streamed body delimits its events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum EventFormat {
    /// `text/event-stream`.
    #[default]
    Sse,
    /// One JSON document per line: `application/x-ndjson`, `application/jsonl` and kin.
    Lines,
}

impl EventFormat {
    /// The format a `Content-Type` value names, if it names a token stream.
    pub(crate) fn of_content_type(value: &[u8]) -> Option<Self> {
        if contains_ignore_case(value, b"text/event-stream") {
            Some(Self::Sse)
        } else if [
            &b"ndjson"[..],
            b"jsonl",
            b"json-lines",
            b"jsonlines",
            b"json-seq",
        ]
        .iter()
        .any(|kind| contains_ignore_case(value, kind))
        {
            Some(Self::Lines)
        } else {
            None
        }
    }
}

/// One dispatched event's data field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawEvent<'a> {
    /// The event's data (data lines joined with '\n').
    Data(&'a [u8]),
    /// Bytes of this event were lost; its data is unknown.
    Corrupt,
}

/// Incremental event splitter; one per response.
#[derive(Debug, Default)]
pub(crate) struct EventFramer {
    format: EventFormat,
    /// Bytes of the current event that arrived in earlier writes.
    pending: Vec<u8>,
    /// Scratch for joining multiple data lines.
    joined: Vec<u8>,
    /// The current line has a byte other than '\r' (so a '\n' ends a line,
    /// not the event).
    line_nonempty: bool,
    /// Bytes of the current event were lost; drop it until its blank line.
    corrupt: bool,
}

impl EventFramer {
    pub(crate) fn new(format: EventFormat) -> Self {
        Self {
            format,
            ..Self::default()
        }
    }

    /// Starts a body of `format`, forgetting any partial event.
    pub(crate) fn start(&mut self, format: EventFormat) {
        self.clear();
        self.format = format;
    }

    /// Bytes of an unfinished event held.
    pub(crate) fn held(&self) -> usize {
        self.pending.len()
    }

    /// Forgets any partial event (wiping its bytes).
    pub(crate) fn clear(&mut self) {
        wipe(&mut self.pending);
        wipe(&mut self.joined);
        self.line_nonempty = false;
        self.corrupt = false;
    }

    /// Between events: nothing of a next one seen yet.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && !self.line_nonempty && !self.corrupt
    }

    /// The body ended: a JSON line without its newline is still a whole document (an SSE
    /// event without its blank line is not dispatched, per the spec). Starts clean.
    pub(crate) fn end(&mut self, max_event: usize, mut emit: impl FnMut(RawEvent<'_>)) {
        if self.format == EventFormat::Lines && !self.is_idle() {
            // An overlong line was counted by `feed`; nothing more to report here.
            let _ = self.end_line(&[], max_event, &mut emit);
        }
        self.clear();
    }

    /// Bytes of the current event were lost and not yet reported.
    pub(crate) fn is_corrupt(&self) -> bool {
        self.corrupt
    }

    /// Marks the current event as damaged by lost bytes.
    pub(crate) fn lost(&mut self) {
        wipe(&mut self.pending);
        self.corrupt = true;
        // The lost bytes most likely continued a line; do not let the next
        // '\n' be mistaken for the blank line that ends an event.
        self.line_nonempty = true;
    }

    /// Bytes were lost up to what is probably an event boundary (the end of
    /// an HTTP chunk, which servers align with events): reports the damaged
    /// event now and starts clean, instead of merging it with the next one.
    pub(crate) fn lost_at_boundary(&mut self, mut emit: impl FnMut(RawEvent<'_>)) {
        self.clear();
        emit(RawEvent::Corrupt);
    }

    /// Feeds body payload; calls `emit` for each complete event that has a
    /// data field (or is corrupt). Events entirely inside `data` are not
    /// copied.
    pub(crate) fn feed(
        &mut self,
        data: &[u8],
        max_event: usize,
        mut emit: impl FnMut(RawEvent<'_>),
    ) -> Result<(), ParseError> {
        let mut pos = 0;
        // Start of the current event's bytes not yet copied into `pending`.
        let mut ev_start = 0;
        let lines = self.format == EventFormat::Lines;
        while let Some(i) = data.get(pos..).and_then(|rest| memchr::memchr(b'\n', rest)) {
            let nl = pos + i;
            let line = data.get(pos..nl).unwrap_or_default();
            if lines {
                let rest = data.get(ev_start..nl).unwrap_or_default();
                self.end_line(rest, max_event, &mut emit)?;
                ev_start = nl + 1;
                pos = nl + 1;
                continue;
            }
            let blank = !self.line_nonempty && line.iter().all(|&b| b == b'\r');
            self.line_nonempty = false;
            let ev_len = self.pending.len() + (nl + 1 - ev_start);
            if !self.corrupt && ev_len > max_event {
                self.clear();
                return Err(ParseError::SseEventTooLarge);
            }
            if blank {
                let body = data.get(ev_start..pos).unwrap_or_default();
                if self.corrupt {
                    self.corrupt = false;
                    emit(RawEvent::Corrupt);
                } else if self.pending.is_empty() {
                    if let Some(d) = extract_data(body, &mut self.joined) {
                        emit(RawEvent::Data(d));
                    }
                } else {
                    self.pending.extend_from_slice(body);
                    if let Some(d) = extract_data(&self.pending, &mut self.joined) {
                        emit(RawEvent::Data(d));
                    }
                }
                wipe(&mut self.pending);
                if !self.joined.is_empty() {
                    wipe(&mut self.joined);
                }
                ev_start = nl + 1;
            }
            pos = nl + 1;
        }
        let tail = data.get(pos..).unwrap_or_default();
        if tail.iter().any(|&b| b != b'\r') {
            self.line_nonempty = true;
        }
        if !self.corrupt {
            let rest = data.get(ev_start..).unwrap_or_default();
            if self.pending.len() + rest.len() > max_event {
                self.clear();
                return Err(ParseError::SseEventTooLarge);
            }
            self.pending.extend_from_slice(rest);
        }
        Ok(())
    }
}

impl EventFramer {
    /// A newline ended the line whose bytes are `pending` then `rest` (a JSON-lines body): one
    /// event, unless the line is blank.
    fn end_line(
        &mut self,
        rest: &[u8],
        max_event: usize,
        emit: &mut impl FnMut(RawEvent<'_>),
    ) -> Result<(), ParseError> {
        self.line_nonempty = false;
        if self.corrupt {
            self.corrupt = false;
            wipe(&mut self.pending);
            emit(RawEvent::Corrupt);
            return Ok(());
        }
        if self.pending.len() + rest.len() > max_event {
            self.clear();
            return Err(ParseError::SseEventTooLarge);
        }
        let line = if self.pending.is_empty() {
            rest
        } else {
            self.pending.extend_from_slice(rest);
            &self.pending
        };
        let line = line.trim_ascii();
        if !line.is_empty() {
            emit(RawEvent::Data(line));
        }
        wipe(&mut self.pending);
        Ok(())
    }
}

/// The event's data field per the SSE spec: `data` lines (one optional space
/// after the colon), joined with '\n'. `None` if the event has no data line.
fn extract_data<'a>(event: &'a [u8], joined: &'a mut Vec<u8>) -> Option<&'a [u8]> {
    // The common shape, one `data: {...}` line, without a per-byte split.
    let single = event.strip_suffix(b"\n").unwrap_or(event);
    if memchr::memchr(b'\n', single).is_none() {
        let line = single.strip_suffix(b"\r").unwrap_or(single);
        return if line == b"data" {
            Some(&b""[..])
        } else {
            line.strip_prefix(b"data:")
                .map(|v| v.strip_prefix(b" ").unwrap_or(v))
        };
    }
    let mut first: Option<&'a [u8]> = None;
    let mut many = false;
    for raw in event.split(|&b| b == b'\n') {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let value = if line == b"data" {
            &b""[..]
        } else if let Some(v) = line.strip_prefix(b"data:") {
            v.strip_prefix(b" ").unwrap_or(v)
        } else {
            continue;
        };
        match first {
            None => first = Some(value),
            Some(f) => {
                if !many {
                    many = true;
                    joined.clear();
                    joined.extend_from_slice(f);
                }
                joined.push(b'\n');
                joined.extend_from_slice(value);
            }
        }
    }
    if many { Some(joined.as_slice()) } else { first }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(parts: &[&[u8]], max: usize) -> (Vec<Option<Vec<u8>>>, Result<(), ParseError>) {
        let mut f = EventFramer::default();
        let mut out = Vec::new();
        for p in parts {
            let r = f.feed(p, max, |e| {
                out.push(match e {
                    RawEvent::Data(d) => Some(d.to_vec()),
                    RawEvent::Corrupt => None,
                })
            });
            if r.is_err() {
                return (out, r);
            }
        }
        (out, Ok(()))
    }

    const STREAM: &[u8] =
        b": comment\n\ndata: one\n\nevent: x\r\ndata:two\r\ndata: 2b\r\n\r\nid: 5\n\ndata\n\n";

    #[test]
    fn splits_events_any_way() {
        let expect = vec![
            Some(b"one".to_vec()),
            Some(b"two\n2b".to_vec()),
            Some(b"".to_vec()),
        ];
        assert_eq!(collect(&[STREAM], 1024), (expect.clone(), Ok(())));
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(collect(&bytes, 1024), (expect.clone(), Ok(())));
        let threes: Vec<&[u8]> = STREAM.chunks(3).collect();
        assert_eq!(collect(&threes, 1024), (expect, Ok(())));
    }

    #[test]
    fn too_large_event() {
        let big = [b'x'; 100];
        let (out, r) = collect(&[b"data: ok\n\ndata: ", &big, b"\n\n"], 50);
        assert_eq!(out, vec![Some(b"ok".to_vec())]);
        assert_eq!(r, Err(ParseError::SseEventTooLarge));
        let mut whole = b"data: ".to_vec();
        whole.extend_from_slice(&big);
        whole.extend_from_slice(b"\n\n");
        assert_eq!(collect(&[&whole], 50).1, Err(ParseError::SseEventTooLarge));
    }

    #[test]
    fn lost_bytes_corrupt_one_event() {
        let mut f = EventFramer::default();
        let mut out = Vec::new();
        f.feed(b"data: {\"a\"", 100, |e| out.push(format!("{e:?}")))
            .unwrap();
        f.lost();
        f.feed(b"\n\ndata: b\n\n", 100, |e| out.push(format!("{e:?}")))
            .unwrap();
        assert_eq!(out, vec!["Corrupt".to_string(), "Data([98])".to_string()]);
        f.feed(b"data: c", 100, |_| {}).unwrap();
        f.lost_at_boundary(|e| out.push(format!("{e:?}")));
        f.feed(b"data: d\n\n", 100, |e| out.push(format!("{e:?}")))
            .unwrap();
        assert_eq!(out[2..], ["Corrupt".to_string(), "Data([100])".to_string()]);
    }

    #[test]
    fn json_lines_are_one_event_each_however_split() {
        const BODY: &[u8] = b"{\"response\":\"a\"}\n\n{\"response\":\"b\"}\r\n{\"done\":true}\n";
        let expect: Vec<Option<Vec<u8>>> = vec![
            Some(br#"{"response":"a"}"#.to_vec()),
            Some(br#"{"response":"b"}"#.to_vec()),
            Some(br#"{"done":true}"#.to_vec()),
        ];
        for size in [1, 2, 5, BODY.len()] {
            let mut f = EventFramer::new(EventFormat::Lines);
            let mut out = Vec::new();
            for part in BODY.chunks(size) {
                f.feed(part, 1024, |e| {
                    out.push(match e {
                        RawEvent::Data(d) => Some(d.to_vec()),
                        RawEvent::Corrupt => None,
                    })
                })
                .unwrap();
            }
            assert_eq!(out, expect, "split every {size} bytes");
            assert!(f.is_idle());
        }
    }

    #[test]
    fn a_json_line_with_lost_bytes_is_one_corrupt_event() {
        let mut f = EventFramer::new(EventFormat::Lines);
        let mut out = Vec::new();
        f.feed(b"{\"response\":", 100, |e| out.push(format!("{e:?}")))
            .unwrap();
        f.lost();
        f.feed(b"\"x\"}\n{}\n", 100, |e| out.push(format!("{e:?}")))
            .unwrap();
        assert_eq!(out, ["Corrupt".to_string(), "Data([123, 125])".to_string()]);
        let too_long = [b'x'; 60];
        assert_eq!(
            f.feed(&too_long, 50, |_| {}),
            Err(ParseError::SseEventTooLarge)
        );
    }

    #[test]
    fn content_types_name_their_format() {
        let of = EventFormat::of_content_type;
        assert_eq!(
            of(b"text/event-stream; charset=utf-8"),
            Some(EventFormat::Sse)
        );
        assert_eq!(of(b"application/x-ndjson"), Some(EventFormat::Lines));
        assert_eq!(of(b"application/jsonl"), Some(EventFormat::Lines));
        assert_eq!(of(b"application/json"), None);
        assert_eq!(of(b"application/grpc"), None);
    }
}
