//! One ZMTP frame as it is assembled: a bounded copy of its body and how much is still due.

/// A frame body: the kept bytes (at most the stream's `max_frame_keep`) and its declared size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub data: Vec<u8>,
    /// The size the frame header declared.
    pub size: u64,
    /// Whether `data` is the whole body (nothing lost, nothing beyond the keep limit).
    pub complete: bool,
}

/// A multipart message: its frames in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub frames: Vec<Frame>,
}

#[derive(Debug)]
pub(super) struct Partial {
    flags: u8,
    size: u64,
    remaining: u64,
    data: Vec<u8>,
    keep: usize,
    lost: bool,
}

impl Partial {
    pub(super) fn new(flags: u8, size: u64, keep: usize) -> Self {
        Self {
            flags,
            size,
            remaining: size,
            // Capacity grows with the bytes that really arrive, never from the declared size.
            data: Vec::new(),
            keep,
            lost: false,
        }
    }

    pub(super) fn flags(&self) -> u8 {
        self.flags
    }

    pub(super) fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Takes this frame's bytes from the front of `data`; returns how many it took.
    pub(super) fn push(&mut self, data: &[u8]) -> usize {
        let n = (self.remaining.min(data.len() as u64)) as usize;
        let room = self.keep.saturating_sub(self.data.len());
        let kept = n.min(room);
        self.data.extend_from_slice(&data[..kept]);
        if kept < n {
            self.lost = true;
        }
        self.remaining -= n as u64;
        n
    }

    /// Bytes of this frame that were not captured.
    pub(super) fn skip(&mut self, n: u64) {
        if n > 0 {
            self.lost = true;
        }
        self.remaining = self.remaining.saturating_sub(n);
    }

    pub(super) fn into_frame(self) -> Frame {
        Frame {
            complete: !self.lost && self.data.len() as u64 == self.size,
            data: self.data,
            size: self.size,
        }
    }
}
