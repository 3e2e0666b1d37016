use inferscope_common::Counter;

use crate::maps::COUNTERS;

#[inline(always)]
pub fn bump(counter: Counter) {
    add(counter, 1);
}

#[inline(always)]
pub fn add(counter: Counter, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a valid map value pointer from the lookup, and a per-CPU slot: no other writer
        // can race with us.
        unsafe { *slot += n };
    }
}
