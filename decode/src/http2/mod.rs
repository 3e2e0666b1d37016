//! HTTP/2 (RFC 9113) and gRPC decoding of one connection as seen through a server's socket
//! syscalls, reduced to what an inference timeline needs: per stream, its method, path,
//! content-type, status and gRPC status, its messages each way (counts, sizes, first and last
//! timestamps) and how it ended.
//!
//! Layers: [`frame`] cuts each direction into frames; [`hpack`] decodes header blocks with the
//! dynamic table as far as it can be known; [`grpc`] delimits gRPC's length-prefixed messages in
//! a stream's DATA; [`Http2Connection`] ties both directions' streams together.
//!
//! The input is lossy and may start mid-connection. What cannot be known is reported unknown
//! ([`Value::Unknown`]), never guessed: a header taken from a dynamic table entry inserted before
//! we attached is unknown until the encoder empties its table or inserts entries we can read.
//!
//! Privacy: DATA payloads are never kept (only the 5-byte gRPC prefix); header blocks are held
//! only until decoded, and only a few short header values leave a stream summary. The dynamic
//! table holds header values, as every HTTP/2 endpoint's does, bounded by
//! [`Limits::max_table_bytes`].
//!
//! Memory per connection is bounded by [`Limits`]: two dynamic tables, one header block being
//! gathered per direction, and at most [`Limits::max_streams`] streams of fixed size.

mod body;
mod connection;
pub mod frame;
pub mod grpc;
pub mod hpack;
#[cfg(test)]
mod plain_tests;
mod stream;
#[cfg(test)]
mod tests;
/// HTTP/2 frames built by hand, for tests here and in the agent (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod testwire;

pub use body::{Exchange, MAX_HELD_BYTES};
pub use connection::{Http2Connection, MAX_PAIRED_MESSAGES};
pub use frame::{PREFACE, whole_frames};
pub use stream::{
    EndedBy, MAX_ID_BYTES, MessageId, Messages, PAIRED_HEAD_BYTES, StreamHead, StreamMessage,
    StreamSummary,
};

/// Which end wrote the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The client: bytes the server read.
    Client,
    /// The server: bytes the server wrote.
    Server,
}

impl Side {
    pub fn other(self) -> Self {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// Where decoding starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At the connection's first byte: the client's preface, the server's first frame, both
    /// HPACK tables empty and known.
    Fresh,
    /// Somewhere later: each direction hunts for a frame header and the dynamic tables are
    /// unknown.
    MidConnection,
}

/// Caps on per-connection state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest header block (HEADERS and its CONTINUATIONs) gathered for HPACK; a larger one
    /// is skipped, and the table it changed reads unknown until the encoder resets it.
    pub max_header_block_bytes: usize,
    /// Largest dynamic table kept per direction, whatever the peer allows.
    pub max_table_bytes: usize,
    /// Streams followed at once; more are counted and not followed.
    pub max_streams: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_header_block_bytes: 64 * 1024,
            max_table_bytes: 64 * 1024,
            max_streams: 256,
        }
    }
}

/// A header value as far as the observer knows it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum Value<T> {
    /// The header block did not carry it.
    #[default]
    Absent,
    /// It may have: the block referred to a dynamic table entry we never saw, or could not be
    /// decoded.
    Unknown,
    Known(T),
}

impl<T> Value<T> {
    pub fn known(&self) -> Option<&T> {
        match self {
            Value::Known(v) => Some(v),
            _ => None,
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Value<U> {
        match self {
            Value::Absent => Value::Absent,
            Value::Unknown => Value::Unknown,
            Value::Known(v) => Value::Known(f(v)),
        }
    }

    fn absent_is_unknown(&mut self) {
        if matches!(self, Value::Absent) {
            *self = Value::Unknown;
        }
    }
}

/// Whether a server's first read from a connection begins the HTTP/2 client preface (h2c with
/// prior knowledge). A read shorter than the preface matches on what it holds, if it holds at
/// least its request line (`PRI * HTTP/2.0`), which no HTTP/1 request begins with.
pub fn starts_with_preface(bytes: &[u8]) -> bool {
    let n = bytes.len().min(PREFACE.len());
    n >= 16 && bytes.get(..n) == PREFACE.get(..n)
}

/// Whether a server's first write, before it read anything, is an HTTP/2 server's connection
/// preface: a SETTINGS frame (not an acknowledgement) on stream 0. An HTTP/1 server never writes
/// first, and HTTP/2 servers (grpcio's core among them) send their SETTINGS on accept, before
/// the client's preface arrives.
pub fn starts_with_server_preface(bytes: &[u8]) -> bool {
    let Some(&[l0, l1, l2, kind, flags, s0, s1, s2, s3]) = bytes.first_chunk::<9>() else {
        return false;
    };
    let len = u32::from_be_bytes([0, l0, l1, l2]);
    kind == frame::kind::SETTINGS
        && flags == 0
        && [s0, s1, s2, s3] == [0; 4]
        && len.is_multiple_of(6)
        && len <= 16 * 6
}
