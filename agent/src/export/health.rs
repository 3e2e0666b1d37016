//! What the kubelet's probes ask (`/readyz`, `/healthz` beside `/metrics`): is the capture loop
//! running, and has it made its first pass (the engines running at start discovered and
//! attached)? A surge roll hands the node over only once the new agent is ready, so ready must
//! mean attached, not just listening.
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use inferscope_model::clock::monotonic_now_ns;

/// A capture loop that has not passed for this long is wedged (it passes at least every 50 ms
/// when healthy; attaching to a large engine can hold it for seconds).
pub(crate) const STALL: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The capture loop's last pass (monotonic ns); 0 before its first.
    last_pass_ns: AtomicU64,
}

impl Health {
    /// Called on every pass of the capture loop.
    pub(crate) fn pass(&self) {
        self.last_pass_ns
            .store(monotonic_now_ns(), Ordering::Relaxed);
    }

    /// Live: the loop passed within [`STALL`] (or has not started yet: loading the programs).
    pub(crate) fn live(&self, now_ns: u64) -> bool {
        let last = self.last_pass_ns.load(Ordering::Relaxed);
        last == 0 || now_ns.saturating_sub(last) < stall_ns()
    }

    /// Ready: the loop has made its first pass and is live.
    pub(crate) fn ready(&self, now_ns: u64) -> bool {
        self.last_pass_ns.load(Ordering::Relaxed) != 0 && self.live(now_ns)
    }
}

fn stall_ns() -> u64 {
    u64::try_from(STALL.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_after_the_first_pass_and_not_live_once_the_loop_stalls() {
        let health = Health::default();
        let now = monotonic_now_ns();
        assert!(health.live(now) && !health.ready(now));
        health.pass();
        let now = monotonic_now_ns();
        assert!(health.live(now) && health.ready(now));
        let later = now + stall_ns() + 1;
        assert!(!health.live(later) && !health.ready(later));
    }
}
