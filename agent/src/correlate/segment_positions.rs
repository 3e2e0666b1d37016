//! Where each TCP segment of a connection lies in the bytes the server read: for a protocol
//! whose one read may carry several requests (HTTP/2 streams), the segment that carried a
//! request is the one holding its first byte, not the n-th of the read.
//!
//! The reads give the positions (a read of `n` bytes covers the next `n` of the client's byte
//! stream), the segments their sizes (tcp:tcp_probe's payload length). A read consumes the
//! segments that arrived before it in order; one it did not consume whole is carried to the
//! next. Where the segments seen do not cover a read (one was lost or swept), the gap is
//! marked unknown and the segments seen are laid at the read's end, which they reached last.
//! Only for bytes that are the wire's own: TLS plaintext has other sizes than its segments.
use std::collections::VecDeque;

use super::arrivals::Arrival;

/// Segments placed per connection: far more than the streams a connection has open.
const MAX_PLACED: usize = 4096;
/// Segments carried, unread, to the next read.
const MAX_CARRIED: usize = 64;

#[derive(Debug, Default)]
pub(super) struct SegmentPositions {
    /// (position of the segment's first byte, its arrival; None for bytes whose segments are
    /// unknown), in position order.
    placed: VecDeque<(u64, Option<u64>)>,
    /// Bytes of the last placed segment no read has consumed yet.
    carried_bytes: u64,
    /// Segments no read has reached yet.
    carried: Vec<Arrival>,
}

impl SegmentPositions {
    /// A read of `len` bytes starting at `start` in the client's byte stream, with the
    /// segments that arrived since the previous read (oldest first).
    pub(super) fn on_read(&mut self, start: u64, len: u64, arrived: &[Arrival]) {
        let end = start.saturating_add(len);
        let from_last = self.carried_bytes.min(len);
        self.carried_bytes -= from_last;
        let mut queue = std::mem::take(&mut self.carried);
        queue.extend_from_slice(arrived);
        if self.carried_bytes > 0 {
            // The read ended inside the segment the previous one began.
            self.carry(queue);
            return;
        }
        let mut at = start + from_last;
        let total: u64 = queue.iter().map(|a| u64::from(a.len)).sum();
        if at.saturating_add(total) < end {
            // Segments of this read were not seen: their bytes' arrival is unknown.
            self.place(at, None);
            at = end - total;
        }
        let mut rest = queue.into_iter();
        for a in rest.by_ref() {
            if a.len == 0 {
                continue;
            }
            self.place(at, Some(a.ts_ns));
            at = at.saturating_add(u64::from(a.len));
            if at >= end {
                self.carried_bytes = at - end;
                break;
            }
        }
        self.carry(rest.collect());
    }

    /// Positions are no longer known (a loss of unknown size): nothing placed before applies
    /// to what follows.
    pub(super) fn reset(&mut self) {
        self.placed.clear();
        self.carried_bytes = 0;
        self.carried.clear();
    }

    /// When the segment holding byte `pos` of the client's stream arrived.
    pub(super) fn arrival_of(&self, pos: u64) -> Option<u64> {
        let i = self.placed.partition_point(|(start, _)| *start <= pos);
        self.placed.get(i.checked_sub(1)?)?.1
    }

    fn place(&mut self, at: u64, arrival: Option<u64>) {
        if self.placed.back().is_some_and(|(last, _)| *last == at) {
            self.placed.pop_back();
        }
        if self.placed.len() >= MAX_PLACED {
            self.placed.pop_front();
        }
        self.placed.push_back((at, arrival));
    }

    fn carry(&mut self, mut segments: Vec<Arrival>) {
        if segments.len() > MAX_CARRIED {
            segments.drain(..segments.len() - MAX_CARRIED);
        }
        self.carried = segments;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(ts_ns: u64, len: u32) -> Arrival {
        Arrival { ts_ns, len }
    }

    #[test]
    fn each_byte_maps_to_the_segment_that_carried_it() {
        let mut p = SegmentPositions::default();
        // One read of three segments: 24 bytes of preface, then two calls of 100 and 60.
        p.on_read(0, 184, &[seg(10, 24), seg(20, 100), seg(30, 60)]);
        assert_eq!(p.arrival_of(0), Some(10));
        assert_eq!(p.arrival_of(24), Some(20));
        assert_eq!(p.arrival_of(123), Some(20));
        assert_eq!(p.arrival_of(124), Some(30));
        // A read that took only part of a segment: the rest opens the next read.
        p.on_read(184, 50, &[seg(40, 80)]);
        p.on_read(234, 50, &[seg(50, 20)]);
        assert_eq!(p.arrival_of(233), Some(40));
        assert_eq!(p.arrival_of(263), Some(40), "the carried 30 bytes");
        assert_eq!(p.arrival_of(264), Some(50));
        // A read inside one segment, and a segment that arrived during a read that did not
        // reach it: carried whole.
        p.on_read(284, 10, &[seg(60, 40), seg(70, 5)]);
        p.on_read(294, 35, &[]);
        assert_eq!(p.arrival_of(323), Some(60));
        assert_eq!(p.arrival_of(324), Some(70));
    }

    #[test]
    fn bytes_of_unseen_segments_are_unknown() {
        let mut p = SegmentPositions::default();
        // 300 bytes read, 100 of them in segments seen: those are the read's last.
        p.on_read(0, 300, &[seg(50, 100)]);
        assert_eq!(p.arrival_of(0), None);
        assert_eq!(p.arrival_of(199), None);
        assert_eq!(p.arrival_of(200), Some(50));
        p.on_read(300, 10, &[]);
        assert_eq!(p.arrival_of(305), None);
        p.reset();
        assert_eq!(p.arrival_of(200), None);
    }

    #[test]
    fn memory_is_bounded() {
        let mut p = SegmentPositions::default();
        for i in 0..(2 * MAX_PLACED as u64) {
            p.on_read(i * 10, 10, &[seg(i, 10)]);
        }
        assert_eq!(p.placed.len(), MAX_PLACED);
        let many: Vec<_> = (0..1000).map(|i| seg(i, 100)).collect();
        p.on_read(1_000_000, 10, &many);
        assert!(p.carried.len() <= MAX_CARRIED);
    }
}
