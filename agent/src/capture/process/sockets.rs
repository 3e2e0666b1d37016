//! A traced process's TCP sockets, asked directly: pidfd_getfd(2) duplicates one of its fds into
//! the agent, getsockname/getpeername/SO_ACCEPTCONN answer, and the duplicate is closed. That is
//! a handful of syscalls per socket, where /proc/PID/net/tcp walks the kernel's whole connection
//! hash table on every read (about 4 ms per read on this 24 GiB host, whatever the socket
//! count). /proc is the fallback where pidfd_getfd is missing (Linux < 5.6) or refused.
use std::{
    io,
    mem::{size_of, zeroed},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use crate::capture::{kernel::records::canonical_ip, process::procfs};

/// What one fd of a process is, as far as the HTTP layer cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FdKind {
    TcpListener {
        local: SocketAddr,
    },
    TcpConnection {
        local: SocketAddr,
        peer: SocketAddr,
    },
    /// A connected Unix stream socket (engine IPC, e.g. ZeroMQ's ipc://).
    UnixStream,
    /// A file, pipe, UDP socket, or a TCP socket in another state.
    Other,
}

/// A pidfd for one process (it names the process even if its pid is reused).
pub(crate) struct ProcessHandle {
    pidfd: OwnedFd,
}

impl ProcessHandle {
    pub(crate) fn open(tgid: u32) -> io::Result<Self> {
        // SAFETY: plain syscall; a non-negative return is a new fd we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tgid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: fd was just returned by the kernel and is owned by nobody else.
            pidfd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
        })
    }

    /// Classifies `fd` of the process. Err when the fd is gone or the kernel refuses.
    pub(crate) fn inspect(&self, fd: i32) -> io::Result<FdKind> {
        // SAFETY: plain syscall; a non-negative return is a duplicate fd we own.
        let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.pidfd.as_raw_fd(), fd, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above; dropping it closes only our duplicate.
        let dup = unsafe { OwnedFd::from_raw_fd(dup as RawFd) };
        Ok(classify(dup.as_raw_fd()))
    }
}

fn sockopt_int(fd: RawFd, option: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are valid for the kernel to write.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(value)
}

fn address(
    fd: RawFd,
    call: unsafe extern "C" fn(
        libc::c_int,
        *mut libc::sockaddr,
        *mut libc::socklen_t,
    ) -> libc::c_int,
) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data, valid all-zero.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len are valid for the kernel to write.
    if unsafe {
        call(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    } != 0
    {
        return None;
    }
    sockaddr_to_std(&storage)
}

fn sockaddr_to_std(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(storage as *const _ as *const _) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 = unsafe { &*(storage as *const _ as *const _) };
            let ip = canonical_ip(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
            Some(SocketAddr::new(ip, u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

fn classify(fd: RawFd) -> FdKind {
    let domain = sockopt_int(fd, libc::SO_DOMAIN);
    if domain == Some(libc::AF_UNIX) && sockopt_int(fd, libc::SO_TYPE) == Some(libc::SOCK_STREAM) {
        return FdKind::UnixStream;
    }
    // MPTCP is TCP to the engine and its clients (Go 1.24's listeners use it where the kernel
    // allows): a client without MPTCP gets a plain TCP connection from its accept.
    if !matches!(domain, Some(libc::AF_INET) | Some(libc::AF_INET6))
        || !matches!(
            sockopt_int(fd, libc::SO_PROTOCOL),
            Some(libc::IPPROTO_TCP) | Some(libc::IPPROTO_MPTCP)
        )
    {
        return FdKind::Other;
    }
    let Some(local) = address(fd, libc::getsockname) else {
        return FdKind::Other;
    };
    if sockopt_int(fd, libc::SO_ACCEPTCONN) == Some(1) {
        return FdKind::TcpListener { local };
    }
    match address(fd, libc::getpeername) {
        Some(peer) => FdKind::TcpConnection { local, peer },
        None => FdKind::Other,
    }
}

/// TCP ports `tgid` listens on.
pub(crate) fn listening_ports(tgid: u32) -> Vec<u16> {
    let Ok(process) = ProcessHandle::open(tgid) else {
        return procfs::listening_ports(tgid);
    };
    let mut ports = Vec::new();
    for fd in procfs::socket_fds(tgid) {
        match process.inspect(fd) {
            Ok(FdKind::TcpListener { local }) => ports.push(local.port()),
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
            // pidfd_getfd refused (no ptrace rights, seccomp, old kernel): fall back to /proc.
            Err(_) => return procfs::listening_ports(tgid),
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// What `fd` of `tgid` is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FdNow {
    TcpConnection {
        local: SocketAddr,
        peer: SocketAddr,
    },
    UnixStream,
    Other,
    /// Closed already (or the process is gone): the agent looked too late.
    Gone,
}

pub(crate) fn tcp_connection(tgid: u32, fd: i32) -> FdNow {
    let inspected = ProcessHandle::open(tgid).and_then(|p| p.inspect(fd));
    match inspected {
        Ok(FdKind::TcpConnection { local, peer }) => FdNow::TcpConnection { local, peer },
        Ok(FdKind::UnixStream) => FdNow::UnixStream,
        Ok(_) => FdNow::Other,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF) | Some(libc::ESRCH)) => FdNow::Gone,
        Err(_) => match procfs::tcp_connection(tgid, fd) {
            Some(e) => FdNow::TcpConnection {
                local: e.local,
                peer: e.remote,
            },
            None if procfs::socket_inode(tgid, fd).is_none() && !procfs::process_exists(tgid) => {
                FdNow::Gone
            }
            None => FdNow::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::{TcpListener, TcpStream},
        os::fd::AsRawFd,
    };

    use super::*;

    #[test]
    fn tells_listeners_connections_and_files_apart() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).unwrap();
        let (server, peer) = listener.accept().unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let me = ProcessHandle::open(std::process::id()).unwrap();
        assert_eq!(
            me.inspect(listener.as_raw_fd()).unwrap(),
            FdKind::TcpListener { local: addr }
        );
        assert_eq!(
            me.inspect(server.as_raw_fd()).unwrap(),
            FdKind::TcpConnection { local: addr, peer }
        );
        assert_eq!(me.inspect(file.as_raw_fd()).unwrap(), FdKind::Other);
        let (unix, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(me.inspect(unix.as_raw_fd()).unwrap(), FdKind::UnixStream);
        assert_eq!(
            tcp_connection(std::process::id(), unix.as_raw_fd()),
            FdNow::UnixStream
        );
        assert!(me.inspect(100_000).is_err());
        assert!(listening_ports(std::process::id()).contains(&addr.port()));
        assert_eq!(
            tcp_connection(std::process::id(), server.as_raw_fd()),
            FdNow::TcpConnection { local: addr, peer }
        );
        assert_eq!(tcp_connection(std::process::id(), 100_000), FdNow::Gone);
        drop(client);
    }

    #[test]
    fn ipv6_and_mapped_addresses() {
        let Ok(listener) = TcpListener::bind("[::]:0") else {
            return; // no IPv6 on this host
        };
        let port = listener.local_addr().unwrap().port();
        let client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (server, _) = listener.accept().unwrap();
        let me = ProcessHandle::open(std::process::id()).unwrap();
        let FdKind::TcpConnection { peer, .. } = me.inspect(server.as_raw_fd()).unwrap() else {
            panic!("expected a connection");
        };
        // ::ffff:127.0.0.1 folds to 127.0.0.1, as the kernel's segment records do.
        assert_eq!(peer, client.local_addr().unwrap());
    }
}
