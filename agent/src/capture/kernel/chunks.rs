//! Joins the chunk records of one large send or receive back into one syscall event. For
//! processes with large captures (engine IPC: `LARGE_CAPTURE` in the eBPF crate) the kernel
//! splits a syscall that moved more than one record holds into a first record flagged `more`
//! and chunk records, all from the same thread, in order. Records of other threads may come in
//! between; a chunk lost to a full ring buffer leaves a gap, and what was joined so far goes on
//! as a truncated event (counted), never as bytes in the wrong place.
use inferscope_model::{Counter, Stats};
use rustc_hash::FxHashMap;

use crate::capture::kernel::records::SyscallEvent;

/// Syscalls being joined at once (one per thread); beyond this the oldest goes on as is.
const MAX_PENDING: usize = 256;

/// A joined syscall: its event (payload empty) and its bytes.
pub(crate) struct Joined {
    pub event: SyscallEvent<'static>,
    pub payload: Vec<u8>,
}

impl Joined {
    pub(crate) fn event(&self) -> SyscallEvent<'_> {
        let mut ev = self.event;
        ev.payload = &self.payload;
        ev.truncated = (self.payload.len() as i64) < ev.ret;
        ev
    }
}

#[derive(Default)]
pub(crate) struct Chunks {
    pending: FxHashMap<u32, (u64, Joined)>,
    arrivals: u64,
    pub stats: Stats,
}

fn owned(ev: &SyscallEvent<'_>) -> Joined {
    Joined {
        event: SyscallEvent {
            payload: &[],
            more: false,
            chunk_offset: None,
            ..*ev
        },
        payload: ev.payload.to_vec(),
    }
}

impl Chunks {
    /// Takes one syscall record. A plain record comes back to be handled as is; joined
    /// syscalls that are complete (or cut short) are pushed to `done` and come first, since
    /// they happened before it.
    pub(crate) fn push<'a>(
        &mut self,
        ev: SyscallEvent<'a>,
        done: &mut Vec<Joined>,
    ) -> Option<SyscallEvent<'a>> {
        if self.pending.is_empty() && !ev.more && ev.chunk_offset.is_none() {
            return Some(ev);
        }
        match ev.chunk_offset {
            None => {
                // A new syscall of this thread: one still open lost its last chunks.
                if let Some((_, cut)) = self.pending.remove(&ev.tid) {
                    self.stats.bump(Counter::CaptureChunksLost);
                    done.push(cut);
                }
                if !ev.more {
                    return Some(ev);
                }
                if self.pending.len() >= MAX_PENDING
                    && let Some(oldest) = self
                        .pending
                        .iter()
                        .min_by_key(|(_, (n, _))| *n)
                        .map(|(tid, _)| *tid)
                    && let Some((_, cut)) = self.pending.remove(&oldest)
                {
                    self.stats.bump(Counter::CaptureChunksLost);
                    done.push(cut);
                }
                self.arrivals += 1;
                tracing::debug!(
                    tid = ev.tid,
                    fd = ev.fd,
                    kind = ?ev.kind,
                    bytes = ev.ret,
                    "syscall captured in chunks"
                );
                self.pending.insert(ev.tid, (self.arrivals, owned(&ev)));
                self.stats.bump(Counter::CaptureChunkedSyscalls);
                None
            }
            Some(offset) => {
                let Some((_, joined)) = self.pending.get_mut(&ev.tid) else {
                    // Its first record was lost.
                    self.stats.bump(Counter::CaptureChunksOrphaned);
                    return None;
                };
                let in_place = joined.payload.len() as u64 == u64::from(offset)
                    && joined.event.fd == ev.fd
                    && joined.event.ts_enter_ns == ev.ts_enter_ns;
                if in_place {
                    joined.payload.extend_from_slice(ev.payload);
                } else {
                    self.stats.bump(Counter::CaptureChunksLost);
                }
                if (!in_place || !ev.more)
                    && let Some((_, joined)) = self.pending.remove(&ev.tid)
                {
                    done.push(joined);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use inferscope_common::SyscallKind;

    use super::*;

    fn rec(tid: u32, payload: &[u8], more: bool, offset: Option<u32>) -> SyscallEvent<'_> {
        SyscallEvent {
            kind: SyscallKind::Write,
            tgid: 1,
            tid,
            fd: 7,
            ts_enter_ns: 100,
            ts_exit_ns: 200,
            ret: 10,
            truncated: true,
            copy_failed: false,
            conn_gen: 0,
            conn_flags: 0,
            sock: 0,
            conn_seq: None,
            read_seq: None,
            lost_heads: 0,
            payload,
            more,
            chunk_offset: offset,
            token: false,
        }
    }

    #[test]
    fn chunks_of_one_thread_join_around_other_threads_records() {
        let mut c = Chunks::default();
        let mut done = Vec::new();
        assert!(c.push(rec(1, b"0123", true, None), &mut done).is_none());
        // Another thread's plain record passes through.
        assert!(c.push(rec(2, b"x", false, None), &mut done).is_some());
        assert!(c.push(rec(1, b"4567", true, Some(4)), &mut done).is_none());
        assert!(c.push(rec(1, b"89", false, Some(8)), &mut done).is_none());
        assert_eq!(done.len(), 1);
        let ev = done[0].event();
        assert_eq!(ev.payload, b"0123456789");
        assert!(!ev.truncated);
        assert_eq!(ev.lost_bytes(), 0);
    }

    #[test]
    fn a_lost_chunk_cuts_the_syscall_short_and_is_counted() {
        let mut c = Chunks::default();
        let mut done = Vec::new();
        c.push(rec(1, b"0123", true, None), &mut done);
        // The chunk at 4 was lost: the one at 8 does not fit.
        c.push(rec(1, b"89", false, Some(8)), &mut done);
        assert_eq!(done.len(), 1);
        let ev = done[0].event();
        assert_eq!(ev.payload, b"0123");
        assert!(ev.truncated);
        assert_eq!(ev.lost_bytes(), 6);
        assert_eq!(c.stats.get(Counter::CaptureChunksLost), 1);
        // The last chunk lost: the thread's next syscall flushes what was joined.
        done.clear();
        c.push(rec(1, b"0123", true, None), &mut done);
        let next = c.push(rec(1, b"abc", false, None), &mut done);
        assert!(next.is_some());
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].event().payload, b"0123");
        // A chunk whose first record is gone is dropped.
        done.clear();
        assert!(c.push(rec(3, b"zz", false, Some(8)), &mut done).is_none());
        assert!(done.is_empty());
        assert_eq!(c.stats.get(Counter::CaptureChunksOrphaned), 1);
    }

    #[test]
    fn the_pending_table_is_bounded() {
        let mut c = Chunks::default();
        let mut done = Vec::new();
        for tid in 0..(MAX_PENDING as u32 + 10) {
            c.push(rec(tid, b"0123", true, None), &mut done);
        }
        assert!(c.pending.len() <= MAX_PENDING);
        assert_eq!(done.len(), 10);
    }
}
