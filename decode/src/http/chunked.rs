//! Streaming `Transfer-Encoding: chunked` de-framing that tolerates any split
//! of the input and skips lost bytes inside chunk data.

use std::ops::Range;

use super::ParseError;

/// Longest chunk-size line (size plus extensions) accepted.
const MAX_SIZE_LINE: usize = 4096;
/// More hex digits than this cannot be a sane chunk size (2^60 bytes).
const MAX_SIZE_DIGITS: u32 = 15;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading a chunk-size line.
    Size {
        size: u64,
        digits: u32,
        after_digits: bool,
        in_ext: bool,
        line_len: usize,
    },
    /// Inside chunk data.
    Data { remaining: u64 },
    /// Expecting the CRLF that ends chunk data.
    DataEnd { seen_cr: bool },
    /// After the last (zero-size) chunk: trailer lines until a blank line.
    Trailer { line_nonempty: bool, total: usize },
    /// The message is complete.
    Done,
}

const SIZE_START: State = State::Size {
    size: 0,
    digits: 0,
    after_digits: false,
    in_ext: false,
    line_len: 0,
};

/// What one call to [`ChunkedDecoder::advance`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Advance {
    /// Input bytes used.
    pub consumed: usize,
    /// Payload (chunk data) within the input, possibly empty.
    pub payload: Range<usize>,
    /// The terminating chunk and trailers are complete.
    pub done: bool,
}

/// De-frames a chunked body; one instance per message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkedDecoder {
    state: State,
    max_trailer: usize,
}

impl ChunkedDecoder {
    pub(crate) fn new(max_trailer: usize) -> Self {
        Self {
            state: SIZE_START,
            max_trailer,
        }
    }

    /// At the start of a chunk-size line: the next byte begins a chunk.
    pub(crate) fn at_chunk_start(&self) -> bool {
        self.state == SIZE_START
    }

