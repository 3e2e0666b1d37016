//! Token events summarised in the kernel. Once user space has decoded a process's stream in
//! full and seen what its token events look like, it installs the process's
//! [`StreamTemplate`]; each connection of the process takes a copy at its next response head
//! (so a new connection needs nothing from user space, however far behind it is); a response
//! write that is exactly one chunk holding one such event then goes out without its payload,
//! as its time and size in a batch: all user space needs of it. Every check is
//! exact (bytes at fixed offsets, the chunk's framing, no `"`, control byte or trailing `\` in
//! the token text, so the chunk cannot hold a second event); a write that fails any is captured
//! in full, as before.
//!
//! Arming: a connection's first body write after a response head (it carries the response's
//! id) and the first write after any miss (it may have begun another response, e.g. a
//! terminator and the next head in one write) are captured whole, never cut, and only once
//! such a write went out whole is the connection armed for token records.
//!
//! Batching: a connection's token events wait in its template entry ([`TokenBatch`], 8 bytes
//! each instead of a 48-byte record each) and go out together: when 32 are waiting, when the
//! batch spans the agent's poll period (not behind a filling ring), and always ahead of the
//! connection's next other record. A token write then costs a map store, not a ring-buffer
//! record and a record number.
use core::mem::size_of;

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap},
};
use inferscope_common::{
    Counter, MAX_CAPTURE_BYTES, RecordType, StreamTemplate, TEMPLATE_BYTES, TEMPLATE_WORDS,
    TOKEN_BATCH_MAX, TOKEN_TEXT_MAX, TOKEN_WRITE_MAX, TokenBatch, TokenBatchEntry,
    TokenBatchRecord,
};

use crate::{
    bound::at_most,
    counters::{add, bump},
    maps::conn_entry,
    ringbuf::{output_bytes, under_pressure},
};

/// Connections' templates and their waiting token events, two slots per connection id (a
/// pair its id picks): a lookup on every token write is then an array access the verifier
/// inlines, where a hash lookup is a helper call (~50 ns here). A connection takes a free slot
/// of its pair at its first response head with a template, or one whose connection has ended
/// (closed unseen); with both held by live connections it goes without a template (counted),
/// so no connection's waiting events are ever pushed out. Close frees the slot.
#[map]
pub static STREAM_TEMPLATES: Array<StreamTemplate> = Array::with_max_entries(STREAM_SLOTS, 0);

const STREAM_SLOTS: u32 = 4096;

