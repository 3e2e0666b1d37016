//! SIGINT/SIGTERM set a flag the pipeline polls, so it detaches its probes and flushes records.
use std::sync::atomic::{AtomicBool, Ordering};

pub(super) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub(super) fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}
