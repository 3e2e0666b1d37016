//! Wire bytes for tests: frames and header blocks built by hand (literals and static indexes,
//! so every byte is known), shared by the decoder's and the connection tracker's tests.

use super::frame::kind;

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

pub fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut v = len.to_be_bytes()[1..].to_vec();
    v.push(ty);
    v.push(flags);
    v.extend(stream.to_be_bytes());
    v.extend(payload);
    v
}

pub fn padded(pad: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![pad];
    v.extend(body);
    v.extend(std::iter::repeat_n(0, usize::from(pad)));
    v
}

/// A string literal of under 127 bytes, not Huffman coded.
pub fn string(s: &str) -> Vec<u8> {
    let mut v = vec![s.len() as u8];
    v.extend(s.as_bytes());
    v
}

/// Literal with incremental indexing, name from the static table (`index` < 63).
pub fn indexed_name(index: u8, value: &str) -> Vec<u8> {
    let mut v = vec![0x40 | index];
    v.extend(string(value));
    v
}

/// Literal without indexing, new name.
pub fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut v = vec![0x00];
    v.extend(string(name));
    v.extend(string(value));
    v
}

pub fn grpc_message(len: usize) -> Vec<u8> {
    let mut v = vec![0];
    v.extend((len as u32).to_be_bytes());
    v.extend(std::iter::repeat_n(b'p', len));
    v
}

pub fn settings(table_size: Option<u32>) -> Vec<u8> {
    let mut p = Vec::new();
    if let Some(size) = table_size {
        p.extend(1u16.to_be_bytes());
        p.extend(size.to_be_bytes());
    }
    p.extend(3u16.to_be_bytes());
    p.extend(100u32.to_be_bytes());
    frame(kind::SETTINGS, 0, 0, &p)
}

/// A request's header block: POST, http, the path (inserted into the dynamic table), gRPC's
/// content-type (inserted too) and `te: trailers`.
pub fn request_block(path: &str) -> Vec<u8> {
    let mut b = vec![0x83, 0x86];
    b.extend(indexed_name(4, path));
    b.extend(indexed_name(31, "application/grpc"));
    b.extend(literal("te", "trailers"));
    b
}

pub fn response_block() -> Vec<u8> {
    let mut b = vec![0x88];
    b.extend(indexed_name(31, "application/grpc"));
    b
}

pub fn trailers_block(status: &str) -> Vec<u8> {
    let mut b = literal("grpc-status", status);
    b.extend(literal("grpc-message", "fine"));
    b
}
