//! Bounded accumulation of a request/response head across syscalls.

use super::{ParseError, wipe};

/// Below this many buffered bytes every feed is parsed, so garbage is
/// rejected on the first syscall; past it, parsing waits for a newline so
/// byte-at-a-time input stays linear per line.
const EAGER_PARSE_BYTES: usize = 16;

/// Outcome of feeding bytes to a [`HeadBuf`].
#[derive(Debug)]
pub(crate) enum HeadProgress<T> {
    /// All of the offered bytes were taken; the head is not complete yet.
    NeedMore,
    /// The head completed after taking `consumed` of the offered bytes.
    Done {
        consumed: usize,
        head_len: usize,
        value: T,
    },
}

/// Result of one parse attempt: `Ok(None)` means "partial".
pub(crate) type ParseResult<T> = Result<Option<(usize, T)>, ParseError>;

/// Collects head bytes until `parse` succeeds, failing past `max` bytes.
#[derive(Debug, Default)]
pub(crate) struct HeadBuf {
    buf: Vec<u8>,
}

impl HeadBuf {
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        wipe(&mut self.buf);
    }

    /// Offers `data` (non-empty); `parse` is given the whole buffered head.
    pub(crate) fn push<T>(
        &mut self,
        data: &[u8],
        max: usize,
        parse: impl Fn(&[u8]) -> ParseResult<T>,
    ) -> Result<HeadProgress<T>, ParseError> {
        let old = self.buf.len();
        let take = data.len().min(max.saturating_sub(old));
        let appended = data.get(..take).unwrap_or_default();
        self.buf.extend_from_slice(appended);
        let full = self.buf.len() >= max;
        let worth_parsing =
            old < EAGER_PARSE_BYTES || full || memchr::memchr(b'\n', appended).is_some();
        if worth_parsing {
            match parse(&self.buf) {
                Ok(Some((head_len, value))) => {
                    // The terminating '\n' is always in `appended` (a newline
                    // forces a parse), so head_len > old.
                    let consumed = head_len.saturating_sub(old).min(take);
                    self.clear();
                    return Ok(HeadProgress::Done {
                        consumed,
                        head_len,
                        value,
                    });
                }
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
        if full {
            return Err(ParseError::HeadTooLarge);
        }
        Ok(HeadProgress::NeedMore)
    }
}

/// The CRs and LFs that `data` starts with: stray line ends between keep-alive messages, which
/// are not the start of one.
pub(crate) fn blank_lines(data: &[u8]) -> usize {
    data.iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count()
}

/// Maps httparse errors: too many headers is a size problem, the rest mean
/// the stream is not HTTP.
pub(crate) fn map_httparse_err(e: httparse::Error) -> ParseError {
    match e {
        httparse::Error::TooManyHeaders => ParseError::HeadTooLarge,
        _ => ParseError::NotHttp,
    }
}

/// Header slots handed to httparse; more headers than this is `HeadTooLarge`.
pub(crate) const MAX_HEADERS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_blank_line(buf: &[u8]) -> ParseResult<()> {
        if buf.first() == Some(&b'!') {
            return Err(ParseError::NotHttp);
        }
        Ok(memchr::memmem::find(buf, b"\n\n").map(|i| (i + 2, ())))
    }

    #[test]
    fn completes_across_pushes_and_reports_consumed() {
        let mut h = HeadBuf::default();
        assert!(matches!(
            h.push(b"abc\n", 100, parse_blank_line),
            Ok(HeadProgress::NeedMore)
        ));
        match h.push(b"\nrest", 100, parse_blank_line) {
            Ok(HeadProgress::Done {
                consumed, head_len, ..
            }) => {
                assert_eq!((consumed, head_len), (1, 5));
            }
            other => panic!("{other:?}"),
        }
        assert!(h.is_empty());
    }

    #[test]
    fn too_large_and_garbage() {
        let mut h = HeadBuf::default();
        assert_eq!(
            h.push(&[b'a'; 200], 100, parse_blank_line).err(),
            Some(ParseError::HeadTooLarge)
        );
        let mut h = HeadBuf::default();
        assert_eq!(
            h.push(b"!x", 100, parse_blank_line).err(),
            Some(ParseError::NotHttp)
        );
        let mut h = HeadBuf::default();
        assert_eq!(
            h.push(b"x", 0, parse_blank_line).err(),
            Some(ParseError::HeadTooLarge)
        );
    }
}
