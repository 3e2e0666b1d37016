//! Decides which connections of a traced process are HTTP server connections worth decoding.
//! The kernel names every connection it saw accepted (and the pre-existing ones the agent
//! registered at attach), so a server connection is known from its first byte and an fd number
//! reused for a file can never become one. Only what the kernel cannot tell is looked up here:
//! whether a connection carries an engine's IPC, and, without the accept hook, what an accepted
//! socket is.
use std::net::SocketAddr;

use inferscope_common::{CONN_INET, CONN_PREEXISTING};
use rustc_hash::FxHashMap;

use crate::capture::{
    SyscallEvent,
    process::sockets::{self, FdNow},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FdClass {
    /// A TCP connection accepted on one of the process's listening ports. `remote` is None when
    /// the kernel joins its arrivals by socket, or the connection was gone before it was read.
    Server {
        local_port: Option<u16>,
        remote: Option<SocketAddr>,
    },
    /// A socket that may carry the engine's internal IPC (a Unix stream socket, or a TCP
    /// connection not on a listening port), for processes whose engine decodes its IPC.
    Ipc,
    Other,
}

/// Bounded: a process with more live connections than this is re-resolved on overflow.
const MAX_CACHED: usize = 65536;
/// IPC connections noted between two drains of [`FdClassifier::new_ipc`].
const MAX_NEW_IPC: usize = 1024;

#[derive(Default)]
pub(crate) struct FdClassifier {
    /// By (tgid, connection key: the kernel's id, else the fd); looked up once per captured
    /// syscall, hence FxHash.
    cache: FxHashMap<(u32, u64), FdClass>,
    /// Pre-existing connections registered at attach, with the addresses /proc gave.
    preexisting: FxHashMap<(u32, u64), (u16, SocketAddr)>,
    /// Connections the kernel knows (accepted) just found carrying IPC, as (tgid, fd, id): the
    /// caller tells the kernel not to cut their writes under back-pressure, then clears it.
    pub new_ipc: Vec<(u32, i32, u64)>,
    /// The kernel's accept hook runs: an accepted connection without a socket is then most
    /// likely a Unix one, so one whose fd is gone when it is classified is not taken for TCP.
    pub sock_hook: bool,
    pub lookups: u64,
}

impl FdClassifier {
    pub(crate) fn new(sock_hook: bool) -> Self {
        Self {
            sock_hook,
            ..Self::default()
        }
    }

    /// A connection found open at attach and registered with the kernel under `id`.
    pub(crate) fn add_preexisting(
        &mut self,
        tgid: u32,
        id: u64,
        local_port: u16,
        peer: SocketAddr,
    ) {
        if self.preexisting.len() < MAX_CACHED {
            self.preexisting.insert((tgid, id), (local_port, peer));
        }
    }

    /// Drops the class decided for a connection, to be decided again at its next record.
    pub(crate) fn forget_class(&mut self, tgid: u32, key: u64) {
        self.cache.remove(&(tgid, key));
    }

    pub(crate) fn on_close(&mut self, tgid: u32, key: u64) {
        self.cache.remove(&(tgid, key));
        self.preexisting.remove(&(tgid, key));
    }

    /// A server connection that turned out not to be HTTP becomes an IPC candidate (once: a
    /// connection already rerouted is not rerouted again). Whether it was.
    pub(crate) fn reroute_to_ipc(&mut self, tgid: u32, key: u64) -> bool {
        match self.cache.get_mut(&(tgid, key)) {
            Some(class @ FdClass::Server { .. }) => {
                *class = FdClass::Ipc;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn forget_process(&mut self, tgid: u32) {
        self.cache.retain(|(t, _), _| *t != tgid);
        self.preexisting.retain(|(t, _), _| *t != tgid);
    }

    /// Whether a connection of `tgid` is classified or registered.
    #[cfg(test)]
    pub(crate) fn knows_process(&self, tgid: u32) -> bool {
        self.cache.keys().any(|(t, _)| *t == tgid)
            || self.preexisting.keys().any(|(t, _)| *t == tgid)
    }

    /// What the connection of `ev` is. `ipc` is Some when the process's engine decodes IPC
    /// sockets ([`FdClass::Ipc`]), holding whether this event's bytes look like that IPC (the
    /// decode stage says: for ZeroMQ, a greeting or whole frames, which HTTP bytes never are).
    /// A connection accepted on a listening port is IPC when they do: ZeroMQ's tcp:// binds
    /// listen too.
    pub(crate) fn classify(
        &mut self,
        ev: &SyscallEvent<'_>,
        listening_ports: &[u16],
        ipc: Option<bool>,
    ) -> FdClass {
        let key = (ev.tgid, ev.conn_key());
        if let Some(class) = self.cache.get(&key) {
            return *class;
        }
        let class = self.resolve(ev, listening_ports, ipc);
        if class == FdClass::Ipc && ev.conn_gen != 0 && self.new_ipc.len() < MAX_NEW_IPC {
            self.new_ipc.push((ev.tgid, ev.fd, ev.conn_gen));
        }
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(key, class);
        class
    }

    fn resolve(
        &mut self,
        ev: &SyscallEvent<'_>,
        listening_ports: &[u16],
        ipc: Option<bool>,
    ) -> FdClass {
        let ipc_greeting = ipc == Some(true);
        let ipc = ipc.is_some();
        let server = |local_port, remote| {
            if ipc_greeting {
                FdClass::Ipc
            } else {
                FdClass::Server { local_port, remote }
            }
        };
        if ev.conn_known() {
            if ev.conn_flags & CONN_PREEXISTING != 0 {
                let peer = self.preexisting.get(&(ev.tgid, ev.conn_gen)).copied();
                return server(peer.map(|p| p.0), peer.map(|p| p.1));
            }
            if ev.conn_flags & CONN_INET != 0 || ev.sock != 0 {
                // Accepted TCP: the kernel joins its arrivals by socket; no lookup needed.
                return server(None, None);
            }
            // Accepted, and the kernel named no TCP socket: with the accept hook, most likely a
            // Unix socket, but also a TCP one whose socket the hook could not read. Without
            // it, anything. Either way the process says what the fd is; whatever it holds now
            // was accepted, so a TCP connection there is this one or a later accepted one.
            self.lookups += 1;
            return match sockets::tcp_connection(ev.tgid, ev.fd) {
                FdNow::TcpConnection { local, peer } => server(Some(local.port()), Some(peer)),
                FdNow::UnixStream if ipc => FdClass::Ipc,
                FdNow::Gone if !self.sock_hook => server(None, None),
                FdNow::Gone if ipc => FdClass::Ipc,
                FdNow::Gone | FdNow::UnixStream | FdNow::Other => FdClass::Other,
            };
        }
        // An fd the kernel never saw accepted (captured only for engines with IPC decoding): an
        // IPC candidate at most, never an HTTP server connection.
        self.lookups += 1;
        match sockets::tcp_connection(ev.tgid, ev.fd) {
            FdNow::TcpConnection { local, .. } if listening_ports.contains(&local.port()) => {
                FdClass::Other
            }
            FdNow::TcpConnection { .. } | FdNow::UnixStream if ipc => FdClass::Ipc,
            _ => FdClass::Other,
        }
    }
}

impl inferscope_model::PerProcess for FdClassifier {
    fn process_gone(&mut self, tgid: u32) {
        self.forget_process(tgid);
    }
}

#[cfg(test)]
mod tests {
    use inferscope_common::{CONN_ID_BIT, CONN_KNOWN, SyscallKind};

    use super::*;

    fn ev(fd: i32, conn_gen: u64, conn_flags: u32) -> SyscallEvent<'static> {
        SyscallEvent {
            kind: SyscallKind::Read,
            tgid: std::process::id(),
            tid: 1,
            fd,
            ts_enter_ns: 1,
            ts_exit_ns: 2,
            ret: 10,
            truncated: false,
            copy_failed: false,
            conn_gen,
            conn_flags,
            sock: 0,
            conn_seq: None,
            read_seq: None,
            lost_heads: 0,
            payload: b"GET / HTTP/1.1\r\n",
            more: false,
            chunk_offset: None,
            token: false,
        }
    }

    #[test]
    fn the_kernel_decides_what_is_a_server_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        use std::os::fd::AsRawFd;
        let fd = accepted.as_raw_fd();
        let id = CONN_ID_BIT | 7;
        let mut c = FdClassifier::new(true);
        // Accepted TCP: a server connection, whatever the fd is now.
        assert!(matches!(
            c.classify(&ev(100_000, id, CONN_KNOWN | CONN_INET), &[port], None),
            FdClass::Server { .. }
        ));
        // The same accepted TCP fd, unknown to the kernel: never a server connection.
        assert_eq!(c.classify(&ev(fd, 0, 0), &[port], None), FdClass::Other);
        assert_eq!(c.lookups, 1);
        // Accepted, not TCP (Unix): IPC for engines that decode it, else nothing.
        let (unix_fd, _unix_peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let unix = ev(unix_fd.as_raw_fd(), id + 1, CONN_KNOWN);
        assert_eq!(
            FdClassifier::new(true).classify(&unix, &[port], Some(false)),
            FdClass::Ipc
        );
        assert_eq!(
            FdClassifier::new(true).classify(&unix, &[port], None),
            FdClass::Other
        );
        // Without the accept hook, or with it but no socket named (a read of the walk failed),
        // the accepted fd is looked at.
        for hook in [false, true] {
            assert!(matches!(
                FdClassifier::new(hook).classify(&ev(fd, id + 2, CONN_KNOWN), &[port], None),
                FdClass::Server { local_port: Some(p), .. } if p == port
            ));
        }
        // Pre-existing: the addresses registered at attach.
        let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        c.add_preexisting(std::process::id(), id + 3, 8080, peer);
        assert_eq!(
            c.classify(&ev(9, id + 3, CONN_KNOWN | CONN_PREEXISTING), &[8080], None),
            FdClass::Server {
                local_port: Some(8080),
                remote: Some(peer)
            }
        );
    }

    #[test]
    fn ipc_sockets_only_for_engines_that_decode_them() {
        use std::os::fd::AsRawFd;
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let out = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        for fd in [unix.as_raw_fd(), out.as_raw_fd()] {
            assert_eq!(
                FdClassifier::new(true).classify(&ev(fd, 0, 0), &[], Some(false)),
                FdClass::Ipc
            );
            assert_eq!(
                FdClassifier::new(true).classify(&ev(fd, 0, 0), &[], None),
                FdClass::Other
            );
        }
        // Accepted on a listening port: HTTP, unless it opens with a ZMTP greeting.
        let accepted = ev(50, CONN_ID_BIT | 1, CONN_KNOWN | CONN_INET);
        assert!(matches!(
            FdClassifier::new(true).classify(&accepted, &[], Some(false)),
            FdClass::Server { .. }
        ));
        let mut zmtp = FdClassifier::new(true);
        assert_eq!(zmtp.classify(&accepted, &[], Some(true)), FdClass::Ipc);
        // The kernel is to keep that connection's writes whole under back-pressure; an IPC
        // fd the kernel does not know is never cut anyway.
        assert_eq!(zmtp.new_ipc, [(accepted.tgid, 50, CONN_ID_BIT | 1)]);
        zmtp.classify(&accepted, &[], Some(true));
        assert_eq!(zmtp.new_ipc.len(), 1, "noted once, not per record");
        let mut unknown = FdClassifier::new(true);
        unknown.classify(&ev(unix.as_raw_fd(), 0, 0), &[], Some(false));
        assert!(unknown.new_ipc.is_empty());
        // Joined after the greeting: HTTP first, rerouted once the HTTP decoder gives up.
        let mut c = FdClassifier::new(true);
        c.classify(&accepted, &[], Some(false));
        assert!(c.reroute_to_ipc(accepted.tgid, accepted.conn_key()));
        assert_eq!(c.classify(&accepted, &[], Some(false)), FdClass::Ipc);
        assert!(!c.reroute_to_ipc(accepted.tgid, accepted.conn_key()));
    }
}
