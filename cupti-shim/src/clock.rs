//! Puts CUPTI's GPU timestamps on CLOCK_MONOTONIC, the clock eBPF's `bpf_ktime_get_ns` uses.
//!
//! Preferred: CUPTI calls [`monotonic_now_ns`] for every timestamp it takes (registered with
//! `cuptiActivityRegisterTimestampCallback` before any activity is enabled), so no conversion is
//! needed. Where CUPTI refuses the callback, the offset between `cuptiGetTimestamp` and
//! CLOCK_MONOTONIC is measured (bracketed by two monotonic reads, the tightest of several tries
//! kept) and re-measured periodically by the sender thread.
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use cudarc::cupti::sys;
use inferscope_model::clock::monotonic_now_ns;

/// The callback CUPTI calls for every timestamp. Safe: it takes nothing and reads a clock.
pub(crate) extern "C" fn timestamp_callback() -> u64 {
    monotonic_now_ns()
}

pub(crate) struct Clock {
    callback: AtomicBool,
    offset_ns: AtomicI64,
}

impl Clock {
    pub(crate) const fn new() -> Self {
        Clock {
            callback: AtomicBool::new(false),
            offset_ns: AtomicI64::new(0),
        }
    }

    /// Registers the timestamp callback; on refusal falls back to offset calibration.
    pub(crate) fn setup(&self) {
        // SAFETY: plain FFI call with a valid function pointer.
        let rc = unsafe { sys::cuptiActivityRegisterTimestampCallback(Some(timestamp_callback)) };
        if rc == sys::CUptiResult::CUPTI_SUCCESS {
            self.callback.store(true, Ordering::Relaxed);
        } else {
            self.calibrate();
        }
    }

    pub(crate) fn source(&self) -> &'static str {
        if self.callback.load(Ordering::Relaxed) {
            "timestamp_callback"
        } else {
            "offset_calibration"
        }
    }

    pub(crate) fn uses_callback(&self) -> bool {
        self.callback.load(Ordering::Relaxed)
    }

    /// Measures CUPTI's clock against CLOCK_MONOTONIC; no-op when the callback is in use.
    pub(crate) fn calibrate(&self) {
        if self.uses_callback() {
            return;
        }
        let mut best: Option<(u64, i64)> = None;
        for _ in 0..5 {
            let before = monotonic_now_ns();
            let mut gpu = 0u64;
            // SAFETY: valid out-pointer.
            let rc = unsafe { sys::cuptiGetTimestamp(&mut gpu) };
            let after = monotonic_now_ns();
            if rc != sys::CUptiResult::CUPTI_SUCCESS {
                return;
            }
            let width = after.saturating_sub(before);
            let offset = (before + width / 2) as i64 - gpu as i64;
            if best.is_none_or(|(w, _)| width < w) {
                best = Some((width, offset));
            }
        }
        if let Some((_, offset)) = best {
            self.offset_ns.store(offset, Ordering::Relaxed);
        }
    }

    /// A CUPTI timestamp on CLOCK_MONOTONIC; 0 stays 0 (CUPTI's "unknown").
    pub(crate) fn to_mono(&self, t: u64) -> u64 {
        if t == 0 {
            return 0;
        }
        (t as i64)
            .saturating_add(self.offset_ns.load(Ordering::Relaxed))
            .max(0) as u64
    }
}