/// The first of the two slots of connection `conn_id` (ids are nanosecond times: the multiply
/// spreads them over the pairs).
#[inline(always)]
fn slot_pair(conn_id: u64) -> u32 {
    ((conn_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32) & (STREAM_SLOTS - 2)
}

/// The slot holding connection `conn_id` on fd `key`, if one does: (index, template).
#[inline(always)]
fn find(key: u64, conn_id: u64) -> Option<(u32, &'static mut StreamTemplate)> {
    let first = slot_pair(conn_id);
    for index in [first, first + 1] {
        if let Some(slot) = STREAM_TEMPLATES.get_ptr_mut(index) {
            // SAFETY: map value pointer from the lookup, valid for the program's run; see
            // `set_armed` and `classify`'s re-check for a slot reinstalled meanwhile.
            let slot = unsafe { &mut *slot };
            if slot.conn_gen == conn_id && slot.key == key {
                return Some((index, slot));
            }
        }
    }
    None
}

/// A slot of `conn_id`'s pair that no live connection holds, its waiting events (a connection
/// whose close went unseen) sent first.
#[inline(always)]
fn free_slot(conn_id: u64) -> Option<u32> {
    let first = slot_pair(conn_id);
    for index in [first, first + 1] {
        let Some(slot) = STREAM_TEMPLATES.get_ptr_mut(index) else {
            continue;
        };
        // SAFETY: map value pointer from the lookup.
        let slot = unsafe { &mut *slot };
        if slot.conn_gen == 0 {
            return Some(index);
        }
        let alive = conn_entry(slot.key).is_some_and(|conn| conn.id == slot.conn_gen);
        if !alive {
            send(&mut slot.batch, slot.key);
            return Some(index);
        }
    }
    None
}

/// Per tgid: the process's template, from user space; `conn_gen` unused, `version` names it.
#[map]
pub static PROCESS_TEMPLATES: HashMap<u32, StreamTemplate> = HashMap::with_max_entries(1024, 0);

/// Offsets into the scratch payload stay below this (the buffer holds two capture windows, so
/// an 8-byte read at any masked offset stays inside).
const OFFSET_MASK: usize = MAX_CAPTURE_BYTES - 1;

const _: () = assert!(MAX_CAPTURE_BYTES.is_power_of_two() && TOKEN_WRITE_MAX < MAX_CAPTURE_BYTES);

/// A response head went out on this connection: its next write is captured in full, and the
/// connection takes its process's current template if it has not got it yet.
#[inline(always)]
pub fn on_head(tgid: u32, key: u64, conn_id: u64) {
    // SAFETY: map value pointer from the lookup, read-only here.
    let Some(process) = (unsafe { PROCESS_TEMPLATES.get(tgid) }) else {
        return;
    };
    let index = match find(key, conn_id) {
        Some((index, template)) => {
            // Its events go before the head (they end the response before it), and before a
            // new template would overwrite them.
            send(&mut template.batch, key);
            if template.version == process.version {
                template.armed = 0;
                return;
            }
            index
        }
        None => match free_slot(conn_id) {
            Some(index) => index,
            None => {
                bump(Counter::TokenSlotsBusy);
                return;
            }
        },
    };
    // The process's template goes in as it is (the map update copies it in the kernel: a copy
    // made here is a 1 KiB byte loop the verifier walks once per path), then becomes this
    // connection's. Until `conn_gen` is written the slot names no connection (user space's
    // is 0, never a connection id), so a write that reads it meanwhile is captured as before.
    // By reference: by value, the 1 KiB template would be copied onto the 512-byte stack.
    if STREAM_TEMPLATES.set(index, process, 0).is_err() {
        return;
    }
    if let Some(template) = STREAM_TEMPLATES.get_ptr_mut(index) {
        // SAFETY: map value pointer from the lookup; `armed` and `key` are written before
        // `conn_gen` names the connection (see `classify`'s re-check).
        unsafe {
            core::ptr::write_volatile(&mut (*template).armed, 0);
            core::ptr::write_volatile(&mut (*template).key, key);
            core::ptr::write_volatile(&mut (*template).conn_gen, conn_id);
        }
    }
}

/// The write [`classify`] answered [`Verdict::Arm`] for went out whole: the connection's next
/// token events may go as token records.
#[inline(always)]
pub fn arm(key: u64, conn_id: u64) {
    set_armed(key, conn_id, 1);
}

#[inline(always)]
fn set_armed(key: u64, conn_id: u64, armed: u8) {
    if let Some((_, template)) = find(key, conn_id) {
        // A slot reinstalled by a racing head on another CPU is caught by the connection
        // check in all but a window of a few instructions; a wrong `armed` then costs one
        // response its id (counted in user space as a response without one), never a wrong
        // event.
        if template.armed != armed {
            template.armed = armed;
        }
    }
}

/// The payload's 8-byte word at any byte offset, in one load. The BPF backend splits an 8-byte
/// load it cannot prove aligned into eight byte loads, which made every word of a template
/// compare two aligned loads joined by shifts (~20 instructions a word with their stack spills;
/// one load: ~12, and ~20 ns less per token write, BENCHMARKS §31). The kernel allows a
/// misaligned map-value load wherever the architecture does
/// (`CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS`: x86-64, the only architecture the agent builds
/// for), so the load is written out.
#[inline(always)]
fn word_at(payload: &[u8; 2 * MAX_CAPTURE_BYTES], offset: usize) -> u64 {
    #[cfg(target_arch = "bpf")]
    {
        let word: u64;
        // SAFETY: the offset is masked below MAX_CAPTURE_BYTES in the assembly itself, so the 8
        // bytes read lie inside the 2×MAX buffer; the load only reads. The mask is written out
        // with the load: the compiler drops a mask it can prove redundant, and a 6.1 verifier
        // cannot prove it, so the load's offset must be masked where the verifier sees it.
        unsafe {
            core::arch::asm!(
                "{offset} &= {mask}",
                "{at} += {offset}",
                "{word} = *(u64 *)({at} + 0)",
                at = inout(reg) payload.as_ptr() => _,
                offset = inout(reg) offset => _,
                mask = const OFFSET_MASK,
                word = lateout(reg) word,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        word
    }
    // Host builds (clippy, unit tests) have unaligned loads of their own.
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: offset < MAX_CAPTURE_BYTES, so the 8 bytes read lie inside the 2×MAX buffer.
    unsafe {
        core::ptr::read_unaligned(payload.as_ptr().add(offset & OFFSET_MASK).cast::<u64>())
    }
}

#[inline(always)]
fn byte_at(payload: &[u8; 2 * MAX_CAPTURE_BYTES], offset: usize) -> u8 {
    payload[offset & OFFSET_MASK]
}

/// Differences from `words` under `mask` over the first `len` bytes' 8-byte words from
/// `start`: 0 when all match. Only the words the side covers are compared (the mask is 0 past
/// its length): a token write costs its template's length, not the template's room (64 words,
/// ~130 ns here, where a typical template side is 9 to 25).
#[inline(always)]
fn masked_diff(
    payload: &[u8; 2 * MAX_CAPTURE_BYTES],
    start: usize,
    len: usize,
    words: &[u64; TEMPLATE_WORDS],
    mask: &[u64; TEMPLATE_WORDS],
) -> u64 {
    // Opaque to the compiler, so it keeps the loop's own bound, which 5.10's verifier needs
    // (it loses `len`'s bounds on the stack): `crate::bound`.
    let count = at_most::<{ TEMPLATE_WORDS as u32 }>(len.div_ceil(8));
    let mut diff = 0u64;
    for i in 0..TEMPLATE_WORDS {
        if i >= count {
            break;
        }
        diff |= (word_at(payload, start + i * 8) ^ words[i]) & mask[i];
    }
    diff
}

/// Whether any of the `len` (≤ [`TOKEN_TEXT_MAX`]) bytes from `start` is a `"` or a control
/// byte (below 0x20: a raw newline could end the event): a word at a time (the zero-byte test
/// on the bytes XOR `"`, the less-than test against 0x20; bytes past `len` are forced to `A`).
#[inline(always)]
fn has_quote_or_control(payload: &[u8; 2 * MAX_CAPTURE_BYTES], start: usize, len: usize) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = 0x2222_2222_2222_2222;
    const SPACES: u64 = 0x2020_2020_2020_2020;
    const FILLER: u64 = 0x4141_4141_4141_4141;
    let count = at_most::<{ (TOKEN_TEXT_MAX / 8) as u32 }>(len.div_ceil(8));
    let mut found = 0u64;
    for i in 0..TOKEN_TEXT_MAX / 8 {
        if i >= count {
            break;
        }
        let taken = len - i * 8;
        // Bytes of this word inside the text: all 8, or the first `taken` (little endian).
        let keep = if taken >= 8 {
            u64::MAX
        } else {
            (1u64 << (taken * 8)) - 1
        };
        let x = (word_at(payload, start + i * 8) & keep) | (!keep & FILLER);
        let t = x ^ QUOTES;
        found |= t.wrapping_sub(ONES) & !t & HIGHS;
        found |= x.wrapping_sub(SPACES) & !x & HIGHS;
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
    // No token chunk is empty, and a leading zero would make two size lines of one size.
    if digits == 0 || digits == 4 || payload[0] == b'0' {
        return None;
    }
    if byte_at(payload, digits) != b'\r' || byte_at(payload, digits + 1) != b'\n' {
        return None;
    }
    Some((digits + 2, size))
}

/// What a response write on a connection is, for the token path.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The connection is not armed: capture this write whole (never cut), then [`arm`] it.
    Arm,
    /// One whole token event of the template: it joins the connection's batch.
    Token,
    /// Not a token event (counted; the connection is disarmed): the write goes as before,
    /// after the connection's waiting token events ([`flush`]).
    Miss,
}

/// The connection's template, if it has one for connection `conn_id`.
#[inline(always)]
pub fn lookup(key: u64, conn_id: u64) -> Option<&'static mut StreamTemplate> {
    find(key, conn_id).map(|(_, template)| template)
}

/// Classifies a response write of `len` bytes (`whole`: captured whole, not cut or failed) on
/// a connection with `template` (from [`lookup`]).
#[inline(always)]
pub fn classify(
    template: &mut StreamTemplate,
    conn_id: u64,
    payload: &[u8; 2 * MAX_CAPTURE_BYTES],
    len: usize,
    whole: bool,
) -> Verdict {
    if template.armed == 0 {
        return Verdict::Arm;
    }
    if whole && is_token(template, conn_id, payload, len) {
        return Verdict::Token;
    }
    bump(Counter::TokenTemplateMisses);
    template.armed = 0;
    Verdict::Miss
}

/// Whether the `len` bytes of a whole write are one token event of `template` (armed or not);
/// changes nothing.
#[inline(always)]
pub fn is_token(
    template: &StreamTemplate,
    conn_id: u64,
    payload: &[u8; 2 * MAX_CAPTURE_BYTES],
    len: usize,
) -> bool {
    let version = template.version;
    let token = len <= TOKEN_WRITE_MAX && matches(template, payload, len);
    // SAFETY: reads of the same map value; a user-space update that recycled this element
    // while it was compared rewrote `conn_gen` and `version` first.
    let unchanged = unsafe {
        core::ptr::read_volatile(&template.conn_gen) == conn_id
            && core::ptr::read_volatile(&template.version) == version
    };
    token && unchanged
}

/// How long a batch may gather token events before the one that reaches this span sends it:
/// the agent reads the ring buffer at least this often (its poll timeout), so a steady
/// stream's events reach it about as soon as they would one record each. Behind a filling ring
/// the span does not count, only [`TOKEN_BATCH_MAX`].
const TOKEN_BATCH_SPAN_NS: u64 = 50_000_000;

/// Adds a token event to its connection's batch, which goes out (one ring-buffer record, 8
/// bytes per event) when full, when its span reaches [`TOKEN_BATCH_SPAN_NS`], or ahead of the
/// connection's next other record (a write that is not a token event, a head, shutdown,
/// close: [`flush`], [`flush_connection`]), so the connection's records keep their order.
#[inline(always)]
pub fn batch(
    template: &mut StreamTemplate,
    key: u64,
    writer: &TokenWriter,
    ts_ns: u64,
    bytes: u32,
) {
    let batch = &mut template.batch;
    let mut count = usize::from(batch.header.count);
    // From another connection of the fd (its close went unseen), or too far apart for a
    // 32-bit offset: those go first, and this event with them.
    let stale = count > 0
        && (batch.header.conn_gen != writer.conn_gen
            || ts_ns.wrapping_sub(batch.header.first_ts_ns) > u64::from(u32::MAX));
    if stale || count >= TOKEN_BATCH_MAX {
        send(batch, key);
        count = 0;
    }
    if count == 0 {
        batch.header = TokenBatchRecord {
            record_type: RecordType::TokenBatch as u8,
            count: 0,
            conn_flags: writer.conn_flags as u8,
            _pad0: 0,
            tgid: writer.tgid,
            fd: writer.fd,
            _pad1: 0,
            conn_gen: writer.conn_gen,
            first_ts_ns: ts_ns,
            conn_seq: 0,
            lost_heads: 0,
        };
    }
    // Writes on one connection enter in order; a racing thread's earlier entry reads as 0.
    let offset_ns = ts_ns.saturating_sub(batch.header.first_ts_ns);
    batch.entries[count & (TOKEN_BATCH_MAX - 1)] = TokenBatchEntry {
        offset_ns: offset_ns as u32,
        bytes,
    };
    batch.header.count = (count + 1) as u8;
    if stale
        || count + 1 >= TOKEN_BATCH_MAX
        || (offset_ns >= TOKEN_BATCH_SPAN_NS && !under_pressure())
    {
        send(batch, key);
    }
}

/// Who wrote a token event: what its batch's header names.
pub struct TokenWriter {
    pub tgid: u32,
    pub fd: i32,
    pub conn_gen: u64,
    pub conn_flags: u32,
}

/// Sends the connection's waiting token events, if any: before any other record of its
/// writes (a miss, a head), its shutdown or its close.
#[inline(always)]
pub fn flush(template: &mut StreamTemplate, key: u64) {
    send(&mut template.batch, key);
}

/// [`flush`] for connection `conn_id` on fd `key`, looked up: shutdown and close, which have
/// not looked at the template.
#[inline(always)]
pub fn flush_connection(key: u64, conn_id: u64) {
    if let Some((_, template)) = find(key, conn_id) {
        let batch = &mut template.batch;
        if batch.header.count > 0 && batch.header.conn_gen == conn_id {
            send(batch, key);
        }
    }
}

/// The fd stops naming connection `conn_id` (close): its waiting token events go out, and its
/// slot is freed for the next connection whose id picks it.
#[inline(always)]
pub fn forget_connection(key: u64, conn_id: u64) {
    let Some((_, template)) = find(key, conn_id) else {
        return;
    };
    send(&mut template.batch, key);
    template.conn_gen = 0;
    template.key = 0;
}

#[inline(always)]
fn send(batch: &mut TokenBatch, key: u64) {
    let count = usize::from(batch.header.count);
    if count == 0 {
        return;
    }
    // Restated for the verifier: the count is a byte of a map value.
    let count = if count > TOKEN_BATCH_MAX {
        TOKEN_BATCH_MAX
    } else {
        count
    };
    let (conn_seq, lost_heads) = crate::conn_seq::take(key, true);
    batch.header.conn_seq = conn_seq;
    batch.header.lost_heads = lost_heads;
    batch.header.count = count as u8;
    let len = size_of::<TokenBatchRecord>() + count * size_of::<TokenBatchEntry>();
    // SAFETY: the header and the first `count` entries, laid out contiguously in the map value
    // (asserted in inferscope_common); `len` is at most the batch's size.
    let bytes =
        unsafe { core::slice::from_raw_parts((batch as *const TokenBatch).cast::<u8>(), len) };
    if output_bytes::<{ size_of::<TokenBatch>() as u32 }>(bytes, Counter::RecordsEmitted) {
        bump(Counter::TokenBatches);
        add(Counter::TokenEvents, count as u64);
    }
    batch.header.count = 0;
}

#[inline(always)]
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
    let diff = masked_diff(
        payload,
        line,
        prefix,
        &template.prefix,
        &template.prefix_mask,
    ) | masked_diff(
        payload,
        line + size - suffix,
        suffix,
        &template.suffix,
        &template.suffix_mask,
    );
    // A trailing backslash would escape the closing quote.
    diff == 0
        && byte_at(payload, line + prefix + text - 1) != b'\\'
        && !has_quote_or_control(payload, line + prefix, text)
}
