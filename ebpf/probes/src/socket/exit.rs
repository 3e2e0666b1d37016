use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use inferscope_common::{
    Counter, FLAG_COPY_FAILED, FLAG_TRUNCATED, RecordType, SyscallKind, SyscallRecord, fd_key,
};

use super::copy::copy_payload;
use crate::{
    counters::bump,
    ctx::field,
    maps::{FD_GEN, FD_VERDICT, INFLIGHT, SCRATCH, conn_gen, traced},
};

// syscalls:sys_exit_* layout: 8 bytes of common fields, the syscall number, then `long ret`.
const RET: usize = 16;
const EAGAIN: i64 = 11;
const EINTR: i64 = 4;

/// Shared by every traced syscall's exit: the entry state says what kind of call it was.
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
    let slot = INFLIGHT.get_ptr_mut(&pid_tgid).ok_or(0)?;
    // SAFETY: only this thread touches its entry (see INFLIGHT).
    let inflight = unsafe { *slot };
    if inflight.live == 0 {
        return Ok(());
    }
    unsafe { (*slot).live = 0 };
    let ret: i64 = field(ctx, RET);
    // Non-blocking sockets return EAGAIN constantly; it carries no information.
    if ret == -EAGAIN || ret == -EINTR {
        return Ok(());
    }
    let kind = inflight.kind;
    let mut fd = inflight.fd;
    if kind == SyscallKind::Accept as u8 {
        if ret < 0 {
            return Ok(());
        }
        fd = ret as i32;
        // A new connection on a reused fd number: a new generation, and no old verdict.
        let key = fd_key(tgid, fd);
        let _ = FD_VERDICT.remove(&key);
        let _ = FD_GEN.insert(&key, &unsafe { bpf_ktime_get_ns() }, 0);
    }

    let scratch = SCRATCH.get_ptr_mut(0).ok_or(0)?;
    let scratch = unsafe { &mut *scratch };
    let mut captured = 0usize;
    let mut flags = 0u16;
    if ret > 0 && kind != SyscallKind::Accept as u8 {
        let copy = copy_payload(&inflight, ret as u64, &mut scratch.payload);
        captured = copy.captured;
        if copy.truncated {
            flags |= FLAG_TRUNCATED;
            bump(Counter::PayloadTruncated);
        }
        if copy.failed {
            flags |= FLAG_COPY_FAILED;
            bump(Counter::CopyFailed);
        }
    }
    // Adaptive capture: behind a filling ring, response writes other than heads keep only a
    // prefix (counted as truncation), so a stalled agent loses token text, not requests.
    if kind == SyscallKind::Write as u8
        && captured > crate::ringbuf::PRESSURE_PREFIX
        && crate::ringbuf::under_pressure()
    {
        let p = &scratch.payload;
        let head = p[0] == b'H' && p[1] == b'T' && p[2] == b'T' && p[3] == b'P' && p[4] == b'/';
        if !head {
            captured = crate::ringbuf::PRESSURE_PREFIX;
            if flags & FLAG_TRUNCATED == 0 {
                flags |= FLAG_TRUNCATED;
                bump(Counter::PayloadTruncated);
            }
        }
    }
    let ts_exit = unsafe { bpf_ktime_get_ns() };
    let key = fd_key(tgid, fd);
    let (conn_seq, lost_heads) = crate::conn_seq::take(key, kind == SyscallKind::Accept as u8);
    scratch.header = SyscallRecord {
        record_type: RecordType::Syscall as u8,
        kind,
        flags,
        tgid,
        tid: pid_tgid as u32,
        fd,
        ts_enter_ns: inflight.ts_enter_ns,
        ts_exit_ns: ts_exit,
        ret,
        captured: captured as u32,
        _pad: 0,
        conn_gen: conn_gen(key),
        conn_seq,
        lost_heads,
    };
    if !super::copy::emit(scratch, captured) {
        let head = kind == SyscallKind::Write as u8 && captured >= 5 && {
            let p = &scratch.payload;
            p[0] == b'H' && p[1] == b'T' && p[2] == b'T' && p[3] == b'P' && p[4] == b'/'
        };
        crate::conn_seq::lost(key, head);
    }
    Ok(())
}
