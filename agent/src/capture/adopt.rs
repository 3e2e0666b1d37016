//! Engines restarted on their port. The kernel traces a process from its first accept on a
//! watched port (`adopt` in the eBPF programs), so the requests a new engine answers before the
//! /proc rescan finds it are followed from their accept; user space then rescans at once. For
//! that, the ports of an engine that exited stay watched a while: its successor usually listens
//! on the same port within seconds.
use std::time::{Duration, Instant};

/// How long the port of an exited engine stays watched for a successor.
pub const PORT_GRACE: Duration = Duration::from_secs(120);
/// Ports of exited engines kept watched at once; the oldest goes first.
pub const MAX_KEPT_PORTS: usize = 256;
/// Processes the kernel adopted that discovery has not looked at yet.
pub const MAX_PENDING: usize = 64;

#[derive(Default)]
pub struct Adoption {
    /// Ports of exited engines, with when the engine went.
    kept: Vec<(u16, Instant)>,
    /// Processes the kernel adopted, awaiting the rescan that attaches them.
    pending: Vec<u32>,
}

impl Adoption {
    /// An engine that served `port` exited: the port stays watched. Returns a port that no
    /// longer fits (the oldest), for the caller to stop watching.
    pub fn keep(&mut self, port: u16, now: Instant) -> Option<u16> {
        self.kept.retain(|(p, _)| *p != port);
        let evicted = (self.kept.len() >= MAX_KEPT_PORTS).then(|| self.kept.remove(0).0);
        self.kept.push((port, now));
        evicted
    }

    /// A traced process serves `port` again: it is no longer kept for a successor.
    pub fn taken(&mut self, port: u16) {
        self.kept.retain(|(p, _)| *p != port);
    }

    /// Ports kept longer than [`PORT_GRACE`], no longer kept.
    pub fn expired(&mut self, now: Instant) -> Vec<u16> {
        let mut gone = Vec::new();
        self.kept.retain(|(port, since)| {
            let keep = now.duration_since(*since) < PORT_GRACE;
            if !keep {
                gone.push(*port);
            }
            keep
        });
        gone
    }

    /// The kernel adopted `tgid`. False when too many wait already: the caller stops tracing
    /// it (and counts that) and discovery attaches it at its next scan.
    pub fn adopted(&mut self, tgid: u32) -> bool {
        if self.pending.contains(&tgid) {
            return true;
        }
        if self.pending.len() >= MAX_PENDING {
            return false;
        }
        self.pending.push(tgid);
        true
    }

    /// Adopted processes for the rescan to settle.
    pub fn take_pending(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_stay_kept_for_the_grace_then_expire() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        assert_eq!(a.keep(8080, t0), None);
        assert!(a.expired(t0 + PORT_GRACE / 2).is_empty());
        assert_eq!(a.expired(t0 + PORT_GRACE), vec![8080]);
        assert!(a.expired(t0 + PORT_GRACE * 2).is_empty());
    }

    #[test]
    fn a_port_served_again_is_no_longer_kept() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        a.keep(8080, t0);
        a.taken(8080);
        assert!(a.expired(t0 + PORT_GRACE).is_empty());
    }

    #[test]
    fn kept_ports_are_bounded_oldest_first() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        for port in 0..MAX_KEPT_PORTS as u16 {
            assert_eq!(a.keep(port, t0), None);
        }
        assert_eq!(a.keep(9999, t0), Some(0));
        // Keeping a port again refreshes it without growing the list.
        assert_eq!(a.keep(9999, t0), None);
    }

    #[test]
    fn pending_adoptions_are_bounded_and_taken_once() {
        let mut a = Adoption::default();
        for pid in 0..MAX_PENDING as u32 {
            assert!(a.adopted(pid));
        }
        assert!(a.adopted(0), "a process adopted twice waits once");
        assert!(!a.adopted(100_000));
        assert_eq!(a.take_pending().len(), MAX_PENDING);
        assert!(a.take_pending().is_empty());
    }
}
