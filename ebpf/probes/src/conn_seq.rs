//! Per-connection record numbers, so user space knows which connection lost records when the
//! ring buffer was full, and how many of the lost writes opened a response head (an answered
//! request it will never see). Reads and writes are numbered apart: a connection read by one
//! thread while another writes it (HTTP/2, TLS) numbers each direction in its own order, so the
//! two never race on one counter or reach the ring out of their numbers' order.
//!
//! An fd whose connection holds its slot in `CONN_SLOTS` (almost every accepted connection)
//! keeps its numbers there; any other in [`CONN_SEQ`].
use aya_ebpf::{macros::map, maps::LruHashMap};

use crate::maps::{ConnSeq, slot_seq};

/// Per (tgid, fd). LRU: an entry of a closed fd ages out; a new connection resets it at accept.
#[map]
pub static CONN_SEQ: LruHashMap<u64, ConnSeq> = LruHashMap::with_max_entries(65536, 0);

/// Takes the number of this fd's next read or write record, and the fd's lost-head count so
/// far. One thread uses a direction of an fd at a time, so a plain read-modify-write of its own
/// counter is enough; a rare race shows in user space as a spurious gap, never as a missed one.
#[inline(always)]
pub fn take(key: u64, write: bool) -> (u32, u32) {
    if let Some(slot) = slot_seq(key).or_else(|| CONN_SEQ.get_ptr_mut(key)) {
        // SAFETY: a valid map value pointer from the lookup; each direction's counter has one
        // writer at a time (see the doc), and a race only numbers a record twice.
        unsafe {
            let current = *slot;
            if write {
                (*slot).next_write = current.next_write.wrapping_add(1);
                return (current.next_write, current.lost_heads);
            }
            (*slot).next_read = current.next_read.wrapping_add(1);
            return (current.next_read, current.lost_heads);
        }
    }
    let fresh = ConnSeq {
        next_write: u32::from(write),
        lost_heads: 0,
        next_read: u32::from(!write),
        _pad: 0,
    };
    let _ = CONN_SEQ.insert(key, fresh, 0);
    (0, 0)
}

/// A new connection on this fd (accept): both directions number from 0.
#[inline(always)]
pub fn reset(key: u64) {
    if let Some(slot) = slot_seq(key) {
        // SAFETY: a valid map value pointer from the lookup.
        unsafe { *slot = ConnSeq::default() };
        return;
    }
    let fresh = ConnSeq {
        next_write: 0,
        lost_heads: 0,
        next_read: 0,
        _pad: 0,
    };
    let _ = CONN_SEQ.insert(key, fresh, 0);
}

/// The fd's next write and read numbers and its lost-head count, for its close record.
#[inline(always)]
pub fn next(key: u64) -> (u32, u32, u32) {
    match slot_seq(key).or_else(|| CONN_SEQ.get_ptr_mut(key)) {
        // SAFETY: a map value pointer from the lookups; the value is copied out at once.
        Some(seq) => unsafe { ((*seq).next_write, (*seq).next_read, (*seq).lost_heads) },
        None => (0, 0, 0),
    }
}

/// The record taken with [`take`] did not fit in the ring buffer.
#[inline(always)]
pub fn lost(key: u64, head: bool) {
    if !head {
        return;
    }
    if let Some(slot) = slot_seq(key).or_else(|| CONN_SEQ.get_ptr_mut(key)) {
        // SAFETY: as in `take`.
        unsafe { (*slot).lost_heads = (*slot).lost_heads.wrapping_add(1) };
    }
}

/// The fd closed: its next connection starts numbering afresh even without an accept (one in
/// the slot: the slot's next holder starts at 0).
#[inline(always)]
pub fn forget(key: u64) {
    let _ = CONN_SEQ.remove(key);
}
