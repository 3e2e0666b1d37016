//! An accepted connection's TCP socket, found from its fd at the accept's exit where fexit on
//! inet_csk_accept is refused: current task → files → fd table → file → socket → sock, each a
//! kernel read at an offset user space took from the kernel's BTF (those structs change
//! between releases and configurations). Without it the socket is learnt at the connection's
//! first read, which costs every TCP read of the host a program run (`rcv_space_adjust`).
use aya_ebpf::helpers::generated::bpf_get_current_task;

// Member offsets from the kernel's BTF; `SOCK_WALK` is 1 once user space has set them all (an
// offset may be 0).
#[unsafe(no_mangle)]
static SOCK_WALK: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_TASK_FILES: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_FILES_FDT: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_FDT_MAX_FDS: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_FDT_FD: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_FILE_PRIVATE_DATA: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_SOCKET_SK: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_SOCK_FAMILY: u32 = 0;
/// `sock.sk_protocol` (a u16 since 5.6) and `mptcp_sock.first`; both 0 on a kernel without
/// MPTCP, where every IPv4/IPv6 stream socket is TCP.
#[unsafe(no_mangle)]
static SOCK_WALK_SOCK_PROTOCOL: u32 = 0;
#[unsafe(no_mangle)]
static SOCK_WALK_MPTCP_FIRST: u32 = 0;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const IPPROTO_TCP: u16 = 6;
const IPPROTO_MPTCP: u16 = 262;

#[inline(always)]
fn offset(global: &u32) -> u64 {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    u64::from(unsafe { core::ptr::read_volatile(global) })
}

#[inline(always)]
fn read<T: Copy>(address: u64) -> Option<T> {
    // SAFETY: the helper checks the kernel address and fails instead of faulting; T is an
    // integer or a pointer-sized integer, valid for any bytes.
    crate::read::kernel::<T>(address)
}

/// Whether user space found the offsets (else the first-read fallback is attached).
#[inline(always)]
fn enabled() -> bool {
    offset(&SOCK_WALK) == 1
}

/// The TCP socket (IPv4 or IPv6) `fd` of the current process holds (an MPTCP connection's
/// first subflow), or 0: not a TCP socket, or a read failed (the fd closed by another thread
/// meanwhile, an offset wrong for this kernel: then nothing is learnt, as without the walk).
#[inline(always)]
pub fn tcp_socket(fd: i32) -> u64 {
    if !enabled() || fd < 0 {
        return 0;
    }
    walk(fd as u64).unwrap_or(0)
}

#[inline(always)]
fn walk(fd: u64) -> Option<u64> {
    // SAFETY: bpf_get_current_task takes no arguments; its result is only used as an address
    // for the checked reads below.
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = read(task + offset(&SOCK_WALK_TASK_FILES))?;
    let fdt: u64 = read(files + offset(&SOCK_WALK_FILES_FDT))?;
    let max_fds: u32 = read(fdt + offset(&SOCK_WALK_FDT_MAX_FDS))?;
    if fd >= u64::from(max_fds) {
        return None;
    }
    let fds: u64 = read(fdt + offset(&SOCK_WALK_FDT_FD))?;
    let file: u64 = read(fds + fd * 8)?;
    let socket: u64 = read(file + offset(&SOCK_WALK_FILE_PRIVATE_DATA))?;
    let sock: u64 = read(socket + offset(&SOCK_WALK_SOCKET_SK))?;
    let family: u16 = read(sock + offset(&SOCK_WALK_SOCK_FAMILY))?;
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let protocol_at = offset(&SOCK_WALK_SOCK_PROTOCOL);
    if protocol_at == 0 {
        return Some(sock);
    }
    match read::<u16>(sock + protocol_at)? {
        IPPROTO_TCP => Some(sock),
        // The fd of a connection from a client that speaks MPTCP holds its `mptcp_sock`; its
        // bytes travel on TCP subflows, whose segments tcp_probe sees and whose transmissions
        // stamp writes. The first subflow: the one fexit on inet_csk_accept is handed, and
        // the only one of a client with one address.
        IPPROTO_MPTCP => {
            let first: u64 = read(sock + offset(&SOCK_WALK_MPTCP_FIRST))?;
            (first != 0 && read::<u16>(first + protocol_at)? == IPPROTO_TCP).then_some(first)
        }
        _ => None,
    }
}