    /// Consumes framing from `data` until it yields payload, completes, or
    /// runs out of input. Never consumes past the end of the message.
    pub(crate) fn advance(&mut self, data: &[u8]) -> Result<Advance, ParseError> {
        let mut pos = 0;
        while pos < data.len() {
            match &mut self.state {
                State::Data { remaining } => {
                    let avail = data.len() - pos;
                    let take = usize::try_from(*remaining).map_or(avail, |r| r.min(avail));
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        self.state = State::DataEnd { seen_cr: false };
                    }
                    return Ok(Advance {
                        consumed: pos + take,
                        payload: pos..pos + take,
                        done: false,
                    });
                }
                State::Done => break,
                _ => {}
            }
            let b = data.get(pos).copied().unwrap_or_default();
            pos += 1;
            self.framing_byte(b)?;
            if self.state == State::Done {
                return Ok(Advance {
                    consumed: pos,
                    payload: pos..pos,
                    done: true,
                });
            }
        }
        Ok(Advance {
            consumed: pos,
            payload: pos..pos,
            done: false,
        })
    }

    /// Accounts for `lost` uncaptured bytes, which must all be chunk data.
    /// Returns whether the loss ran exactly to the end of the chunk's data
    /// (a likely message-level boundary). Fails when the loss reaches past
    /// the current chunk's data, since the next chunk-size line would then
    /// be unknown.
    pub(crate) fn skip_lost(&mut self, lost: u64) -> Result<bool, ParseError> {
        if lost == 0 {
            return Ok(false);
        }
        match &mut self.state {
            State::Data { remaining } if lost <= *remaining => {
                *remaining -= lost;
                let at_end = *remaining == 0;
                if at_end {
                    self.state = State::DataEnd { seen_cr: false };
                }
                Ok(at_end)
            }
            // The loss also covered the CRLF after the data (a capture cut at the end of a
            // one-chunk write): the framing is still known; a wrong guess fails at the next size
            // line, which the caller treats as lost framing.
            State::Data { remaining } if lost <= *remaining + 2 => {
                let past = lost - *remaining;
                self.state = if past == 2 {
                    SIZE_START
                } else {
                    State::DataEnd { seen_cr: true }
                };
                Ok(true)
            }
            State::DataEnd { seen_cr } if lost <= 2 - u64::from(*seen_cr) => {
                let seen = u64::from(*seen_cr) + lost;
                self.state = if seen == 2 {
                    SIZE_START
                } else {
                    State::DataEnd { seen_cr: true }
                };
                Ok(false)
            }
            _ => Err(ParseError::FramingLost),
        }
    }

    fn framing_byte(&mut self, b: u8) -> Result<(), ParseError> {
        match &mut self.state {
            State::Size {
                size,
                digits,
                after_digits,
                in_ext,
                line_len,
            } => {
                *line_len += 1;
                if *line_len > MAX_SIZE_LINE {
                    return Err(ParseError::BadChunkSize);
                }
                match b {
                    b'\n' => {
                        if *digits == 0 {
                            return Err(ParseError::BadChunkSize);
                        }
                        self.state = if *size == 0 {
                            State::Trailer {
                                line_nonempty: false,
                                total: 0,
                            }
                        } else {
                            State::Data { remaining: *size }
                        };
                    }
                    _ if *in_ext => {}
                    b'\r' => {}
                    b';' if *digits > 0 => *in_ext = true,
                    b' ' | b'\t' if *digits > 0 => *after_digits = true,
                    _ => {
                        let d = match b {
                            b'0'..=b'9' => b - b'0',
                            b'a'..=b'f' => b - b'a' + 10,
                            b'A'..=b'F' => b - b'A' + 10,
                            _ => return Err(ParseError::BadChunkSize),
                        };
                        if *after_digits || *digits >= MAX_SIZE_DIGITS {
                            return Err(ParseError::BadChunkSize);
                        }
                        *size = (*size << 4) | u64::from(d);
                        *digits += 1;
                    }
                }
            }
            State::DataEnd { seen_cr } => match b {
                b'\r' if !*seen_cr => *seen_cr = true,
                b'\n' => self.state = SIZE_START,
                _ => return Err(ParseError::BadChunkSize),
            },
            State::Trailer {
                line_nonempty,
                total,
            } => {
                *total += 1;
                if *total > self.max_trailer {
                    return Err(ParseError::HeadTooLarge);
                }
                match b {
                    b'\n' if !*line_nonempty => self.state = State::Done,
                    b'\n' => *line_nonempty = false,
                    b'\r' => {}
                    _ => *line_nonempty = true,
                }
            }
            State::Data { .. } | State::Done => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the decoder over `parts`; returns (payload, done, leftover of the
    /// part where it finished).
    fn run(parts: &[&[u8]]) -> Result<(Vec<u8>, bool, Vec<u8>), ParseError> {
        let mut d = ChunkedDecoder::new(1024);
        let mut payload = Vec::new();
        for part in parts {
            let mut rest: &[u8] = part;
            while !rest.is_empty() {
                let adv = d.advance(rest)?;
                payload.extend_from_slice(&rest[adv.payload.clone()]);
                rest = &rest[adv.consumed..];
                if adv.done {
                    return Ok((payload, true, rest.to_vec()));
                }
            }
        }
        Ok((payload, false, Vec::new()))
    }

    const BODY: &[u8] = b"5;ext=1\r\nhello\r\nA \r\n0123456789\r\n0\r\nX-Trailer: yes\r\n\r\nNEXT";

    #[test]
    fn whole_and_byte_at_a_time_agree() {
        let whole = run(&[BODY]).unwrap();
        assert_eq!(whole, (b"hello0123456789".to_vec(), true, b"NEXT".to_vec()));
        let bytes: Vec<&[u8]> = BODY.chunks(1).collect();
        let (p, done, _) = run(&bytes).unwrap();
        assert_eq!((p, done), (b"hello0123456789".to_vec(), true));
    }

    #[test]
    fn bad_sizes() {
        assert_eq!(run(&[b"zz\r\n"]), Err(ParseError::BadChunkSize));
        assert_eq!(run(&[b"\r\n"]), Err(ParseError::BadChunkSize));
        assert_eq!(run(&[b"1 2\r\n"]), Err(ParseError::BadChunkSize));
        assert_eq!(
            run(&[b"ffffffffffffffff\r\n"]),
            Err(ParseError::BadChunkSize)
        );
        assert_eq!(run(&[b"1\r\nxy"]), Err(ParseError::BadChunkSize));
    }

    #[test]
    fn lost_inside_data_is_skipped_but_not_across_framing() {
        let mut d = ChunkedDecoder::new(1024);
        let adv = d.advance(b"a\r\n01").unwrap();
        assert_eq!(adv.payload, 3..5);
        assert_eq!(d.skip_lost(7), Ok(false));
        assert_eq!(d.skip_lost(1), Ok(true));
        assert!(d.advance(b"\r\n0\r\n\r\n").unwrap().done);

        let mut d = ChunkedDecoder::new(1024);
        d.advance(b"a\r\n01").unwrap();
        assert_eq!(d.skip_lost(11), Err(ParseError::FramingLost));
        // A loss that also covers the data's CRLF keeps the framing.
        let mut d = ChunkedDecoder::new(1024);
        d.advance(b"a\r\n01").unwrap();
        assert_eq!(d.skip_lost(10), Ok(true));
        assert!(d.advance(b"0\r\n\r\n").unwrap().done);
        let mut d = ChunkedDecoder::new(1024);
        assert_eq!(d.skip_lost(1), Err(ParseError::FramingLost));
    }

    #[test]
    fn trailer_limit() {
        let mut d = ChunkedDecoder::new(4);
        assert_eq!(
            d.advance(b"0\r\nLong: trailer\r\n\r\n"),
            Err(ParseError::HeadTooLarge)
        );
    }
}
