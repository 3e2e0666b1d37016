//! Token events summarised in the kernel. Once user space has decoded a connection's stream in
//! full and seen what its token events look like, it installs a [`StreamTemplate`]; a response
//! write that is exactly one chunk holding one such event then goes out as a payload-free
//! compact record ([`FLAG_TOKEN`]): its time and size are all user space needs. Every check is
//! exact (bytes at fixed offsets, the chunk's framing, no `"` in the token text, so the chunk
//! cannot hold a second event); a write that fails any is captured in full, as before.
use aya_ebpf::{macros::map, maps::LruHashMap};
use inferscope_common::{
    Counter, MAX_CAPTURE_BYTES, StreamTemplate, TEMPLATE_BYTES, TEMPLATE_WORDS, TOKEN_TEXT_MAX,
    TOKEN_WRITE_MAX,
};

use crate::counters::bump;

/// Per (tgid, fd): the connection's template, valid while the fd holds `conn_gen`. LRU: a
/// closed connection's entry ages out (a reused fd has another id, so a stale one never
/// applies).
#[map]
pub static STREAM_TEMPLATES: LruHashMap<u64, StreamTemplate> =
    LruHashMap::with_max_entries(4096, 0);

/// Offsets into the scratch payload stay below this (the buffer holds two capture windows, so
/// an 8-byte read at any masked offset stays inside).
const OFFSET_MASK: usize = MAX_CAPTURE_BYTES - 1;

const _: () = assert!(MAX_CAPTURE_BYTES.is_power_of_two() && TOKEN_WRITE_MAX < MAX_CAPTURE_BYTES);

/// A response head went out on this connection: its first body write is captured in full.
#[inline(always)]
pub fn on_head(key: u64, conn_id: u64) {
    if let Some(template) = STREAM_TEMPLATES.get_ptr_mut(key) {
        // SAFETY: map value pointer from the lookup; a racing user-space update leaves either
        // value, and `armed` at 0 only costs one more full capture.
        unsafe {
            if (*template).conn_gen == conn_id {
                (*template).armed = 0;
            }
        }
    }
}

/// The payload's 8-byte words from any byte offset, read with aligned loads only: the BPF
/// backend splits an unaligned 8-byte load into eight byte loads, which unrolled over a
/// template spills past the 512-byte stack.
struct Words {
    /// Offset of the aligned word holding the first byte.
    base: usize,
    /// Bit shifts that join two aligned words into the unaligned one.
    low: u32,
    high: u32,
    /// 0 when the offset is aligned (the second word contributes nothing; a 64-bit shift
    /// would be undefined).
    high_keep: u64,
}

impl Words {
    #[inline(always)]
    fn from(start: usize) -> Self {
        let start = start & OFFSET_MASK;
        let misalign = start & 7;
        Self {
            base: start - misalign,
            low: (misalign * 8) as u32,
            high: ((64 - misalign * 8) & 63) as u32,
            high_keep: 0u64.wrapping_sub((misalign != 0) as u64),
        }
    }

    #[inline(always)]
    fn word(&self, payload: &[u8; 2 * MAX_CAPTURE_BYTES], i: usize) -> u64 {
        let first = aligned_word(payload, self.base + i * 8);
        let second = aligned_word(payload, self.base + i * 8 + 8);
        (first >> self.low) | ((second << self.high) & self.high_keep)
    }
}

#[inline(always)]
fn aligned_word(payload: &[u8; 2 * MAX_CAPTURE_BYTES], offset: usize) -> u64 {
    let offset = offset & OFFSET_MASK & !7;
    // SAFETY: offset < MAX_CAPTURE_BYTES and a multiple of 8, and the payload starts 8-aligned
    // (asserted on `Scratch`), so the read is aligned and inside the 2×MAX buffer.
    unsafe { core::ptr::read(payload.as_ptr().add(offset).cast::<u64>()) }
}

#[inline(always)]
fn byte_at(payload: &[u8; 2 * MAX_CAPTURE_BYTES], offset: usize) -> u8 {
    payload[offset & OFFSET_MASK]
}

