//! /proc lookups: processes, their command lines and mappings, which fds are sockets. The TCP
//! tables here are the slow fallback for [`crate::capture::process::sockets`].
//! Everything read here can vanish between calls (processes exit), so every function returns
//! `Option`/empty rather than an error.
use std::{
    collections::HashSet,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use crate::capture::kernel::records::canonical_ip;

/// The inode of the socket behind `fd`, or None when the fd is not a socket (or is gone).
pub(crate) fn socket_inode(tgid: u32, fd: i32) -> Option<u64> {
    let link = fs::read_link(format!("/proc/{tgid}/fd/{fd}")).ok()?;
    parse_socket_link(link.to_str()?)
}

fn parse_socket_link(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub inode: u64,
}

pub(crate) const TCP_LISTEN: u8 = 0x0A;

/// The TCP sockets of `tgid`'s network namespace (IPv4 and IPv6).
pub(crate) fn tcp_table(tgid: u32) -> Vec<TcpEntry> {
    let mut entries = Vec::new();
    for file in ["tcp", "tcp6"] {
        if let Ok(text) = fs::read_to_string(format!("/proc/{tgid}/net/{file}")) {
            entries.extend(text.lines().skip(1).filter_map(parse_tcp_line));
        }
    }
    entries
}

fn parse_tcp_line(line: &str) -> Option<TcpEntry> {
    let mut fields = line.split_whitespace();
    let _slot = fields.next()?;
    let local = parse_hex_addr(fields.next()?)?;
    let remote = parse_hex_addr(fields.next()?)?;
    let state = u8::from_str_radix(fields.next()?, 16).ok()?;
    // tx_queue:rx_queue, tr:tm->when, retrnsmt, uid, timeout, inode
    let inode = fields.nth(5)?.parse().ok()?;
    Some(TcpEntry {
        local,
        remote,
        state,
        inode,
    })
}

/// "0100007F:1F90" (IPv4) or 32 hex digits (IPv6): 32-bit words in host (little-endian) order.
fn parse_hex_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(addr, 16).ok()?.swap_bytes(),
        )),
        32 => {
            let mut octets = [0u8; 16];
            for (i, chunk) in octets.chunks_mut(4).enumerate() {
                let word = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
                chunk.copy_from_slice(&word.to_le_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(canonical_ip(ip), port))
}

/// fds of `tgid` that are sockets.
pub(crate) fn socket_fds(tgid: u32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{tgid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let link = fs::read_link(entry.path()).ok()?;
        parse_socket_link(link.to_str()?)?;
        entry.file_name().to_str()?.parse().ok()
    })
    .collect()
}

/// Socket inodes held open by `tgid`.
pub(crate) fn socket_inodes(tgid: u32) -> HashSet<u64> {
    let Ok(dir) = fs::read_dir(format!("/proc/{tgid}/fd")) else {
        return HashSet::new();
    };
    dir.filter_map(|entry| {
        let link = fs::read_link(entry.ok()?.path()).ok()?;
        parse_socket_link(link.to_str()?)
    })
    .collect()
}

/// TCP ports `tgid` itself listens on.
pub(crate) fn listening_ports(tgid: u32) -> Vec<u16> {
    let inodes = socket_inodes(tgid);
    let mut ports: Vec<u16> = tcp_table(tgid)
        .into_iter()
        .filter(|e| e.state == TCP_LISTEN && inodes.contains(&e.inode))
        .map(|e| e.local.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The TCP connection behind `fd` of `tgid`, if it still exists.
pub(crate) fn tcp_connection(tgid: u32, fd: i32) -> Option<TcpEntry> {
    let inode = socket_inode(tgid, fd)?;
    tcp_table(tgid).into_iter().find(|e| e.inode == inode)
}

pub(crate) fn cmdline(tgid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{tgid}/cmdline")).ok()?;
    let text: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect();
    Some(text.join(" "))
}

/// The process's arguments, one string each (an engine's flags, read by its plugin).
pub(crate) fn cmdline_args(tgid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{tgid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect(),
    )
}

/// The value of environment variable `name` in process `tgid`'s initial environment (Err when
/// the environment cannot be read: another user's process without CAP_SYS_PTRACE).
pub(crate) fn environ_var(tgid: u32, name: &str) -> std::io::Result<Option<String>> {
    let raw = fs::read(format!("/proc/{tgid}/environ"))?;
    Ok(raw.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    }))
}

