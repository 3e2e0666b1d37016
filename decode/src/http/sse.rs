//! Server-sent-events framing: splits a body into events at blank lines and
//! extracts the joined `data:` field, buffering only an event that spans
//! several writes.

use super::{ParseError, wipe};

/// One dispatched event's data field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawEvent<'a> {
    /// The event's data (data lines joined with '\n').
    Data(&'a [u8]),
    /// Bytes of this event were lost; its data is unknown.
    Corrupt,
}

/// Incremental SSE splitter; one per response.
#[derive(Debug, Default)]
pub(crate) struct SseFramer {
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

impl SseFramer {
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
        while let Some(i) = data.get(pos..).and_then(|rest| memchr::memchr(b'\n', rest)) {
            let nl = pos + i;
            let line = data.get(pos..nl).unwrap_or_default();
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
        let mut f = SseFramer::default();
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
        let mut f = SseFramer::default();
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
}