/// Differences from `words` under `mask` over the 8-byte words from `start`: 0 when all match.
/// Branch-free over every word (the mask is 0 past the side's length), so the verifier walks
/// it once.
#[inline(always)]
fn masked_diff(
    payload: &[u8; 2 * MAX_CAPTURE_BYTES],
    start: usize,
    words: &[u64; TEMPLATE_WORDS],
    mask: &[u64; TEMPLATE_WORDS],
) -> u64 {
    let cursor = Words::from(start);
    let mut diff = 0u64;
    for i in 0..TEMPLATE_WORDS {
        diff |= (cursor.word(payload, i) ^ words[i]) & mask[i];
    }
    diff
}

/// Whether any of the `len` (≤ [`TOKEN_TEXT_MAX`]) bytes from `start` is a `"`: a word at a
/// time (the zero-byte test on the bytes XOR `"`; bytes past `len` are forced to a non-quote).
#[inline(always)]
fn has_quote(payload: &[u8; 2 * MAX_CAPTURE_BYTES], start: usize, len: usize) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = 0x2222_2222_2222_2222;
    let cursor = Words::from(start);
    let mut found = 0u64;
    for i in 0..TOKEN_TEXT_MAX / 8 {
        let taken = len.saturating_sub(i * 8);
        // Bytes of this word inside the text: all 8, or the first `taken` (little endian).
        let keep = if taken >= 8 {
            u64::MAX
        } else {
            (1u64 << (taken * 8)) - 1
        };
        let x = (cursor.word(payload, i) & keep) | (!keep & ONES);
        let t = x ^ QUOTES;
        found |= t.wrapping_sub(ONES) & !t & HIGHS;
    }
    found != 0
}

/// Parses the chunk-size line at the start of the write: (line length, chunk size).
#[inline(always)]
fn chunk_line(payload: &[u8; 2 * MAX_CAPTURE_BYTES]) -> Option<(usize, usize)> {
    let mut size = 0usize;
    let mut digits = 0usize;
    // A token write is at most TOKEN_WRITE_MAX bytes: three hex digits.
    for (i, &b) in payload.iter().take(4).enumerate() {
        let v = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => break,
        };
        size = size * 16 + v as usize;
        digits = i + 1;
    }
    if digits == 0 || digits == 4 {
        return None;
    }
    if byte_at(payload, digits) != b'\r' || byte_at(payload, digits + 1) != b'\n' {
        return None;
    }
    Some((digits + 2, size))
}

/// Whether the write of `len` bytes in `payload` (captured whole) is one token event of the
/// connection's template. Counts a miss where a template applied but the write was not one.
#[inline(always)]
pub fn is_token(key: u64, conn_id: u64, payload: &[u8; 2 * MAX_CAPTURE_BYTES], len: usize) -> bool {
    if len > TOKEN_WRITE_MAX {
        return false;
    }
    let Some(template) = STREAM_TEMPLATES.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: map value pointer from the lookup; it is read field by field, and a racing
    // user-space update can only give a mix of two templates user space found valid for this
    // connection, each byte checked against one of them.
    let template = unsafe { &mut *template };
    if template.conn_gen != conn_id {
        return false;
    }
    if template.armed == 0 {
        // The response's first body write carries its id: in full.
        template.armed = 1;
        return false;
    }
    let matched = matches(template, payload, len);
    if !matched {
        bump(Counter::TokenTemplateMisses);
    }
    matched
}

// Not inlined: a BPF subprogram has its own stack frame, and the exit program's is nearly full.
#[inline(never)]
fn matches(template: &StreamTemplate, payload: &[u8; 2 * MAX_CAPTURE_BYTES], len: usize) -> bool {
    let Some((line, size)) = chunk_line(payload) else {
        return false;
    };
    // Exactly one chunk: its size line, its data, its CRLF.
    if line + size + 2 != len
        || byte_at(payload, len - 2) != b'\r'
        || byte_at(payload, len - 1) != b'\n'
    {
        return false;
    }
    let prefix = template.prefix_len as usize;
    let suffix = template.suffix_len as usize;
    if prefix > TEMPLATE_BYTES || suffix > TEMPLATE_BYTES || size <= prefix + suffix {
        return false;
    }
    let text = size - prefix - suffix;
    if text > TOKEN_TEXT_MAX {
        return false;
    }
    let diff = masked_diff(payload, line, &template.prefix, &template.prefix_mask)
        | masked_diff(
            payload,
            line + size - suffix,
            &template.suffix,
            &template.suffix_mask,
        );
    diff == 0 && !has_quote(payload, line + prefix, text)
}
