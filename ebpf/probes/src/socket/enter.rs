use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{fexit, tracepoint},
    programs::{FExitContext, TracePointContext},
};
use aya_log_ebpf::warn;
use inferscope_common::{
    AdoptRecord, CONN_INET, CONN_SHARED, CONN_TLS, ConnEntry, Counter, RecordType, SyscallKind,
    fd_key,
};

use super::emit::emit_control;
use crate::{
    counters::bump,
    ctx::field,
    maps::{
        CONN_REFS, FD_VERDICT, Inflight, LOST_CLOSES, Shape, captures_unknown_fds,
        clear_sock_wanted, conn_entry, forget_inflight, ignored, inflight_entry, remove_conn,
        save_inflight, sock_wanted_until, trace, traced, want_sock, watched,
    },
    ringbuf::output,
};

// syscalls:sys_enter_* layout: 8 bytes of common fields, the syscall number, then 8-byte args.
const ARG0: usize = 16;
const ARG1: usize = 24;
const ARG2: usize = 32;

#[inline(always)]
fn traced_tgid() -> Option<(u64, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    traced(tgid).then_some((pid_tgid, tgid))
}

#[inline(always)]
fn save(ctx: &TracePointContext, kind: SyscallKind, shape: Shape) -> Result<(), i32> {
    let Some((pid_tgid, tgid)) = traced_tgid() else {
        return Ok(());
    };
    let fd: i64 = field(ctx, ARG0);
    let fd = fd as i32;
    let mut inflight = if kind == SyscallKind::Read || kind == SyscallKind::Write {
        let args = [fd as u64, field(ctx, ARG1), field(ctx, ARG2)];
        let Some(mut inflight) = admit(pid_tgid, tgid, kind, shape, args) else {
            return Ok(());
        };
        if kind == SyscallKind::Read
            && inflight.conn_id != 0
            && inflight.conn_flags & CONN_INET == 0
        {
            // A connection accepted without fexit: its first TCP read names its socket.
            inflight.wants_sock = 1;
        }
        inflight
    } else {
        // dup2/dup3 name the new fd; dup returns it (and leaves -1 here). Accepts keep nothing.
        let newfd: i64 = match (kind, shape) {
            (SyscallKind::Dup, Shape::Iovec) => field(ctx, ARG1),
            (SyscallKind::Dup, _) => -1,
            _ => 0,
        };
        Inflight::new(kind, shape, fd, newfd as u64, 0)
    };
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    inflight.ts_enter_ns = unsafe { bpf_ktime_get_ns() };
    if !save_inflight(pid_tgid, inflight) {
        bump(Counter::InflightMapFull);
        warn!(
            ctx,
            "in-flight syscall map full: fd {} of pid {} not captured", fd, tgid
        );
        return Ok(());
    }
    if inflight.wants_sock == 1 {
        want_sock(inflight.ts_enter_ns);
    }
    Ok(())
}

/// A read or write of thread `pid_tgid` with arguments `[fd, buffer (or iovec array or
/// msghdr, per `shape`), count]`: the call to capture, not yet stamped, or None when it is not
/// captured (not a connection of a process whose connections the kernel knows, or ignored by
/// user space). Entry and exit programs alike decide here.
#[inline(always)]
pub(super) fn admit(
    pid_tgid: u64,
    tgid: u32,
    kind: SyscallKind,
    shape: Shape,
    [fd, ptr, count]: [u64; 3],
) -> Option<Inflight> {
    let fd = fd as i32;
    let key = fd_key(tgid, fd);
    let mut conn = ConnEntry::default();
    // One lookup tells a connection from everything else, whatever the fd number's past.
    match conn_entry(key) {
        Some(known) => {
            conn = known;
            if ignored(tgid, key, conn.id) {
                return None;
            }
            if conn.flags & CONN_TLS != 0 {
                // Its bytes are ciphertext (not captured past the exit's EOF and error check);
                // the SSL call or event loop moving them may tie its `SSL*`.
                super::tls_ties::on_socket_io(pid_tgid, fd, &conn, kind == SyscallKind::Write);
            }
        }
        None => {
            if !captures_unknown_fds(tgid) {
                bump(Counter::UnknownFdSkipped);
                return None;
            }
            if ignored(tgid, key, 0) {
                return None;
            }
        }
    }
    let iovcnt = if shape == Shape::Iovec { count } else { 0 };
    let mut inflight = Inflight::new(kind, shape, fd, ptr, iovcnt);
    inflight.conn_id = conn.id;
    inflight.sock = conn.sock;
    inflight.conn_flags = conn.flags;
    Some(inflight)
}

