//! Per-connection record numbers, so user space knows which connection lost records when the
//! ring buffer was full, and how many of the lost writes opened a response head (an answered
//! request it will never see). Self-contained: one map, two helpers, two header fields.
use aya_ebpf::{macros::map, maps::LruHashMap};

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ConnSeq {
    /// Number of the next record on this fd.
    pub next: u32,
    /// Records lost on this fd whose payload began with `HTTP/` (a response head).
    pub lost_heads: u32,
}

/// Per (tgid, fd). LRU: an entry of a closed fd ages out; a new connection resets it at accept.
#[map]
pub static CONN_SEQ: LruHashMap<u64, ConnSeq> = LruHashMap::with_max_entries(65536, 0);

/// Takes the number of this fd's next record, and the fd's lost-head count so far. A server
/// uses one connection from one thread at a time, so a plain read-modify-write is enough; a
/// rare race shows in user space as a spurious gap, never as a missed one.
#[inline(always)]
pub fn take(key: u64, accept: bool) -> (u32, u32) {
    if !accept && let Some(slot) = CONN_SEQ.get_ptr_mut(key) {
        // SAFETY: a valid map value pointer from the lookup.
        let current = unsafe { *slot };
        // SAFETY: as above; one thread uses an fd at a time (see the doc), and a race only numbers
        // a record twice.
        unsafe { (*slot).next = current.next.wrapping_add(1) };
        return (current.next, current.lost_heads);
    }
    let fresh = ConnSeq {
        next: 1,
        lost_heads: 0,
    };
    let _ = CONN_SEQ.insert(key, fresh, 0);
    (0, 0)
}

/// The record taken with [`take`] did not fit in the ring buffer.
#[inline(always)]
pub fn lost(key: u64, head: bool) {
    if !head {
        return;
    }
    if let Some(slot) = CONN_SEQ.get_ptr_mut(key) {
        // SAFETY: as in `take`.
        unsafe { (*slot).lost_heads = (*slot).lost_heads.wrapping_add(1) };
    }
}

/// The fd closed: its next connection starts numbering afresh even without an accept.
#[inline(always)]
pub fn forget(key: u64) {
    let _ = CONN_SEQ.remove(key);
}
