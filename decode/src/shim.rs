//! Length-delimited protobuf framing (a varint length, then a `KernelBatch`) for bytes that come
//! from another process: bounded message size, no panics, every failure typed.
use inferscope_proto::v1::shim::KernelBatch;
use prost::Message;

/// Largest accepted message. The shim batches at most 512 kernels (~100 bytes each encoded, plus
/// names), so 4 MiB leaves ample room while bounding what a bad peer can make us buffer.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("message length prefix is not a valid varint")]
    BadLength,
    #[error("message of {0} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")]
    TooLarge(u64),
    #[error("message does not decode as a KernelBatch")]
    Decode,
}

/// Accumulates stream bytes and yields whole messages.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    pos: usize,
}

enum Varint {
    Incomplete,
    Bad,
    Value(u64, usize),
}

fn varint(bytes: &[u8]) -> Varint {
    let mut v: u64 = 0;
    for (i, b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Varint::Value(v, i + 1);
        }
    }
    if bytes.len() >= 10 {
        Varint::Bad
    } else {
        Varint::Incomplete
    }
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        // Compact before growing so the buffer never holds more than one partial message plus
        // what was just read.
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Gives back the buffer's memory once it holds nothing, so an idle connection costs no
    /// more than its last message needed.
    pub fn release(&mut self) {
        if self.pos == self.buf.len() {
            self.buf = Vec::new();
            self.pos = 0;
        }
    }

    /// Bytes held for an incomplete message.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next whole message; `Ok(None)` when more bytes are needed. After `BadLength` or
    /// `TooLarge` the stream cannot be resynchronised and the caller should close it; after
    /// `Decode` the bad message has been skipped and decoding can continue.
    pub fn next_batch(&mut self) -> Result<Option<KernelBatch>, FrameError> {
        let rest = &self.buf[self.pos..];
        let (len, used) = match varint(rest) {
            Varint::Incomplete => return Ok(None),
            Varint::Bad => return Err(FrameError::BadLength),
            Varint::Value(len, used) => (len, used),
        };
        if len > MAX_MESSAGE_BYTES as u64 {
            return Err(FrameError::TooLarge(len));
        }
        let len = len as usize;
        if rest.len() < used + len {
            return Ok(None);
        }
        let body = &rest[used..used + len];
        let result = KernelBatch::decode(body).map_err(|_| FrameError::Decode);
        self.pos += used + len;
        result.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use inferscope_proto::v1::shim::Kernel;

    use super::*;

    fn batch(n: usize) -> KernelBatch {
        KernelBatch {
            kernels: (0..n)
                .map(|i| Kernel {
                    name: format!("k{i}"),
                    correlation_id: i as u32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn splits_across_reads() {
        let mut bytes = batch(3).encode_length_delimited_to_vec();
        bytes.extend(batch(2).encode_length_delimited_to_vec());
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for chunk in bytes.chunks(7) {
            d.push(chunk);
            while let Some(b) = d.next_batch().unwrap() {
                got.push(b.kernels.len());
            }
        }
        assert_eq!(got, vec![3, 2]);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn rejects_oversize_and_bad_varints() {
        let mut d = FrameDecoder::new();
        d.push(&[0xff, 0xff, 0xff, 0x7f]);
        assert!(matches!(d.next_batch(), Err(FrameError::TooLarge(_))));
        let mut d = FrameDecoder::new();
        d.push(&[0xff; 11]);
        assert_eq!(d.next_batch(), Err(FrameError::BadLength));
    }

    #[test]
    fn skips_undecodable_message() {
        let mut d = FrameDecoder::new();
        d.push(&[3, 0xff, 0xff, 0xff]);
        d.push(&batch(1).encode_length_delimited_to_vec());
        assert_eq!(d.next_batch(), Err(FrameError::Decode));
        assert_eq!(d.next_batch().unwrap().unwrap().kernels.len(), 1);
    }
}
