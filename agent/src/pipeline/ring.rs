//! Reading the ring buffer: the kernel side (`SocketProbes`), the records it hands over parsed
//! and typed, large syscalls joined again from their chunks, and what reading costs.
use inferscope_common::Counter as KernelCounter;
use inferscope_model::{Counter, Stats};

use crate::capture::{
    CapturedEvent, SocketProbes, SyscallEvent,
    kernel::{
        chunks::{Chunks, Joined},
        records,
    },
};

/// Records read in one drain at most, so discovery and shutdown still run under a flood.
const MAX_RECORDS_PER_DRAIN: u32 = 1_000_000;

/// One thing read from the ring, for the pipeline to hand on.
pub(super) enum Read<'a> {
    /// A record that is not a socket syscall (scheduler, GPU, adoption, TCP state).
    Event(CapturedEvent<'a>),
    /// A socket syscall: as the kernel wrote it, joined from its chunks, one token event of a
    /// batch, or one the kernel kept aside (lost closes, token events still waiting at exit).
    Syscall(SyscallEvent<'a>),
    /// The kernel dropped records (ring buffer full) before the ones that follow.
    Lost,
}

/// Whether the drain goes on after a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Go,
    /// A process the kernel adopted wants attaching before its records (they stay in the ring).
    Stop,
}

pub(super) struct Ring {
    pub probes: SocketProbes,
    chunks: Chunks,
    /// Kernel ring-buffer drops seen so far.
    drops_seen: u64,
    records_read: u64,
    /// Bytes those records took, the ring's 8-byte record header and padding included: what
    /// sizing the ring is about.
    bytes_read: u64,
    /// The agent is stopping: a drain also takes the token events the kernel still holds.
    pub last_drain: bool,
    stats: Stats,
}

impl Ring {
    pub(super) fn new(probes: SocketProbes) -> Self {
        Self {
            probes,
            chunks: Chunks::default(),
            drops_seen: 0,
            records_read: 0,
            bytes_read: 0,
            last_drain: false,
            stats: Stats::default(),
        }
    }

    /// Reads the ring until it is empty (then what the kernel kept aside), `visit` says stop,
    /// or [`MAX_RECORDS_PER_DRAIN`].
    pub(super) fn read(&mut self, visit: &mut dyn FnMut(Read<'_>) -> Flow) {
        let mut joined: Vec<Joined> = Vec::new();
        for n in 0..MAX_RECORDS_PER_DRAIN {
            // A drop happened before the records that follow it: look before reading them.
            if n % 1024 == 0 {
                let drops = self.probes.counter(KernelCounter::RingbufFull);
                if drops > self.drops_seen {
                    self.drops_seen = drops;
                    visit(Read::Lost);
                }
            }
            let Some(item) = self.probes.events().next() else {
                self.read_kept_aside(visit);
                return;
            };
            self.records_read += 1;
            self.bytes_read += (item.len() as u64 + 8).next_multiple_of(8);
            let flow = match records::parse(&item) {
                Err(e) => {
                    self.stats.bump(e.counter());
                    Flow::Go
                }
                Ok(CapturedEvent::Syscall(ev)) => {
                    let plain = self.chunks.push(ev, &mut joined);
                    for whole in joined.drain(..) {
                        visit(Read::Syscall(whole.event()));
                    }
                    plain.map_or(Flow::Go, |ev| visit(Read::Syscall(ev)))
                }
                // Token events are never chunks of a larger capture: each goes on as it would
                // have in a record of its own.
                Ok(CapturedEvent::TokenBatch(batch)) => {
                    for ev in batch.events() {
                        visit(Read::Syscall(ev));
                    }
                    Flow::Go
                }
                Ok(event) => visit(Read::Event(event)),
            };
            if flow == Flow::Stop {
                return;
            }
        }
    }

    /// Read empty: the closes the ring had no room for come after every record of their
    /// connections that it kept; at the last drain, so do the streams' last token events,
    /// still waiting in the kernel (they took no record number).
    fn read_kept_aside(&mut self, visit: &mut dyn FnMut(Read<'_>) -> Flow) {
        if self.last_drain {
            for bytes in self.probes.waiting_token_batches() {
                if let Ok(CapturedEvent::TokenBatch(batch)) = records::parse(&bytes) {
                    for mut ev in batch.events() {
                        ev.conn_seq = None;
                        self.stats.bump(Counter::TokenEventsTakenAtExit);
                        visit(Read::Syscall(ev));
                    }
                }
            }
        }
        let lost_closes = self.probes.take_lost_closes();
        self.stats
            .add(Counter::ClosesRecovered, lost_closes.len() as u64);
        for bytes in lost_closes {
            if let Ok(CapturedEvent::Syscall(ev)) = records::parse(&bytes) {
                visit(Read::Syscall(ev));
            }
        }
    }

    /// The kernel side's counters (`kernel_*`) and reading's.
    pub(super) fn counters(&self) -> Vec<(Counter, u64)> {
        let mut all = self.probes.counters();
        all.extend(self.stats.iter());
        all.extend(self.chunks.stats.iter());
        all.push((Counter::RingbufRecords, self.records_read));
        all.push((Counter::RingbufBytes, self.bytes_read));
        all
    }
}
