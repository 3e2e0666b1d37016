//! Decides which fds of a traced process are HTTP server connections worth decoding. Files,
//! pipes, Unix sockets and the process's own outgoing connections are not; the kernel is told to
//! stop copying their bytes.
use std::net::SocketAddr;

use rustc_hash::{FxHashMap, FxHashSet};

use super::sockets::{self, FdNow};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdClass {
    /// A TCP connection accepted on one of the process's listening ports. `remote` is None when
    /// the connection was gone before /proc could be read.
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

#[derive(Default)]
pub struct FdClassifier {
    /// Looked up once per captured syscall, hence FxHash.
    cache: FxHashMap<(u32, i32), FdClass>,
    /// fds we saw being accepted: server side even if /proc has already lost them.
    accepted: FxHashSet<(u32, i32)>,
    pub lookups: u64,
}

impl FdClassifier {
    pub fn on_accept(&mut self, tgid: u32, fd: i32) {
        self.cache.remove(&(tgid, fd));
        if self.accepted.len() >= MAX_CACHED {
            self.accepted.clear();
        }
        self.accepted.insert((tgid, fd));
    }

    pub fn on_close(&mut self, tgid: u32, fd: i32) {
        self.cache.remove(&(tgid, fd));
        self.accepted.remove(&(tgid, fd));
    }

    /// A server connection that turned out not to be HTTP becomes an IPC candidate (once: a
    /// connection already rerouted is not rerouted again). Whether it was.
    pub fn reroute_to_ipc(&mut self, tgid: u32, fd: i32) -> bool {
        match self.cache.get_mut(&(tgid, fd)) {
            Some(class @ FdClass::Server { .. }) => {
                *class = FdClass::Ipc;
                true
            }
            _ => false,
        }
    }

    pub fn forget_process(&mut self, tgid: u32) {
        self.cache.retain(|(t, _), _| *t != tgid);
        self.accepted.retain(|(t, _)| *t != tgid);
    }

    /// `first_read` is the payload of the event being classified when it is a read: if the fd
    /// is already closed when the agent looks (short connections, accepted before the agent
    /// attached), a read that opens with an HTTP request line still marks a server connection.
    /// `ipc` is Some when the process's engine decodes IPC sockets ([`FdClass::Ipc`]), holding
    /// whether this event's bytes look like that IPC (the decode stage says: for ZeroMQ, a
    /// greeting or whole frames, which HTTP bytes never are). A connection accepted on a
    /// listening port is IPC when they do: ZeroMQ's tcp:// binds listen too.
    pub fn classify(
        &mut self,
        tgid: u32,
        fd: i32,
        listening_ports: &[u16],
        first_read: Option<&[u8]>,
        ipc: Option<bool>,
    ) -> FdClass {
        let ipc_greeting = ipc == Some(true);
        let ipc = ipc.is_some();
        if let Some(class) = self.cache.get(&(tgid, fd)) {
            return *class;
        }
        self.lookups += 1;
        let unknown_peer = FdClass::Server {
            local_port: None,
            remote: None,
        };
        let class = match sockets::tcp_connection(tgid, fd) {
            FdNow::TcpConnection { local, .. }
                if ipc_greeting && listening_ports.contains(&local.port()) =>
            {
                FdClass::Ipc
            }
            FdNow::TcpConnection { local, peer } if listening_ports.contains(&local.port()) => {
                FdClass::Server {
                    local_port: Some(local.port()),
                    remote: Some(peer),
                }
            }
            FdNow::TcpConnection { .. } | FdNow::UnixStream if ipc => FdClass::Ipc,
            FdNow::TcpConnection { .. } | FdNow::UnixStream | FdNow::Other => FdClass::Other,
            FdNow::Gone if self.accepted.contains(&(tgid, fd)) => unknown_peer,
            FdNow::Gone if first_read.is_some_and(starts_like_http_request) => unknown_peer,
            FdNow::Gone => FdClass::Other,
        };
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert((tgid, fd), class);
        class
    }
}

/// `METHOD SP /...`: the opening of an HTTP/1.x request line.
fn starts_like_http_request(bytes: &[u8]) -> bool {
    const METHODS: [&[u8]; 7] = [
        b"GET ",
        b"POST ",
        b"PUT ",
        b"DELETE ",
        b"HEAD ",
        b"OPTIONS ",
        b"PATCH ",
    ];
    METHODS.iter().any(|m| bytes.starts_with(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_fd_is_judged_by_its_first_read() {
        let mut c = FdClassifier::default();
        let gone_fd = 100_000;
        let me = std::process::id();
        assert_eq!(
            c.classify(
                me,
                gone_fd,
                &[80],
                Some(b"POST /v1/chat/completions HTTP/1.1\r\n"),
                None
            ),
            FdClass::Server {
                local_port: None,
                remote: None
            }
        );
        assert_eq!(
            c.classify(me, gone_fd + 1, &[80], Some(b"\x16\x03\x01"), None),
            FdClass::Other
        );
        assert_eq!(
            c.classify(me, gone_fd + 2, &[80], None, None),
            FdClass::Other
        );
    }

    #[test]
    fn ipc_sockets_only_for_engines_that_decode_them() {
        use std::os::fd::AsRawFd;
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let out = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let me = std::process::id();
        for fd in [unix.as_raw_fd(), out.as_raw_fd()] {
            assert_eq!(
                FdClassifier::default().classify(me, fd, &[], None, Some(false)),
                FdClass::Ipc
            );
            assert_eq!(
                FdClassifier::default().classify(me, fd, &[], None, None),
                FdClass::Other
            );
        }
        // Accepted on a listening port: HTTP, unless it opens with a ZMTP greeting.
        let (accepted, _) = listener.accept().unwrap();
        let port = listener.local_addr().unwrap().port();
        let fd = accepted.as_raw_fd();
        assert!(matches!(
            FdClassifier::default().classify(me, fd, &[port], None, Some(false)),
            FdClass::Server { .. }
        ));
        assert_eq!(
            FdClassifier::default().classify(me, fd, &[port], None, Some(true)),
            FdClass::Ipc
        );
        // Joined after the greeting: HTTP first, rerouted once the HTTP decoder gives up.
        let mut c = FdClassifier::default();
        c.classify(me, fd, &[port], None, Some(false));
        assert!(c.reroute_to_ipc(me, fd));
        assert_eq!(c.classify(me, fd, &[port], None, Some(false)), FdClass::Ipc);
        assert!(!c.reroute_to_ipc(me, fd));
    }
}
