use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use inferscope_common::{Counter, RecordType, SyscallKind, SyscallRecord, fd_key};

use crate::{
    counters::bump,
    ctx::field,
    maps::{FD_GEN, FD_VERDICT, INFLIGHT, Inflight, Shape, conn_gen, ignored, traced},
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
    if kind != SyscallKind::Accept && ignored(fd_key(tgid, fd)) {
        return Ok(());
    }
    let ptr: u64 = field(ctx, ARG1);
    let iovcnt: u64 = if shape == Shape::Iovec {
        field(ctx, ARG2)
    } else {
        0
    };
    let inflight = Inflight {
        ts_enter_ns: unsafe { bpf_ktime_get_ns() },
        ptr,
        iovcnt,
        fd,
        kind: kind as u8,
        shape,
        live: 1,
        _pad: 0,
    };
    if let Some(slot) = INFLIGHT.get_ptr_mut(&pid_tgid) {
        // Only this thread reads or writes its entry (entry, exit and thread exit all run in
        // its context), so a plain store cannot race.
        unsafe { *slot = inflight };
    } else if INFLIGHT.insert(&pid_tgid, &inflight, 0).is_err() {
        bump(Counter::InflightMapFull);
        warn!(
            ctx,
            "in-flight syscall map full: fd {} of pid {} not captured", fd, tgid
        );
    }
    Ok(())
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

/// A thread's in-flight entry outlives its syscalls (see INFLIGHT); it goes with the thread.
#[tracepoint]
pub fn thread_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // Looked up first: most exiting threads never made a traced syscall, and a lookup is
    // cheaper than a delete that misses.
    if unsafe { INFLIGHT.get(&pid_tgid) }.is_some() {
        let _ = INFLIGHT.remove(&pid_tgid);
    }
    0
}

/// close() needs no exit: the fd is gone either way, and the verdict must not outlive it.
#[tracepoint]
pub fn enter_close(ctx: TracePointContext) -> u32 {
    let _ = try_close(&ctx);
    0
}

#[inline(always)]
fn try_close(ctx: &TracePointContext) -> Result<(), i32> {
    let Some((pid_tgid, tgid)) = traced_tgid() else {
        return Ok(());
    };
    let fd: i64 = field(ctx, ARG0);
    let fd = fd as i32;
    let key = fd_key(tgid, fd);
    let was_ignored = ignored(key);
    let generation = conn_gen(key);
    let _ = FD_VERDICT.remove(&key);
    let _ = FD_GEN.remove(&key);
    if was_ignored {
        return Ok(());
    }
    let ts = unsafe { bpf_ktime_get_ns() };
    let record = SyscallRecord {
        record_type: RecordType::Syscall as u8,
        kind: SyscallKind::Close as u8,
        flags: 0,
        tgid,
        tid: pid_tgid as u32,
        fd,
        ts_enter_ns: ts,
        ts_exit_ns: ts,
        ret: 0,
        captured: 0,
        chunk_offset: 0,
        conn_gen: generation,
    };
    output::<SyscallRecord>(&record, Counter::RecordsEmitted);
    Ok(())
}
