//! User-defined probes: one generic program per probe kind (entry, return) reads how to find a
//! request id from a configuration array indexed by the attach cookie, so a spec file can hook
//! any native engine without a new kernel program. Every read of engine memory goes through
//! bpf_probe_read_user: a bad address fails the read (reported to user space, which disables the
//! probe after repeated failures) and never faults the engine.
use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user_str_bytes},
    macros::{map, uprobe, uretprobe},
    maps::{Array, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use inferscope_common::{
    Counter, FNV_OFFSET, FNV_PRIME, MAX_DEREFS, MAX_ID_STRING, MAX_USER_PROBES, RecordType,
    USER_FLAG_NO_VALUE, USER_FLAG_READ_FAILED, USER_SOURCE_ARG, USER_SOURCE_RET, UserProbeConfig,
    UserProbeRecord,
};

use crate::{counters::bump, maps::traced, ringbuf::output};

/// Per-probe configuration, written by user space before it attaches the probe.
#[map]
pub static USER_PROBES: Array<UserProbeConfig> = Array::with_max_entries(MAX_USER_PROBES, 0);

/// Room for one string id per CPU (too large for the 512-byte stack with everything else).
#[map]
static USER_STRING: PerCpuArray<[u8; MAX_ID_STRING]> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn user_probe(ctx: ProbeContext) -> u32 {
    hit(ctx.as_ptr(), ctx.regs);
    0
}

#[uretprobe]
pub fn user_probe_ret(ctx: RetProbeContext) -> u32 {
    hit(ctx.as_ptr(), ctx.regs);
    0
}

#[inline(always)]
fn hit(ctx: *mut core::ffi::c_void, regs: *mut pt_regs) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return;
    }
    let probe = crate::cookie::get(ctx) as u32;
    let Some(config) = USER_PROBES.get(probe) else {
        return;
    };
    let (flags, value) = match read_value(config, regs) {
        Some(Some(v)) => (0, v),
        Some(None) => (USER_FLAG_NO_VALUE, 0),
        None => {
            bump(Counter::SchedReadFailed);
            (USER_FLAG_READ_FAILED, 0)
        }
    };
    let record = UserProbeRecord {
        record_type: RecordType::UserProbe as u8,
        kind: config.kind,
        flags,
        tgid,
        tid: pid_tgid as u32,
        probe,
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        value,
    };
    output::<UserProbeRecord>(&record, Counter::SchedEvents);
}

/// None: a read failed; Some(None): the probe reads nothing.
#[inline(always)]
fn read_value(config: &UserProbeConfig, regs: *mut pt_regs) -> Option<Option<i64>> {
    // The verifier refuses loads from the context at a variable offset, so every register is
    // loaded at its constant offset first and the configured one picked from the copies.
    // SAFETY: `regs` is the probe context's register snapshot, valid for this call.
    let saved: [u64; 7] = unsafe {
        let r = &*regs;
        [
            core::ptr::read_volatile(&r.rdi),
            core::ptr::read_volatile(&r.rsi),
            core::ptr::read_volatile(&r.rdx),
            core::ptr::read_volatile(&r.rcx),
            core::ptr::read_volatile(&r.r8),
            core::ptr::read_volatile(&r.r9),
            core::ptr::read_volatile(&r.rax),
        ]
    };
    let slot = match config.source {
        USER_SOURCE_ARG => config.reg as usize,
        USER_SOURCE_RET => 6,
        _ => return Some(None),
    };
    let mut base = *saved.get(slot)?;
    for i in 0..MAX_DEREFS {
        if i >= config.n_derefs as usize {
            break;
        }
        let addr = base.wrapping_add(config.derefs[i] as i64 as u64);
        // SAFETY: the helper checks the user address and fails instead of faulting.
        base = crate::read::user::<u64>(addr)?;
    }
    if config.final_read == 0 {
        let value = match config.width {
            1 => base & 0xff,
            2 => base & 0xffff,
            4 => base & 0xffff_ffff,
            _ => base,
        };
        return Some(Some(value as i64));
    }
    let addr = base.wrapping_add(config.offset as i64 as u64);
    let value = match config.width {
        // SAFETY: the helper checks the user address and fails instead of faulting.
        1 => crate::read::user::<u8>(addr)? as i64,
        // SAFETY: as above.
        2 => crate::read::user::<u16>(addr)? as i64,
        // SAFETY: as above.
        4 => crate::read::user::<u32>(addr)? as i64,
        // SAFETY: as above.
        8 => crate::read::user::<u64>(addr)? as i64,
        0 => read_string_hash(addr, config.string_len as usize)?,
        _ => return None,
    };
    Some(Some(value))
}

// An index loop with a constant bound is what the verifier accepts here.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn read_string_hash(addr: u64, limit: usize) -> Option<i64> {
    let buf = USER_STRING.get_ptr_mut(0)?;
    // SAFETY: per-CPU scratch, used by one program at a time on this CPU.
    let buf = unsafe { &mut *buf };
    // SAFETY: `buf` is the per-CPU buffer borrowed above; the helper checks the user address,
    // writes at most its length and fails instead of faulting.
    let bytes = unsafe { bpf_probe_read_user_str_bytes(addr as *const u8, buf) }.ok()?;
    let len = bytes.len();
    let mut hash = FNV_OFFSET;
    for i in 0..MAX_ID_STRING {
        if i >= len || i >= limit {
            break;
        }
        hash = (hash ^ buf[i] as u64).wrapping_mul(FNV_PRIME);
    }
    Some(hash as i64)
}
