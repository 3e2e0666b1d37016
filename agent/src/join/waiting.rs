//! The join's one queue. A finished record waits here for what it still lacks, in this order:
//! its engine's word (IPC), its decode leg (a P/D proxy's record), the kernel records of its
//! steps; one deadline per record (its arrival here plus the join's wait) ends every wait. The
//! queue holds at most `capacity` records after each pass: beyond it the oldest go on at once,
//! counted (`join_records_released_early`).
use std::collections::VecDeque;

use inferscope_model::{Counter, RequestRecord, Stats};

use super::{EngineMetrics, RequestTimeline, disagg::Stitcher, timeline::TimelineBuilder};
use crate::engines::EngineWord;

/// What a record still waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaits {
    /// Its engine may still tell of it over IPC.
    Engine,
    /// A P/D proxy's record: the decode leg it relayed.
    DecodeLeg,
    /// Kernel records of its steps, from process `gpu_pid`'s shim.
    Kernels { gpu_pid: u32 },
}

struct Entry {
    deadline_ns: u64,
    awaits: Awaits,
    /// Counted once as held for its engine.
    held_for_engine: bool,
    record: RequestRecord,
}

/// The components a record is joined with on its way out, borrowed for one pass.
pub(super) struct Parts<'a> {
    pub engine: &'a mut dyn EngineWord,
    pub stitcher: &'a mut Stitcher,
    pub engine_metrics: &'a EngineMetrics,
    pub timelines: &'a mut TimelineBuilder,
    pub stats: &'a mut Stats,
}

pub(super) struct Waiting {
    entries: VecDeque<Entry>,
    capacity: usize,
    wait_ns: u64,
}

impl Waiting {
    pub(super) fn new(capacity: usize, wait_ns: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            capacity,
            wait_ns,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn push(&mut self, record: RequestRecord, now_ns: u64) {
        self.entries.push_back(Entry {
            deadline_ns: now_ns.saturating_add(self.wait_ns),
            awaits: Awaits::Engine,
            held_for_engine: false,
            record,
        });
    }

    /// Moves every record as far as it can go; the finished ones' timelines go to `out`. Two
    /// passes: the decode legs released in the first reach the stitcher before the proxy
    /// records that relayed them are tried again.
    pub(super) fn advance(
        &mut self,
        now_ns: u64,
        flush: bool,
        parts: &mut Parts<'_>,
        out: &mut Vec<RequestTimeline>,
    ) {
        let over = self.entries.len().saturating_sub(self.capacity);
        for entry in self.entries.iter_mut().take(over) {
            entry.deadline_ns = 0;
            parts.stats.bump(Counter::JoinRecordsReleasedEarly);
        }
        for proxies in [false, true] {
            let mut kept = VecDeque::with_capacity(self.entries.len());
            for entry in self.entries.drain(..) {
                let pass = Pass {
                    now_ns,
                    flush,
                    expired: flush || now_ns >= entry.deadline_ns,
                    proxies,
                };
                if let Some(entry) = pass.run(entry, parts, out) {
                    kept.push_back(entry);
                }
            }
            self.entries = kept;
        }
    }
}

struct Pass {
    now_ns: u64,
    flush: bool,
    expired: bool,
    /// Whether proxy records are tried (the second pass).
    proxies: bool,
}

impl Pass {
    /// Takes `entry` through every wait it no longer needs; the entry back while it still
    /// waits, None once its timeline went to `out`.
    fn run(
        &self,
        mut entry: Entry,
        parts: &mut Parts<'_>,
        out: &mut Vec<RequestTimeline>,
    ) -> Option<Entry> {
        loop {
            match entry.awaits {
                Awaits::Engine => {
                    let told = !parts.engine.awaits_engine(&entry.record);
                    if !told && !self.expired {
                        if !entry.held_for_engine {
                            entry.held_for_engine = true;
                            parts.stats.bump(Counter::RecordsHeldForEngine);
                        }
                        return Some(entry);
                    }
                    if !told && !self.flush {
                        parts.stats.bump(Counter::RecordsHeldForEngineUntold);
                    }
                    // A leg's phases come from its engine's stamps: enriched before the stitch.
                    parts.engine.enrich(&mut entry.record);
                    entry.awaits = if parts.stitcher.stitch_record(&mut entry.record) {
                        kernels_of(&mut entry.record, parts)
                    } else {
                        Awaits::DecodeLeg
                    };
                }
                Awaits::DecodeLeg => {
                    if !self.proxies || !parts.stitcher.retry_proxy(&mut entry.record, self.expired)
                    {
                        return Some(entry);
                    }
                    entry.awaits = kernels_of(&mut entry.record, parts);
                }
                Awaits::Kernels { gpu_pid } => {
                    if !self.expired
                        && parts
                            .timelines
                            .awaits_kernels(gpu_pid, &entry.record, self.now_ns)
                    {
                        return Some(entry);
                    }
                    out.push(parts.timelines.build(entry.record, self.now_ns));
                    return None;
                }
            }
        }
    }
}

/// The record is stitched: it gets the engine state at its arrival, and waits for the kernels
/// of the process that ran it.
fn kernels_of(record: &mut RequestRecord, parts: &mut Parts<'_>) -> Awaits {
    parts.engine_metrics.annotate(record);
    Awaits::Kernels {
        gpu_pid: parts.timelines.gpu_pid_of(record),
    }
}
