//! Connections a process already held when the agent attached: the kernel never saw them
//! accepted, so the agent finds them in /proc and registers them in the kernel's connection map
//! (they are captured from then on, and their records say `connection_preexisting`). Every
//! other fd the kernel does not know is skipped there.
use std::sync::atomic::{AtomicU64, Ordering};

use inferscope_common::{CONN_ID_BIT, CONN_KNOWN, CONN_PREEXISTING, ConnEntry};

use crate::capture::{
    FdClassifier, SocketProbes,
    process::{
        procfs,
        sockets::{self, FdNow},
    },
};

/// User-assigned ids have bit 62 set too: kernel ids are CLOCK_MONOTONIC ns, below 2^62 for
/// 146 years of uptime, so the two never meet.
const USER_ID_BIT: u64 = 1 << 62;
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Registers the TCP connections on `ports` that `tgid` holds now; returns how many. Call it
/// once before the process is traced and once after: a connection accepted in between is
/// caught by the second pass, and one the kernel saw accepted keeps the kernel's entry.
pub(crate) fn register(
    probes: &mut SocketProbes,
    classifier: &mut FdClassifier,
    tgid: u32,
    ports: &[u16],
) -> usize {
    let mut registered = 0;
    for fd in procfs::socket_fds(tgid) {
        let FdNow::TcpConnection { local, peer } = sockets::tcp_connection(tgid, fd) else {
            continue;
        };
        if !ports.contains(&local.port()) {
            continue;
        }
        let id = CONN_ID_BIT | USER_ID_BIT | NEXT.fetch_add(1, Ordering::Relaxed);
        let entry = ConnEntry {
            id,
            sock: 0,
            flags: CONN_KNOWN | CONN_PREEXISTING,
            _pad: 0,
        };
        if !probes.register_preexisting(tgid, fd, entry) {
            continue;
        }
        // The fd may have been closed and its number reused between the look and the
        // registration: look again, and take the registration back unless it is the same.
        if sockets::tcp_connection(tgid, fd) != (FdNow::TcpConnection { local, peer }) {
            probes.unregister_preexisting(tgid, fd, id);
            continue;
        }
        classifier.add_preexisting(tgid, id, local.port(), peer);
        registered += 1;
    }
    registered
}
