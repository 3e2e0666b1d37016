//! How an HTTP/1.1 message's body is delimited, the same for requests and responses: the head
//! fields that say so, and the body's progress through them (also across lost bytes).
use super::{
    ParseError,
    chunked::{Advance, ChunkedDecoder},
    contains_ignore_case, parse_content_length,
};

/// The head fields a body is framed and read by.
#[derive(Debug)]
pub(super) struct BodyHeaders {
    pub content_length: Option<u64>,
    /// `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// The body is JSON (no Content-Type says otherwise).
    pub json_body: bool,
}

impl Default for BodyHeaders {
    fn default() -> Self {
        BodyHeaders {
            content_length: None,
            chunked: false,
            json_body: true,
        }
    }
}

impl BodyHeaders {
    /// Takes one header; other names are left alone. Two Content-Lengths that disagree (or one
    /// that is not a number) are a stream that is not HTTP.
    pub(super) fn read(&mut self, name: &[u8], value: &[u8]) -> Result<(), ParseError> {
        if name.eq_ignore_ascii_case(b"content-length") {
            let len = parse_content_length(value).ok_or(ParseError::NotHttp)?;
            if self.content_length.is_some_and(|prev| prev != len) {
                return Err(ParseError::NotHttp);
            }
            self.content_length = Some(len);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.chunked |= contains_ignore_case(value, b"chunked");
        } else if name.eq_ignore_ascii_case(b"content-type") {
            self.json_body = contains_ignore_case(value, b"json");
        }
        Ok(())
    }

    /// The body's framing: chunked before any Content-Length; with neither, an empty body
    /// (`until_close` false: requests, RFC 9112 §6.3) or one the connection's close ends.
    pub(super) fn framing(&self, max_line: usize, until_close: bool) -> Framing {
        if self.chunked {
            Framing::Chunked(ChunkedDecoder::new(max_line))
        } else {
            match self.content_length {
                Some(n) => Framing::Length { remaining: n },
                None if until_close => Framing::UntilClose,
                None => Framing::Length { remaining: 0 },
            }
        }
    }
}

#[derive(Debug)]
pub(super) enum Framing {
    Length {
        remaining: u64,
    },
    Chunked(ChunkedDecoder),
    /// Responses only: no length, so the body runs to the connection's close.
    UntilClose,
}

/// Lost bytes accounted for inside a body.
pub(super) struct Skipped {
    pub bytes: u64,
    /// The body ended.
    pub done: bool,
    /// The loss ended exactly at a chunk's end (so the next byte starts a chunk-size line).
    pub at_chunk_end: bool,
}

impl Framing {
    /// A body known to be empty.
    pub(super) fn is_empty(&self) -> bool {
        matches!(self, Framing::Length { remaining: 0 })
    }

    /// Takes a prefix of `data` (captured body bytes): the wire bytes used, the payload among
    /// them, and whether the body ended.
    pub(super) fn advance(&mut self, data: &[u8]) -> Result<Advance, ParseError> {
        Ok(match self {
            Framing::Length { remaining } => {
                let take = usize::try_from(*remaining).map_or(data.len(), |r| r.min(data.len()));
                *remaining -= take as u64;
                Advance {
                    consumed: take,
                    payload: 0..take,
                    done: *remaining == 0,
                }
            }
            Framing::Chunked(dec) => dec.advance(data)?,
            Framing::UntilClose => Advance {
                consumed: data.len(),
                payload: 0..data.len(),
                done: false,
            },
        })
    }

    /// Accounts for `lost` body bytes the capture dropped.
    pub(super) fn skip_lost(&mut self, lost: u64) -> Result<Skipped, ParseError> {
        Ok(match self {
            Framing::Length { remaining } => {
                let k = lost.min(*remaining);
                *remaining -= k;
                Skipped {
                    bytes: k,
                    done: *remaining == 0,
                    at_chunk_end: false,
                }
            }
            Framing::Chunked(dec) => Skipped {
                bytes: lost,
                done: false,
                at_chunk_end: dec.skip_lost(lost)?,
            },
            Framing::UntilClose => Skipped {
                bytes: lost,
                done: false,
                at_chunk_end: false,
            },
        })
    }
}
