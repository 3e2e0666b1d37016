//! Engines restarted on their port. The kernel traces a process from its bind of (or, where
//! fexit works, its first accept on) a watched port (`adopt` in the eBPF programs), so the
//! requests a new engine answers before the /proc rescan finds it are followed from their
//! accept. User space takes its records at once (the port and the engine of the process that
//! served it before) and rescans to attach it fully. For that, the ports of an engine that
//! exited stay watched a while: its successor usually binds the same port within seconds.
use std::time::{Duration, Instant};

/// How long the port of an exited engine stays watched for a successor.
pub(crate) const PORT_GRACE: Duration = Duration::from_secs(120);
/// Ports of exited engines kept watched at once; the oldest goes first.
pub(crate) const MAX_KEPT_PORTS: usize = 256;
/// Processes the kernel adopted that discovery has not attached yet.
pub(crate) const MAX_PENDING: usize = 64;
/// How long an adopted process may wait for discovery to attach it (it binds before it listens,
/// and an engine may load its model in between) before it is traced no longer.
pub(crate) const ATTACH_WAIT: Duration = Duration::from_secs(300);

#[derive(Default)]
pub(crate) struct Adoption {
    /// Ports of exited engines, with the engine and when it went.
    kept: Vec<(u16, &'static str, Instant)>,
    /// Processes the kernel adopted, awaiting the rescan that attaches them, and since when.
    pending: Vec<(u32, Instant)>,
}

impl Adoption {
    /// An engine that served `port` exited: the port stays watched. Returns a port that no
    /// longer fits (the oldest), for the caller to stop watching.
    pub(crate) fn keep(&mut self, port: u16, engine: &'static str, now: Instant) -> Option<u16> {
        self.kept.retain(|(p, _, _)| *p != port);
        let evicted = (self.kept.len() >= MAX_KEPT_PORTS).then(|| self.kept.remove(0).0);
        self.kept.push((port, engine, now));
        evicted
    }

    /// The engine that served kept `port` last.
    pub(crate) fn engine_for(&self, port: u16) -> Option<&'static str> {
        self.kept
            .iter()
            .find(|(p, _, _)| *p == port)
            .map(|(_, engine, _)| *engine)
    }

    /// A traced process serves `port` again: it is no longer kept for a successor.
    pub(crate) fn taken(&mut self, port: u16) {
        self.kept.retain(|(p, _, _)| *p != port);
    }

    /// Ports kept longer than [`PORT_GRACE`], no longer kept.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<u16> {
        let mut gone = Vec::new();
        self.kept.retain(|(port, _, since)| {
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
    pub(crate) fn adopted(&mut self, tgid: u32, now: Instant) -> bool {
        if self.pending.iter().any(|(p, _)| *p == tgid) {
            return true;
        }
        if self.pending.len() >= MAX_PENDING {
            return false;
        }
        self.pending.push((tgid, now));
        true
    }

    /// Whether `tgid` was adopted by the kernel and discovery has not attached it yet.
    pub(crate) fn is_pending(&self, tgid: u32) -> bool {
        self.pending.iter().any(|(p, _)| *p == tgid)
    }

    /// Settles the adopted processes after a scan: those `attached` leave the list; those that
    /// waited longer than [`ATTACH_WAIT`] are returned, to be traced no longer.
    pub(crate) fn settle(&mut self, now: Instant, attached: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut given_up = Vec::new();
        self.pending.retain(|(tgid, since)| {
            if attached(*tgid) {
                return false;
            }
            if now.duration_since(*since) >= ATTACH_WAIT {
                given_up.push(*tgid);
                return false;
            }
            true
        });
        given_up
    }
}

/// A process adopted and then forgotten (given up, or gone) no longer waits to be attached.
impl inferscope_model::PerProcess for Adoption {
    fn process_gone(&mut self, tgid: u32) {
        self.pending.retain(|(p, _)| *p != tgid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_stay_kept_for_the_grace_then_expire() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        assert_eq!(a.keep(8080, "llamacpp", t0), None);
        assert_eq!(a.engine_for(8080), Some("llamacpp"));
        assert!(a.expired(t0 + PORT_GRACE / 2).is_empty());
        assert_eq!(a.expired(t0 + PORT_GRACE), vec![8080]);
        assert!(a.expired(t0 + PORT_GRACE * 2).is_empty());
    }

    #[test]
    fn a_port_served_again_is_no_longer_kept() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        a.keep(8080, "vllm", t0);
        a.taken(8080);
        assert_eq!(a.engine_for(8080), None);
        assert!(a.expired(t0 + PORT_GRACE).is_empty());
    }

    #[test]
    fn kept_ports_are_bounded_oldest_first() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        for port in 0..MAX_KEPT_PORTS as u16 {
            assert_eq!(a.keep(port, "vllm", t0), None);
        }
        assert_eq!(a.keep(9999, "vllm", t0), Some(0));
        // Keeping a port again refreshes it without growing the list.
        assert_eq!(a.keep(9999, "vllm", t0), None);
    }

    #[test]
    fn pending_adoptions_are_bounded_and_settled_by_attach_or_timeout() {
        let mut a = Adoption::default();
        let t0 = Instant::now();
        for pid in 0..MAX_PENDING as u32 {
            assert!(a.adopted(pid, t0));
        }
        assert!(a.adopted(0, t0), "a process adopted twice waits once");
        assert!(!a.adopted(100_000, t0));
        // Even pids attached; the odd ones wait, then are given up.
        assert!(a.settle(t0, |pid| pid % 2 == 0).is_empty());
        assert!(a.settle(t0 + ATTACH_WAIT / 2, |_| false).is_empty());
        let given_up = a.settle(t0 + ATTACH_WAIT, |_| false);
        assert_eq!(given_up.len(), MAX_PENDING / 2);
        assert!(given_up.iter().all(|pid| pid % 2 == 1));
        assert!(a.settle(t0 + ATTACH_WAIT * 2, |_| false).is_empty());
    }
}
