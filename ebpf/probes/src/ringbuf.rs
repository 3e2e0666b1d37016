//! Every write into the ring buffer goes through here: it counts drops, and it wakes the agent
//! only once enough data has queued (the agent also polls on a short timer), so a busy server
//! does not pay for a wake-up per record.
use aya_ebpf::bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};
use inferscope_common::Counter;

use crate::{counters::bump, maps::EVENTS};

/// Queued bytes that trigger a wake-up.
const WAKEUP_BYTES: u64 = 256 * 1024;

#[inline(always)]
fn wakeup_flag() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
pub fn output<T: ?Sized>(record: &T, counter: Counter) {
    match EVENTS.output::<T>(record, wakeup_flag()) {
        Ok(()) => bump(counter),
        Err(_) => bump(Counter::RingbufFull),
    }
}
