use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{PerCpuArray, ProgramArray},
    programs::TracePointContext,
};
use inferscope_common::{
    CONN_ID_BIT, CONN_INET, CONN_KNOWN, CONN_SHARED, CONN_TLS, ConnEntry, Counter,
    FLAG_COPY_FAILED, FLAG_TRUNCATED, MAX_CAPTURE_BYTES, StreamTemplate, SyscallKind,
    TOKEN_WRITE_MAX, fd_key,
};

use super::{
    args::Task,
    copy::{ScratchOwner, copy_at},
    emit::{PendingRecord, copy_into, emit_pending, emit_syscall},
    enter::close_fd,
    token::TokenWriter,
};
use crate::{
    counters::bump,
    ctx::field,
    maps::{CONN_REFS, FD_VERDICT, Inflight, SCRATCH, Shape, inflight_entry, insert_conn, traced},
};

// syscalls:sys_exit_* layout: 8 bytes of common fields, the syscall number, then `long ret`.
const RET: usize = 16;
const EAGAIN: i64 = 11;
const EINTR: i64 = 4;

/// Shared by every traced syscall's exit whose entry program saved its arguments: the entry
/// state says what kind of call it was.
#[tracepoint]
pub fn exit_syscall(ctx: TracePointContext) -> u32 {
    let _ = try_exit(&ctx);
    0
}

#[inline(always)]
fn try_exit(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // Untraced processes leave before the hash lookup. (An exit skipped because its process was
    // untraced mid-syscall leaves the entry live; the thread's next traced entry rewrites it.)
    if !traced(tgid) {
        return Ok(());
    }
    let slot = inflight_entry(pid_tgid).ok_or(0)?;
    // SAFETY: only this thread touches its entry (see INFLIGHT).
    let mut inflight = unsafe { *slot };
    if inflight.live == 0 {
        return Ok(());
    }
    // SAFETY: as above: this thread's own entry.
    unsafe { (*slot).live = 0 };
    let ret: i64 = field(ctx, RET);
    // Non-blocking sockets return EAGAIN constantly; it carries no information.
    if ret == -EAGAIN || ret == -EINTR {
        return Ok(());
    }
    let kind = inflight.kind;
    if kind == SyscallKind::Dup as u8 {
        if ret >= 0 {
            dup(tgid, pid_tgid as u32, &inflight, ret as i32);
        }
        return Ok(());
    }
    if kind == SyscallKind::Accept as u8 {
        // Handled by exit_accept; an entry left live here is stale.
        return Ok(());
    }
    if kind == SyscallKind::Read as u8
        && inflight.sock != 0
        && inflight.conn_id != 0
        && inflight.conn_flags & CONN_INET == 0
    {
        learn_sock(tgid, &mut inflight);
    }
    finish(ctx, pid_tgid, &inflight, ret)
}

/// Exits of reads and writes that take their arguments from the thread's saved registers
/// ([`super::args`]), with no entry program: attached instead of the entry programs and
/// `exit_syscall` where the kernel's BTF allows it. A read's time is its exit either way; a
/// write's is when its bytes were transmitted ([`super::xmit`]), which its entry only
/// approximated from before: on loopback its return comes after the reader's own receive.
macro_rules! exit_program {
    ($name:ident, $kind:expr, $shape:expr) => {
        #[tracepoint]
        pub fn $name(ctx: TracePointContext) -> u32 {
            let _ = try_exit_with_args(&ctx, $kind, $shape);
            0
        }
    };
}

exit_program!(exit_read_args, SyscallKind::Read, Shape::Buffer);
exit_program!(exit_readv_args, SyscallKind::Read, Shape::Iovec);
exit_program!(exit_recvmsg_args, SyscallKind::Read, Shape::Msghdr);
exit_program!(exit_write_args, SyscallKind::Write, Shape::Buffer);
exit_program!(exit_writev_args, SyscallKind::Write, Shape::Iovec);
exit_program!(exit_sendmsg_args, SyscallKind::Write, Shape::Msghdr);

#[inline(always)]
fn try_exit_with_args(ctx: &TracePointContext, kind: SyscallKind, shape: Shape) -> Result<(), i32> {
    let task = Task::current();
    let pid_tgid = task.pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return Ok(());
    }
    let ret: i64 = field(ctx, RET);
    // Before the registers are read: a non-blocking server's reads and writes return EAGAIN
    // constantly. (A TLS connection's socket call that moved nothing ties no SSL call either.)
    if ret == -EAGAIN || ret == -EINTR {
        return Ok(());
    }
    let args = task.syscall_args();
    let Some(mut inflight) = super::enter::admit(pid_tgid, tgid, kind, shape, args) else {
        return Ok(());
    };
    if inflight.conn_flags & CONN_TLS != 0 && ret > 0 {
        // Ciphertext (see `finish`): no time needed.
        return Ok(());
    }
    inflight.ts_enter_ns = if kind == SyscallKind::Write && ret > 0 {
        super::xmit::write_time(if inflight.conn_flags & CONN_INET != 0 {
            inflight.sock
        } else {
            0
        })
    } else {
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        unsafe { bpf_ktime_get_ns() }
    };
    inflight.at_exit = 1;
    finish(ctx, pid_tgid, &inflight, ret)
}

