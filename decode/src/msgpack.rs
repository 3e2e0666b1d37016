//! A small bounded MessagePack reader over a byte slice.
//!
//! Why not `rmp`: IPC payloads arrive as captured prefixes (the kernel copies a bounded prefix
//! of each syscall), so the reader must tell "the value is cut off here" apart from "these bytes
//! are not msgpack", skip values it does not care about without allocating, and bound nesting.
//! `rmp::decode` offers the marker-level primitives but leaves skipping, depth limits and the
//! truncation/corruption distinction to the caller — that is most of this file. Nothing here
//! allocates; strings and binaries are borrowed from the input.

/// Why a value could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsgpackError {
    /// The input ends inside the value (a captured prefix): the bytes so far were valid.
    #[error("msgpack value cut off by the end of the captured bytes")]
    Truncated,
    /// The byte is not a msgpack marker this reader accepts (0xc1 is never valid).
    #[error("invalid msgpack marker")]
    Invalid,
    /// Arrays/maps nested deeper than the reader allows.
    #[error("msgpack nesting too deep")]
    TooDeep,
    /// A value of another type than the layout expects.
    #[error("msgpack value of an unexpected type")]
    Type,
}

/// Nesting bound for [`Reader::skip`]: vLLM's messages nest a handful of levels.
pub const MAX_DEPTH: u32 = 32;