macro_rules! entry_program {
    ($name:ident, $kind:expr, $shape:expr) => {
        #[tracepoint]
        pub fn $name(ctx: TracePointContext) -> u32 {
            let _ = save(&ctx, $kind, $shape);
            0
        }
    };
}

entry_program!(enter_read, SyscallKind::Read, Shape::Buffer);
entry_program!(enter_readv, SyscallKind::Read, Shape::Iovec);
entry_program!(enter_recvmsg, SyscallKind::Read, Shape::Msghdr);
entry_program!(enter_write, SyscallKind::Write, Shape::Buffer);
entry_program!(enter_writev, SyscallKind::Write, Shape::Iovec);
entry_program!(enter_sendmsg, SyscallKind::Write, Shape::Msghdr);
entry_program!(enter_accept, SyscallKind::Accept, Shape::None);
// Shape only tells the exit where the new fd comes from: the return value (dup) or the second
// argument (dup2, dup3).
entry_program!(enter_dup, SyscallKind::Dup, Shape::None);
entry_program!(enter_dup2, SyscallKind::Dup, Shape::Iovec);

/// inet_csk_accept returns the accepted TCP socket: the accepting thread's in-flight accept
/// keeps its address for the syscall's exit, which learns the fd it gets. An accept of any
/// other kind of socket (Unix) never passes here and leaves 0. Where BPF trampolines are not
/// allowed, a connection's socket is learnt at its first read instead (`rcv_space_adjust`).
/// Word `N` of a fexit program's context, loaded at a fixed offset: the compiler would fold two
/// `ctx.arg` loads under a branch into one load at a computed offset, which the verifier
/// refuses ("dereference of modified ctx ptr").
#[inline(always)]
fn fexit_arg<const N: usize>(ctx: &FExitContext) -> u64 {
    #[cfg(target_arch = "bpf")]
    {
        let value: u64;
        // SAFETY: an 8-byte load from the program's context at a constant offset, which the
        // verifier checks against the traced function's BTF.
        unsafe {
            core::arch::asm!(
                "{value} = *(u64 *)({ctx} + {offset})",
                ctx = in(reg) aya_ebpf::EbpfContext::as_ptr(ctx),
                offset = const N * 8,
                value = lateout(reg) value,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        value
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        ctx.arg::<u64>(N)
    }
}

/// How many parameters the kernel's `inet_csk_accept` takes (2 or 4; user space reads it from
/// the BTF at load time and attaches this program only for those two).
#[unsafe(no_mangle)]
static ACCEPT_PARAMS: u32 = 2;

#[fexit(function = "inet_csk_accept")]
pub fn accepted_sock(ctx: FExitContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // The return value follows the arguments: inet_csk_accept(struct sock *sk, struct
    // proto_accept_arg *arg) since 6.10, (sk, flags, err, kern) before. A constant to the
    // verifier, which walks only the branch taken (it checks each context load against the
    // function's BTF).
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    let sock = if unsafe { core::ptr::read_volatile(&ACCEPT_PARAMS) } == 4 {
        fexit_arg::<4>(&ctx)
    } else {
        fexit_arg::<2>(&ctx)
    };
    if !traced((pid_tgid >> 32) as u32) && !adopt_at_accept((pid_tgid >> 32) as u32, sock) {
        return 0;
    }
    if let Some(slot) = inflight_entry(pid_tgid) {
        // SAFETY: only this thread touches its entry (see INFLIGHT).
        unsafe {
            if (*slot).live == 1 && (*slot).kind == SyscallKind::Accept as u8 {
                (*slot).sock = sock;
            }
        }
    }
    0
}

/// `struct sock_common.skc_num`: the local port in host order, after the address pair (8
/// bytes), the hash (4) and the remote port (2); unchanged since 2.6.
const SKC_NUM: u64 = 14;

/// An untraced process accepted `sock` (a listening socket it inherited, so no bind of its own
/// was seen): adopted if on a watched port.
#[inline(always)]
fn adopt_at_accept(tgid: u32, sock: u64) -> bool {
    if sock == 0 {
        return false;
    }
    // SAFETY: the helper checks the kernel address and fails instead of faulting.
    match crate::read::kernel::<u16>(sock + SKC_NUM) {
        Some(port) => adopt(tgid, port),
        None => false,
    }
}

/// bind(2) entered: an untraced process binding a watched port (a traced engine's port, kept
/// watched a while after that engine exits) is an engine restarted on its port. It is traced
/// from here on, before it can accept, so the requests it answers before the agent's /proc
/// rescan would find it are followed from their accept. Binds are rare: every process pays.
#[tracepoint]
pub fn enter_bind(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if traced(tgid) {
        return 0;
    }
    let addr: u64 = field(&ctx, ARG1);
    let len: i64 = field(&ctx, ARG2);
    if addr == 0 || len < 4 {
        return 0;
    }
    // sockaddr_in and sockaddr_in6 both hold the family first and the port (network order) at
    // offset 2.
    // SAFETY: the helper checks the user address and fails instead of faulting.
    let Some(family) = crate::read::user::<u16>(addr) else {
        return 0;
    };
    if family != AF_INET && family != AF_INET6 {
        return 0;
    }
    // SAFETY: as above.
    if let Some(port) = crate::read::user::<u16>(addr + 2) {
        adopt(tgid, u16::from_be(port));
    }
    0
}

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// Traces `tgid` if `port` is watched, and asks user space to attach it now. Whether it is
/// traced now.
#[inline(always)]
fn adopt(tgid: u32, port: u16) -> bool {
    if !watched(port) {
        return false;
    }
    trace(tgid);
    let record = AdoptRecord {
        record_type: RecordType::Adopted as u8,
        _pad0: 0,
        local_port: port,
        tgid,
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        ts_ns: unsafe { bpf_ktime_get_ns() },
    };
    output::<AdoptRecord>(&record, Counter::ProcessesAdopted);
    true
}

// tcp:tcp_rcv_space_adjust: `skaddr` leads the record (stable since the tracepoint exists).
const RCV_SKADDR: usize = 8;

/// tcp_recvmsg calls tcp_rcv_space_adjust in the reading thread, inside the read syscall: the
/// thread's in-flight read learns which TCP socket it reads. Files, pipes and Unix sockets
/// never pass here.
#[tracepoint]
pub fn rcv_space_adjust(ctx: TracePointContext) -> u32 {
    // Every TCP read of the host passes here: one inlined array load unless a read waits.
    let until = sock_wanted_until();
    if until == 0 {
        return 0;
    }
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    if unsafe { bpf_ktime_get_ns() } > until {
        // Closed: the next runs return after the load alone, without a helper call. (A read
        // that set it again meanwhile learns its socket at its connection's next read.)
        clear_sock_wanted();
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    if let Some(slot) = inflight_entry(pid_tgid) {
        // SAFETY: only this thread touches its entry (see INFLIGHT).
        unsafe {
            if (*slot).live == 1 && (*slot).wants_sock == 1 && (*slot).sock == 0 {
                (*slot).sock = field(&ctx, RCV_SKADDR);
            }
        }
    }
    0
}

/// A thread's in-flight entry outlives its syscalls (see INFLIGHT); it goes with the thread.
#[tracepoint]
pub fn thread_exit(_ctx: TracePointContext) -> u32 {
    forget_inflight(bpf_get_current_pid_tgid());
    0
}

/// `how` of shutdown(2) that closes nothing the agent cares about (the server's reading side).
const SHUT_RD: i64 = 0;

/// shutdown(fd, SHUT_WR | SHUT_RDWR) by the server: it will answer nothing more on this
/// connection (HTTP servers do it before draining and closing one they will not keep alive).
/// Told at entry like close: whether it succeeds changes nothing downstream.
#[tracepoint]
pub fn enter_shutdown(ctx: TracePointContext) -> u32 {
    let Some((pid_tgid, tgid)) = traced_tgid() else {
        return 0;
    };
    let fd: i64 = field(&ctx, ARG0);
    let how: i64 = field(&ctx, ARG1);
    if how == SHUT_RD {
        return 0;
    }
    let fd = fd as i32;
    let key = fd_key(tgid, fd);
    // Only known connections: user space holds no state for anything else.
    let Some(conn) = conn_entry(key) else {
        return 0;
    };
    if ignored(tgid, key, conn.id) {
        return 0;
    }
    super::token::flush_connection(key, conn.id);
    // Not a data record: the fd's record numbers do not move. A lost one is not kept: the close
    // that follows ends the connection.
    let _ = emit_control(
        SyscallKind::Shutdown,
        tgid,
        pid_tgid as u32,
        fd,
        how,
        conn,
        (0, 0),
        0,
    );
    0
}

/// close() needs no exit: the fd is gone either way, and the verdict must not outlive it.
#[tracepoint]
pub fn enter_close(ctx: TracePointContext) -> u32 {
    let Some((pid_tgid, tgid)) = traced_tgid() else {
        return 0;
    };
    let fd: i64 = field(&ctx, ARG0);
    let _ = close_fd(tgid, pid_tgid as u32, fd as i32);
    0
}

/// The fd `fd` of `tgid` stops naming what it held: its connection ends with its last fd (a
/// close record), a verdict on it goes. Shared by close and by dup2/dup3 onto a used fd.
#[inline(always)]
pub fn close_fd(tgid: u32, tid: u32, fd: i32) -> Result<(), i32> {
    let key = fd_key(tgid, fd);
    let conn = match conn_entry(key) {
        Some(conn) => conn,
        None => {
            if !captures_unknown_fds(tgid) {
                // Not a connection; nothing downstream knows this fd.
                return Ok(());
            }
            ConnEntry::default()
        }
    };
    let was_ignored = ignored(tgid, key, conn.id);
    if conn.id != 0 {
        // Token events still waiting go before the close (and take their record number).
        super::token::forget_connection(key, conn.id);
    }
    // The fd's record numbers end with it, whether or not its connection lives on in a dup.
    let (write_seq, read_seq, lost_heads) = crate::conn_seq::next(key);
    crate::conn_seq::forget(key);
    if conn.id != 0 {
        remove_conn(key);
        if conn.flags & CONN_SHARED != 0
            && let Some(refs) = CONN_REFS.get_ptr_mut(conn.id)
        {
            // SAFETY: a plain counter; racing closes of one connection's fds on two CPUs
            // can only make it end late (at LRU eviction), never early.
            let left = unsafe { *refs }.saturating_sub(1);
            if left > 0 {
                // SAFETY: the same counter as above.
                unsafe { *refs = left };
                let _ = FD_VERDICT.remove(key);
                return Ok(());
            }
            let _ = CONN_REFS.remove(conn.id);
        }
    }
    let _ = FD_VERDICT.remove(key);
    if conn.flags & CONN_TLS != 0 {
        super::tls_ties::forget_conn(tgid, conn.id);
    }
    // A known connection's end is always told (user space holds state for it, ignored or not).
    if was_ignored && conn.id == 0 {
        return Ok(());
    }
    let unsent = emit_control(
        SyscallKind::Close,
        tgid,
        tid,
        fd,
        0,
        conn,
        (write_seq, read_seq),
        lost_heads,
    );
    if let Some(record) = unsent
        && conn.id != 0
    {
        // The ring is full: keep the end of this connection for user space to take later.
        let _ = LOST_CLOSES.insert(conn.id, record, 0);
    }
    Ok(())
}