/// A read or write of thread `pid_tgid` returned `ret`: a token event joins its batch here;
/// anything else is copied into the scratch and handed to `exit_record`.
#[inline(always)]
fn finish(
    ctx: &TracePointContext,
    pid_tgid: u64,
    inflight: &Inflight,
    ret: i64,
) -> Result<(), i32> {
    let tgid = (pid_tgid >> 32) as u32;
    if inflight.conn_flags & CONN_TLS != 0 && ret > 0 {
        // Ciphertext: the TLS library probes emit this connection's plaintext. Its EOF and
        // errors still go out (the client's end shows there).
        return Ok(());
    }

    let scratch = SCRATCH.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: a per-CPU map value, valid for the map's life; syscall programs run with
    // preemption off and do not nest on a CPU, so this reference is the only one to it.
    let payload = unsafe { &mut (*scratch).payload };
    let copied = match token_candidate(tgid, inflight, ret) {
        Some((key, template)) => {
            let copied = copy_whole(inflight, ret as usize, payload);
            if copied.1 == 0
                && super::token::is_token(template, inflight.conn_id, payload, copied.0)
            {
                let writer = TokenWriter {
                    tgid,
                    fd: inflight.fd,
                    conn_gen: inflight.conn_id,
                    conn_flags: inflight.conn_flags,
                };
                super::token::batch(template, key, &writer, inflight.ts_enter_ns, ret as u32);
                return Ok(());
            }
            copied
        }
        None => copy_into(inflight, ret, payload),
    };
    let pending = PENDING.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: a per-CPU map value; only this run touches it until `exit_record` takes it (the
    // tail call keeps the CPU).
    unsafe { *pending = PendingRecord::new(*inflight, ret, copied, pid_tgid) };
    // SAFETY: a tail call to a program of the same type, with this program's own context.
    unsafe { RECORD_PROGRAM.tail_call(ctx, crate::maps::tail_call_slot()) };
    bump(Counter::RecordsUnsent);
    Ok(())
}

/// The fd's key and the armed template of the connection this write may be a token event of:
/// a write of one buffer, short enough to be one and to be captured whole. Such writes (most of
/// a stream's) are classified here, and a token event joins its connection's batch without the
/// tail call and the hand-over to `exit_record`; anything else (a head, a miss, an unarmed
/// connection) is `exit_record`'s, which classifies it again and records it as before.
#[inline(always)]
fn token_candidate(
    tgid: u32,
    inflight: &Inflight,
    ret: i64,
) -> Option<(u64, &'static mut StreamTemplate)> {
    if inflight.kind != SyscallKind::Write as u8
        || inflight.shape != Shape::Buffer
        || inflight.conn_id == 0
        || ret <= 0
        || ret > TOKEN_WRITE_MAX as i64
        || ret as usize > crate::maps::capture_limit()
    {
        return None;
    }
    let key = fd_key(tgid, inflight.fd);
    let template = super::token::lookup(key, inflight.conn_id)?;
    (template.armed != 0).then_some((key, template))
}

/// [`copy_into`] of a one-buffer write of `len` bytes the capture limit holds.
#[inline(always)]
fn copy_whole(
    inflight: &Inflight,
    len: usize,
    payload: &mut [u8; 2 * MAX_CAPTURE_BYTES],
) -> (usize, u16) {
    let len = if len > TOKEN_WRITE_MAX {
        TOKEN_WRITE_MAX
    } else {
        len
    };
    if copy_at(payload, 0, inflight.ptr, len) {
        return (len, 0);
    }
    bump(Counter::PayloadTruncated);
    bump(Counter::CopyFailed);
    (0, FLAG_TRUNCATED | FLAG_COPY_FAILED)
}

#[map]
static PENDING: PerCpuArray<PendingRecord> = PerCpuArray::with_max_entries(1, 0);

/// `exit_record`, slot 0. The record path is two programs because the verifier walks each
/// path of one program with everything before it: the payload copy's iovec walk times the
/// record's classification (TLS, HTTP/2 preface, response head, token template, ring
/// pressure) took `exit_syscall` to 98 % of the budget of one million instructions on 6.18.
/// User space fills the slot before it attaches `exit_syscall`, or does not start.
#[map]
pub static RECORD_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The second half of a syscall's exit (a tail call from `exit_syscall`): its record, from the
/// payload already in the scratch. Loaded, never attached.
#[tracepoint]
pub fn exit_record(ctx: TracePointContext) -> u32 {
    let _ = try_record(&ctx);
    0
}

#[inline(always)]
fn try_record(ctx: &TracePointContext) -> Result<(), i32> {
    let pending = PENDING.get_ptr(0).ok_or(0)?;
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: as in `try_exit`: this run's own per-CPU values, the hand-over read in place (a
    // copy would take a fifth of the stack).
    let chunks_due = unsafe { emit_pending(&*pending, ScratchOwner::Syscall, &mut *scratch) }?;
    if chunks_due {
        super::copy::emit_due_chunks(ctx);
    }
    Ok(())
}

/// accept/accept4 returned: a new connection. Its own exit program, because it must work even
/// when the accept began before the process was traced (an idle server blocked in accept when
/// the agent attaches): then there is no in-flight entry, only the new fd.
#[tracepoint]
pub fn exit_accept(ctx: TracePointContext) -> u32 {
    let _ = try_exit_accept(&ctx);
    0
}

#[inline(always)]
fn try_exit_accept(ctx: &TracePointContext) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return Ok(());
    }
    let ret: i64 = field(ctx, RET);
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut inflight = Inflight::new(SyscallKind::Accept, Shape::None, -1, 0, 0);
    inflight.ts_enter_ns = now;
    inflight.live = 0;
    if let Some(slot) = inflight_entry(pid_tgid) {
        // SAFETY: only this thread touches its entry (see INFLIGHT).
        let saved = unsafe { *slot };
        if saved.live == 1 && saved.kind == SyscallKind::Accept as u8 {
            inflight = saved;
            // SAFETY: as above: this thread's own entry.
            unsafe { (*slot).live = 0 };
        }
    }
    if ret < 0 {
        return Ok(());
    }
    let fd = ret as i32;
    if inflight.sock == 0 {
        // No socket from fexit on inet_csk_accept (refused, or not a TCP accept): from the fd.
        inflight.sock = super::sock_walk::tcp_socket(fd);
    }
    accepted(tgid, pid_tgid as u32, fd, &mut inflight);
    let scratch = SCRATCH.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: a per-CPU map value, valid for the map's life; syscall programs run with
    // preemption off and do not nest on a CPU, so this reference is the only one to it.
    emit_syscall(
        tgid,
        pid_tgid as u32,
        fd,
        ret,
        &inflight,
        ScratchOwner::Syscall,
        unsafe { &mut *scratch },
    )
    .map(|_| ())
}

