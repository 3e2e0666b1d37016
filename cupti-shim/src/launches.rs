//! What the launching thread records: correlation id → (thread, host time, API). Written from CUPTI
//! callbacks on the engine's own threads, so it takes no lock and allocates nothing: a fixed ring of
//! slots indexed by correlation id, each guarded by a seqlock-style id check. A slot overwritten
//! before its kernel record arrives (more than `SLOTS` launches behind) reads as a miss.
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};

const SLOTS: usize = 1 << 16;

/// Launch APIs the shim subscribes to; the index is what a slot stores.
pub(crate) const API_NAMES: &[&str] = &[
    "unknown",
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC",
    "cudaLaunchKernelExC_ptsz",
    "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernel_ptsz",
    "cudaGraphLaunch",
    "cudaGraphLaunch_ptsz",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Launch {
    pub tid: u32,
    pub mono_ns: u64,
    pub api: u8,
}

struct Slot {
    correlation: AtomicU32,
    tid: AtomicU32,
    api: AtomicU8,
    mono_ns: AtomicU64,
}

pub(crate) struct LaunchTable {
    slots: Box<[Slot]>,
}

impl LaunchTable {
    pub(crate) fn new() -> Self {
        let slots = (0..SLOTS)
            .map(|_| Slot {
                correlation: AtomicU32::new(0),
                tid: AtomicU32::new(0),
                api: AtomicU8::new(0),
                mono_ns: AtomicU64::new(0),
            })
            .collect();
        LaunchTable { slots }
    }

    pub(crate) fn record(&self, correlation: u32, launch: Launch) {
        let slot = &self.slots[correlation as usize & (SLOTS - 1)];
        slot.correlation.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.tid.store(launch.tid, Ordering::Relaxed);
        slot.api.store(launch.api, Ordering::Relaxed);
        slot.mono_ns.store(launch.mono_ns, Ordering::Relaxed);
        slot.correlation.store(correlation, Ordering::Release);
    }

    pub(crate) fn get(&self, correlation: u32) -> Option<Launch> {
        if correlation == 0 {
            return None;
        }
        let slot = &self.slots[correlation as usize & (SLOTS - 1)];
        if slot.correlation.load(Ordering::Acquire) != correlation {
            return None;
        }
        let launch = Launch {
            tid: slot.tid.load(Ordering::Relaxed),
            api: slot.api.load(Ordering::Relaxed),
            mono_ns: slot.mono_ns.load(Ordering::Relaxed),
        };
        fence(Ordering::Acquire);
        (slot.correlation.load(Ordering::Relaxed) == correlation).then_some(launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_overwrites() {
        let t = LaunchTable::new();
        let l = Launch {
            tid: 7,
            mono_ns: 42,
            api: 1,
        };
        t.record(5, l);
        assert_eq!(t.get(5), Some(l));
        assert_eq!(t.get(6), None);
        assert_eq!(t.get(0), None);
        // Same slot, newer launch: the old id misses instead of reading the wrong launch.
        t.record(5 + SLOTS as u32, l);
        assert_eq!(t.get(5), None);
        assert_eq!(t.get(5 + SLOTS as u32), Some(l));
    }
}
