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
    let ts_exit = unsafe { bpf_ktime_get_ns() };
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
        chunk_offset: 0,
        conn_gen: conn_gen(fd_key(tgid, fd)),
    };
    super::copy::emit_chunks(scratch, captured, &inflight);
    Ok(())
}