/// A new connection on `fd`: from now on the fd names it, whatever the number held before (a
/// file, or a connection whose close the kernel did not see through close(2)).
#[inline(always)]
fn accepted(tgid: u32, tid: u32, fd: i32, inflight: &mut Inflight) {
    let key = fd_key(tgid, fd);
    if crate::maps::conn(key).is_some() {
        // The old connection left without a close we saw (close_range, io_uring): end it.
        let _ = close_fd(tgid, tid, fd);
    }
    let _ = FD_VERDICT.remove(key);
    let mut flags = CONN_KNOWN;
    if inflight.sock != 0 {
        flags |= CONN_INET;
    }
    let entry = ConnEntry {
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        id: unsafe { bpf_ktime_get_ns() } | CONN_ID_BIT,
        sock: inflight.sock,
        flags,
        _pad: 0,
    };
    insert_conn(key, entry);
    bump(Counter::ConnsAccepted);
    inflight.conn_id = entry.id;
    inflight.conn_flags = flags;
}

/// The connection's first TCP read named its socket: the connection map keeps it, so later
/// records (writes too) carry it.
#[inline(always)]
fn learn_sock(tgid: u32, inflight: &mut Inflight) {
    inflight.conn_flags |= CONN_INET;
    if let Some(conn) = crate::maps::conn(fd_key(tgid, inflight.fd)) {
        // SAFETY: map value pointer from the lookup; only the id check matters for a race
        // with a close on another thread (the entry then belongs to nobody).
        unsafe {
            if (*conn).id == inflight.conn_id {
                (*conn).sock = inflight.sock;
                (*conn).flags |= CONN_INET;
            }
        }
    }
    bump(Counter::SockFromRead);
}

/// dup/dup2/dup3 returned `newfd`: it now names what the old fd names (and no longer what it
/// held before, which dup2/dup3 closed).
#[inline(always)]
fn dup(tgid: u32, tid: u32, inflight: &Inflight, newfd: i32) {
    let oldfd = inflight.fd;
    if newfd == oldfd {
        return;
    }
    if inflight.shape == Shape::Iovec {
        let _ = close_fd(tgid, tid, newfd);
    }
    let old_key = fd_key(tgid, oldfd);
    let Some(conn) = crate::maps::conn(old_key) else {
        return;
    };
    // SAFETY: map value pointer from the lookup; a racing close on another thread can only
    // leave an entry the LRU ages out.
    let mut entry = unsafe { *conn };
    let refs = if entry.flags & CONN_SHARED != 0 {
        // SAFETY: the count is copied out at once; a racing close can only make it stale,
        // which ends the connection late (at LRU eviction), never early.
        unsafe { CONN_REFS.get(entry.id) }.copied().unwrap_or(1)
    } else {
        1
    };
    entry.flags |= CONN_SHARED;
    // SAFETY: the same map value pointer as above.
    unsafe { (*conn).flags = entry.flags };
    let _ = CONN_REFS.insert(entry.id, refs + 1, 0);
    insert_conn(fd_key(tgid, newfd), entry);
    bump(Counter::ConnsDuplicated);
}
