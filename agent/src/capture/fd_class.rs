//! Decides which fds of a traced process are HTTP server connections worth decoding. Files,
//! pipes, Unix sockets and the process's own outgoing connections are not; the kernel is told to
//! stop copying their bytes.
use std::net::SocketAddr;

use rustc_hash::{FxHashMap, FxHashSet};

use super::sockets;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdClass {
    /// A TCP connection accepted on one of the process's listening ports. `remote` is None when
    /// the connection was gone before /proc could be read.
    Server {
        local_port: Option<u16>,
        remote: Option<SocketAddr>,
    },
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

    pub fn forget_process(&mut self, tgid: u32) {
        self.cache.retain(|(t, _), _| *t != tgid);
        self.accepted.retain(|(t, _)| *t != tgid);
    }

    pub fn classify(&mut self, tgid: u32, fd: i32, listening_ports: &[u16]) -> FdClass {
        if let Some(class) = self.cache.get(&(tgid, fd)) {
            return *class;
        }
        self.lookups += 1;
        let class = match sockets::tcp_connection(tgid, fd) {
            Some((local, peer)) if listening_ports.contains(&local.port()) => FdClass::Server {
                local_port: Some(local.port()),
                remote: Some(peer),
            },
            None if self.accepted.contains(&(tgid, fd)) => FdClass::Server {
                local_port: None,
                remote: None,
            },
            _ => FdClass::Other,
        };
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert((tgid, fd), class);
        class
    }
}
