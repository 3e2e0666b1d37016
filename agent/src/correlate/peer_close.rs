//! When did the client close its side of a connection, and did it then reset it? From the
//! kernel's TCP state changes (sock:inet_sock_set_state), per socket address. The server's
//! syscalls do not show a client that gave up before a non-streamed answer was written: the
//! write into the half-closed socket succeeds, and only the client's reset tells it was never
//! read.
use inferscope_common::{TCP_CLOSE, TCP_CLOSE_WAIT};
use rustc_hash::FxHashMap;

use crate::capture::SockState;

/// Sockets remembered at once; beyond it new ones are counted and skipped.
const MAX_SOCKETS: usize = 65536;
/// A socket's end is forgotten this long after it closed (its connection, if tracked, ended
/// by then), or after the client's FIN if it never closed (a server that never closes it).
const MAX_AGE_NS: u64 = 600_000_000_000;

/// What the kernel saw of the client's end of one socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PeerEnd {
    /// The client's FIN arrived (ESTABLISHED→CLOSE_WAIT).
    pub fin_ns: Option<u64>,
    /// The socket went from CLOSE_WAIT straight to CLOSE: the client reset it before the
    /// server closed (it wrote into a socket the client no longer read).
    pub reset_ns: Option<u64>,
    closed_ns: Option<u64>,
}

#[derive(Default)]
pub(super) struct PeerCloses {
    by_sock: FxHashMap<u64, PeerEnd>,
    pub dropped: u64,
}

impl PeerCloses {
    pub(super) fn on_state(&mut self, state: &SockState) {
        if state.sock == 0 {
            return;
        }
        let (old, new) = (i32::from(state.old_state), i32::from(state.new_state));
        if new == TCP_CLOSE_WAIT {
            if !self.by_sock.contains_key(&state.sock) && self.by_sock.len() >= MAX_SOCKETS {
                self.dropped += 1;
                return;
            }
            let end = self.by_sock.entry(state.sock).or_default();
            if end.closed_ns.is_some() {
                // The address of a socket that ended, reused by a new one.
                *end = PeerEnd::default();
            }
            end.fin_ns.get_or_insert(state.ts_ns);
        } else if new == TCP_CLOSE {
            // Only sockets whose client closed first matter; others are not remembered.
            if let Some(end) = self.by_sock.get_mut(&state.sock)
                && end.closed_ns.is_none()
            {
                end.closed_ns = Some(state.ts_ns);
                if old == TCP_CLOSE_WAIT {
                    end.reset_ns = Some(state.ts_ns);
                }
            }
        }
    }

    /// The client's end of socket `sock`, for a connection opened at `opened_ns` (an older
    /// socket at the same address is not its own).
    pub(super) fn get(&self, sock: u64, opened_ns: u64) -> Option<PeerEnd> {
        let end = self.by_sock.get(&sock)?;
        if end.closed_ns.is_some_and(|c| c < opened_ns) {
            return None;
        }
        Some(*end)
    }

    pub(super) fn forget(&mut self, sock: u64) {
        self.by_sock.remove(&sock);
    }

    pub(super) fn sweep(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(MAX_AGE_NS);
        self.by_sock
            .retain(|_, end| end.closed_ns.or(end.fin_ns).is_some_and(|t| t >= cutoff));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_sock.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(sock: u64, old: i32, new: i32, ts_ns: u64) -> SockState {
        SockState {
            ts_ns,
            sock,
            local_port: 8080,
            old_state: old as u8,
            new_state: new as u8,
        }
    }

    const ESTABLISHED: i32 = 1;
    const LAST_ACK: i32 = 9;

    #[test]
    fn a_reset_after_the_fin_is_the_client_leaving_unread() {
        let mut closes = PeerCloses::default();
        closes.on_state(&state(7, ESTABLISHED, TCP_CLOSE_WAIT, 100));
        assert_eq!(closes.get(7, 0).unwrap().fin_ns, Some(100));
        closes.on_state(&state(7, TCP_CLOSE_WAIT, TCP_CLOSE, 300));
        assert_eq!(closes.get(7, 0).unwrap().reset_ns, Some(300));
    }

    #[test]
    fn the_server_closing_first_is_no_reset() {
        let mut closes = PeerCloses::default();
        closes.on_state(&state(7, ESTABLISHED, TCP_CLOSE_WAIT, 100));
        closes.on_state(&state(7, LAST_ACK, TCP_CLOSE, 300));
        let end = closes.get(7, 0).unwrap();
        assert_eq!((end.fin_ns, end.reset_ns), (Some(100), None));
    }

    #[test]
    fn a_reused_address_starts_afresh() {
        let mut closes = PeerCloses::default();
        closes.on_state(&state(7, ESTABLISHED, TCP_CLOSE_WAIT, 100));
        closes.on_state(&state(7, TCP_CLOSE_WAIT, TCP_CLOSE, 200));
        // A connection opened after that socket closed does not inherit its end.
        assert_eq!(closes.get(7, 250), None);
        closes.on_state(&state(7, ESTABLISHED, TCP_CLOSE_WAIT, 400));
        let end = closes.get(7, 250).unwrap();
        assert_eq!((end.fin_ns, end.reset_ns), (Some(400), None));
        // Sockets whose client never closed first are not remembered.
        closes.on_state(&state(9, ESTABLISHED, TCP_CLOSE, 500));
        assert_eq!(closes.get(9, 0), None);
        closes.sweep(400 + MAX_AGE_NS + 1);
        assert!(closes.is_empty());
    }
}