/// The head of one value: scalars carry their value, containers their element count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Head<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    /// Unsigned values above i64::MAX.
    UInt(u64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(u32),
    Map(u32),
    Ext(i8, &'a [u8]),
}

#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        let end = self.pos.checked_add(n).ok_or(MsgpackError::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(MsgpackError::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], MsgpackError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, MsgpackError> {
        Ok(self.be::<1>()?[0] as usize)
    }
    fn len16(&mut self) -> Result<usize, MsgpackError> {
        Ok(u16::from_be_bytes(self.be()?) as usize)
    }
    fn len32(&mut self) -> Result<usize, MsgpackError> {
        Ok(u32::from_be_bytes(self.be()?) as usize)
    }

    /// Reads one value's head; for strings, binaries and extensions the payload too. On error
    /// the position is left where the value started.
    pub fn head(&mut self) -> Result<Head<'a>, MsgpackError> {
        let start = self.pos;
        let result = self.head_inner();
        if result.is_err() {
            self.pos = start;
        }
        result
    }

    fn head_inner(&mut self) -> Result<Head<'a>, MsgpackError> {
        let marker = self.be::<1>()?[0];
        Ok(match marker {
            0x00..=0x7f => Head::Int(marker as i64),
            0x80..=0x8f => Head::Map((marker & 0x0f) as u32),
            0x90..=0x9f => Head::Array((marker & 0x0f) as u32),
            0xa0..=0xbf => Head::Str(self.take((marker & 0x1f) as usize)?),
            0xc0 => Head::Nil,
            0xc2 => Head::Bool(false),
            0xc3 => Head::Bool(true),
            0xc4 => {
                let n = self.len8()?;
                Head::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.len16()?;
                Head::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.len32()?;
                Head::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = self.len8()?;
                let t = self.be::<1>()?[0] as i8;
                Head::Ext(t, self.take(n)?)
            }
            0xc8 => {
                let n = self.len16()?;
                let t = self.be::<1>()?[0] as i8;
                Head::Ext(t, self.take(n)?)
            }
            0xc9 => {
                let n = self.len32()?;
                let t = self.be::<1>()?[0] as i8;
                Head::Ext(t, self.take(n)?)
            }
            0xca => Head::Float(f32::from_be_bytes(self.be()?) as f64),
            0xcb => Head::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Head::Int(self.be::<1>()?[0] as i64),
            0xcd => Head::Int(u16::from_be_bytes(self.be()?) as i64),
            0xce => Head::Int(u32::from_be_bytes(self.be()?) as i64),
            0xcf => {
                let v = u64::from_be_bytes(self.be()?);
                i64::try_from(v).map_or(Head::UInt(v), Head::Int)
            }
            0xd0 => Head::Int(i8::from_be_bytes(self.be()?) as i64),
            0xd1 => Head::Int(i16::from_be_bytes(self.be()?) as i64),
            0xd2 => Head::Int(i32::from_be_bytes(self.be()?) as i64),
            0xd3 => Head::Int(i64::from_be_bytes(self.be()?)),
            0xd4..=0xd8 => {
                let n = 1usize << (marker - 0xd4);
                let t = self.be::<1>()?[0] as i8;
                Head::Ext(t, self.take(n)?)
            }
            0xd9 => {
                let n = self.len8()?;
                Head::Str(self.take(n)?)
            }
            0xda => {
                let n = self.len16()?;
                Head::Str(self.take(n)?)
            }
            0xdb => {
                let n = self.len32()?;
                Head::Str(self.take(n)?)
            }
            0xdc => Head::Array(self.len16()? as u32),
            0xdd => Head::Array(self.len32()? as u32),
            0xde => Head::Map(self.len16()? as u32),
            0xdf => Head::Map(self.len32()? as u32),
            0xe0..=0xff => Head::Int((marker as i8) as i64),
            0xc1 => return Err(MsgpackError::Invalid),
        })
    }

    /// Skips one whole value (containers included), iteratively, at most [`MAX_DEPTH`] deep.
    pub fn skip(&mut self) -> Result<(), MsgpackError> {
        let start = self.pos;
        let result = self.skip_inner();
        if result.is_err() {
            self.pos = start;
        }
        result
    }

    fn skip_inner(&mut self) -> Result<(), MsgpackError> {
        // Values still to skip at each open level (u64: a map of n pairs is 2n values).
        let mut pending: [u64; MAX_DEPTH as usize] = [0; MAX_DEPTH as usize];
        let mut depth = 0usize;
        pending[0] = 1;
        loop {
            while pending[depth] == 0 {
                if depth == 0 {
                    return Ok(());
                }
                depth -= 1;
            }
            pending[depth] -= 1;
            let children = match self.head_inner()? {
                Head::Array(n) => n as u64,
                Head::Map(n) => 2 * n as u64,
                _ => 0,
            };
            if children > 0 {
                // Every child takes at least one byte: a count beyond the input is a cut-off
                // (or corrupt) container, found without walking it.
                if children > (self.buf.len() - self.pos) as u64 {
                    return Err(MsgpackError::Truncated);
                }
                depth += 1;
                if depth >= MAX_DEPTH as usize {
                    return Err(MsgpackError::TooDeep);
                }
                pending[depth] = children;
            }
        }
    }

    pub fn array_len(&mut self) -> Result<u32, MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Array(n) => Ok(n),
            _ => {
                self.pos = start;
                Err(MsgpackError::Type)
            }
        }
    }

    /// An array's length, or None for nil.
    pub fn opt_array_len(&mut self) -> Result<Option<u32>, MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Array(n) => Ok(Some(n)),
            Head::Nil => Ok(None),
            _ => {
                self.pos = start;
                Err(MsgpackError::Type)
            }
        }
    }

    pub fn map_len(&mut self) -> Result<u32, MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Map(n) => Ok(n),
            _ => {
                self.pos = start;
                Err(MsgpackError::Type)
            }
        }
    }

    pub fn str(&mut self) -> Result<&'a [u8], MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Str(s) => Ok(s),
            _ => {
                self.pos = start;
                Err(MsgpackError::Type)
            }
        }
    }

    pub fn int(&mut self) -> Result<i64, MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Int(v) => Ok(v),
            _ => {
                self.pos = start;
                Err(MsgpackError::Type)
            }
        }
    }

    /// A float; integers are accepted too (msgspec writes `0.0` as a float, but a peer may not).
    pub fn float(&mut self) -> Result<f64, MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Float(v) => Ok(v),
            Head::Int(v) => Ok(v as f64),
            _ => {
                self.pos = start;
                Err(MsgpackError::Type)
            }
        }
    }

    /// Whether the next value is nil (consumed if so).
    pub fn nil(&mut self) -> Result<bool, MsgpackError> {
        let start = self.pos;
        match self.head()? {
            Head::Nil => Ok(true),
            _ => {
                self.pos = start;
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_scalars_and_containers() {
        // [1, -1, "ab", nil, true, 1.5, {"k": 300}, 2**63]
        let bytes = [
            0x98, 0x01, 0xff, 0xa2, b'a', b'b', 0xc0, 0xc3, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,
            0x81, 0xa1, b'k', 0xcd, 0x01, 0x2c, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0,
        ];
        let mut r = Reader::new(&bytes);
        assert_eq!(r.array_len(), Ok(8));
        assert_eq!(r.int(), Ok(1));
        assert_eq!(r.int(), Ok(-1));
        assert_eq!(r.str(), Ok(&b"ab"[..]));
        assert_eq!(r.nil(), Ok(true));
        assert_eq!(r.head(), Ok(Head::Bool(true)));
        assert_eq!(r.float(), Ok(1.5));
        assert_eq!(r.map_len(), Ok(1));
        assert_eq!(r.str(), Ok(&b"k"[..]));
        assert_eq!(r.int(), Ok(300));
        assert_eq!(r.head(), Ok(Head::UInt(1 << 63)));
        assert!(r.is_empty());
    }

    #[test]
    fn skips_nested_values_and_tells_truncation_from_garbage() {
        let nested = [0x92, 0x91, 0x81, 0xa1, b'x', 0x93, 1, 2, 3, 0xa1, b'y', 7];
        let mut r = Reader::new(&nested);
        assert_eq!(r.skip(), Ok(()));
        assert_eq!(r.position(), nested.len() - 1);
        for cut in 0..nested.len() - 1 {
            let mut r = Reader::new(&nested[..cut]);
            assert_eq!(r.skip(), Err(MsgpackError::Truncated), "cut at {cut}");
            assert_eq!(r.position(), 0);
        }
        assert_eq!(Reader::new(&[0xc1]).skip(), Err(MsgpackError::Invalid));
        // A huge declared length is a cut-off, not an allocation.
        assert_eq!(
            Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).skip(),
            Err(MsgpackError::Truncated)
        );
        assert_eq!(
            Reader::new(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'a']).skip(),
            Err(MsgpackError::Truncated)
        );
        let deep = vec![0x91u8; 100];
        assert_eq!(Reader::new(&deep).skip(), Err(MsgpackError::TooDeep));
    }

    #[test]
    fn typed_reads_leave_the_position_on_mismatch() {
        let mut r = Reader::new(&[0xa1, b'z']);
        assert_eq!(r.int(), Err(MsgpackError::Type));
        assert_eq!(r.position(), 0);
        assert_eq!(r.str(), Ok(&b"z"[..]));
    }
}