/// Distinct file-backed mappings (executable and shared libraries).
pub(crate) fn mapped_files(tgid: u32) -> Vec<String> {
    let Ok(text) = fs::read_to_string(format!("/proc/{tgid}/maps")) else {
        return Vec::new();
    };
    let mut files: Vec<String> = text
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/'))
        .map(str::to_owned)
        .collect();
    files.sort_unstable();
    files.dedup();
    files
}

/// The file mapped at `address` in `tgid` and the address's offset in it.
pub(crate) fn mapping_of(tgid: u32, address: u64) -> Option<(String, u64)> {
    let text = fs::read_to_string(format!("/proc/{tgid}/maps")).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        if !(start..end).contains(&address) {
            return None;
        }
        let offset = u64::from_str_radix(fields.nth(1)?, 16).ok()?;
        let path = fields.nth(2)?;
        path.starts_with('/')
            .then(|| (path.to_owned(), address - start + offset))
    })
}

/// Process start time (clock ticks since boot): with the pid, it names one process instance.
pub(crate) fn start_time(tgid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    // comm may contain spaces and parentheses: fields resume after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The parent's pid (an engine's worker process names the server that started it).
pub(crate) fn parent_pid(tgid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Every live process descended from one of `roots` (children, their children, ...), with the
/// root it descends from.
pub(crate) fn descendants(roots: &[u32]) -> Vec<(u32, u32)> {
    if roots.is_empty() {
        return Vec::new();
    }
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, parent_pid(pid)?)))
        .collect();
    let mut found: Vec<(u32, u32)> = Vec::new();
    let mut frontier: Vec<(u32, u32)> = roots.iter().map(|&r| (r, r)).collect();
    // Bounded depth: a process tree deeper than this is not an engine's workers.
    for _ in 0..8 {
        let mut next = Vec::new();
        for &(pid, parent) in &parents {
            if let Some(&(_, root)) = frontier.iter().find(|(p, _)| *p == parent)
                && !roots.contains(&pid)
                && !found.iter().any(|(f, _)| *f == pid)
            {
                next.push((pid, root));
            }
        }
        if next.is_empty() {
            break;
        }
        found.extend(&next);
        frontier = next;
    }
    found
}

pub(crate) fn process_exists(tgid: u32) -> bool {
    Path::new(&format!("/proc/{tgid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_process_s_grandchildren_and_the_address_mapped_in_a_file() {
        // sh → sh → sleep: both below the test process.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 2; true' & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let shell = child.id();
        let mut found = Vec::new();
        for _ in 0..100 {
            found = descendants(&[me]);
            if found.iter().filter(|(p, _)| *p != shell).count() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(found.contains(&(shell, me)), "{found:?}");
        assert!(found.iter().all(|(_, root)| *root == me));
        assert!(
            found.iter().filter(|(p, _)| *p != shell).count() >= 2,
            "{found:?}"
        );
        let _ = child.kill();
        let _ = child.wait();
        assert!(descendants(&[]).is_empty());
        // This function's own code is mapped from the test binary.
        let here =
            finds_a_process_s_grandchildren_and_the_address_mapped_in_a_file as *const () as usize;
        let (path, offset) = mapping_of(me, here as u64).unwrap();
        assert!(path.starts_with('/'), "{path}");
        assert!(offset > 0);
    }

    #[test]
    fn parses_proc_net_tcp_lines() {
        let v4 = "   0: 0100007F:1F99 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0";
        let e = parse_tcp_line(v4).unwrap();
        assert_eq!(e.local, "127.0.0.1:8089".parse().unwrap());
        assert_eq!(e.state, TCP_LISTEN);
        assert_eq!(e.inode, 123456);
        let v6 = "   1: 0000000000000000FFFF00000100007F:1F99 0000000000000000FFFF00000100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 20 4 30 10 -1";
        let e = parse_tcp_line(v6).unwrap();
        assert_eq!(e.remote, "127.0.0.1:54000".parse().unwrap());
        assert_eq!(e.inode, 99);
        assert!(parse_tcp_line("garbage").is_none());
    }

    #[test]
    fn socket_links() {
        assert_eq!(parse_socket_link("socket:[42]"), Some(42));
        assert_eq!(parse_socket_link("/dev/null"), None);
        assert_eq!(parse_socket_link("pipe:[42]"), None);
    }

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        assert!(cmdline(me).is_some());
        assert!(start_time(me).is_some());
        assert!(!mapped_files(me).is_empty());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listening_ports(me).contains(&port));
    }
}
