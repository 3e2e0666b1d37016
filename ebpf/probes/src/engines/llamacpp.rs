//! llama.cpp's server (tools/server). The hooked functions receive a `server_task` or a
//! `server_slot`; the programs read the struct's `id` member at the offset user space found in
//! the build's DWARF (both are the structs' first members in the source, so 0 without DWARF),
//! passed in the attach cookie. User space checks that the task ids it sees posted and admitted
//! agree, and reports when they do not.
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::LruHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use inferscope_common::{Counter, RecordType, SchedKind, SchedRecord};

use crate::{counters::bump, maps::traced, ringbuf::output};

/// (tgid, slot id) of slots admitted a task whose first token has not been sent yet. The
/// first-token hook fires for every streamed token; only the first per admission leaves the
/// kernel. LRU: a slot whose request errored out before its first token cannot leak an entry.
#[map]
static AWAITING_FIRST_TOKEN: LruHashMap<u64, u8> = LruHashMap::with_max_entries(4096, 0);

/// `server_queue::post(std::vector<server_task>&&, bool)`, called by the HTTP thread that read
/// the request: the first task's id (a request with n > 1 completions posts several).
#[uprobe]
pub fn llamacpp_post_tasks(ctx: ProbeContext) -> u32 {
    // SysV: rdi = this, rsi = the vector (begin pointer first).
    if let Some(vector) = ctx.arg::<u64>(1) {
        // SAFETY: the helper checks the user address and fails instead of faulting.
        match crate::read::user::<u64>(vector) {
            Some(begin) => {
                if let Some(task) = read_id(begin, task_offset(&ctx)) {
                    emit(SchedKind::TaskPosted, task, -1);
                }
            }
            None => bump(Counter::SchedReadFailed),
        }
    }
    0
}

/// `server_queue::defer(server_task&&)`: no slot was free, the task waits.
#[uprobe]
pub fn llamacpp_defer(ctx: ProbeContext) -> u32 {
    if let Some(task) = ctx.arg::<u64>(1)
        && let Some(id) = read_id(task, task_offset(&ctx))
    {
        emit(SchedKind::TaskDeferred, id, -1);
    }
    0
}

/// `server_context_impl::launch_slot_with_task(server_slot&, server_task&&)`: admission.
#[uprobe]
pub fn llamacpp_admit(ctx: ProbeContext) -> u32 {
    // rdi = this, rsi = slot, rdx = task.
    let (Some(slot), Some(task)) = (ctx.arg::<u64>(1), ctx.arg::<u64>(2)) else {
        return 0;
    };
    let Some(task_id) = read_id(task, task_offset(&ctx)) else {
        return 0;
    };
    let slot_id = read_id(slot, slot_offset(&ctx)).unwrap_or(-1);
    if slot_id >= 0 {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let _ = AWAITING_FIRST_TOKEN.insert(slot_key(tgid, slot_id), 1, 0);
    }
    emit(SchedKind::TaskAdmitted, task_id, slot_id as i32);
    0
}

/// `send_partial_response(server_slot&, const completion_token_output&, bool is_progress,
/// bool is_begin)`: one call per streamed token, plus the prefill-start and progress notices.
#[uprobe]
pub fn llamacpp_partial(ctx: ProbeContext) -> u32 {
    // rcx = is_progress, r8 = is_begin: those calls carry no token.
    let is_progress = ctx.arg::<u64>(3).unwrap_or(1) & 0xff;
    let is_begin = ctx.arg::<u64>(4).unwrap_or(1) & 0xff;
    if is_progress != 0 || is_begin != 0 {
        return 0;
    }
    let Some(slot) = ctx.arg::<u64>(1) else {
        return 0;
    };
    let Some(slot_id) = read_id(slot, slot_offset(&ctx)) else {
        return 0;
    };
    let key = slot_key((bpf_get_current_pid_tgid() >> 32) as u32, slot_id);
    // SAFETY: only whether an entry exists is read, not its value.
    if unsafe { AWAITING_FIRST_TOKEN.get(key) }.is_some() {
        let _ = AWAITING_FIRST_TOKEN.remove(key);
        emit(SchedKind::FirstToken, -1, slot_id as i32);
    }
    0
}

/// `send_final_response(server_slot&)`: the request's last result.
#[uprobe]
pub fn llamacpp_final(ctx: ProbeContext) -> u32 {
    slot_event(&ctx, 1, SchedKind::Finish);
    0
}

/// `server_slot::release()`: the slot is free again.
#[uprobe]
pub fn llamacpp_release(ctx: ProbeContext) -> u32 {
    slot_event(&ctx, 0, SchedKind::SlotReleased);
    0
}

/// `server_queue::pop_deferred_task(int id_slot)`: a freed slot takes a parked task back.
#[uprobe]
pub fn llamacpp_requeue(ctx: ProbeContext) -> u32 {
    let slot = ctx.arg::<u64>(1).map_or(-1, |v| v as i32);
    emit(SchedKind::DeferredRequeued, -1, slot);
    0
}

/// `llama_decode(llama_context*, llama_batch)`: the batch (a struct larger than 16 bytes) is
/// passed in memory on the stack, `n_tokens` first, just above the return address.
#[uprobe]
pub fn llamacpp_decode_begin(ctx: ProbeContext) -> u32 {
    // SAFETY: `regs` points at the probed task's saved registers, valid for the program's run
    // (x86_64 only: the agent refuses to build elsewhere).
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: the helper checks the user address and fails instead of faulting.
    let tokens = match crate::read::user::<i32>(sp + 8) {
        Some(n) => n as i64,
        None => -1,
    };
    emit(SchedKind::StepBegin, tokens, -1);
    0
}

/// `llama_process(...)`: newer builds' step entry point; its batch is opaque.
#[uprobe]
pub fn llamacpp_process_begin(_ctx: ProbeContext) -> u32 {
    emit(SchedKind::StepBegin, -1, -1);
    0
}

/// Return of either step function.
#[uretprobe]
pub fn llamacpp_step_end(ctx: RetProbeContext) -> u32 {
    let rc: i64 = ctx.ret::<i32>() as i64;
    emit(SchedKind::StepEnd, rc, -1);
    0
}

/// An event about the slot in argument `arg`.
#[inline(always)]
fn slot_event(ctx: &ProbeContext, arg: usize, kind: SchedKind) {
    if let Some(slot) = ctx.arg::<u64>(arg)
        && let Some(id) = read_id(slot, slot_offset(ctx))
    {
        emit(kind, -1, id as i32);
    }
}

#[inline(always)]
fn task_offset(ctx: &ProbeContext) -> u64 {
    crate::cookie::get(ctx.as_ptr()) & 0xffff_ffff
}

#[inline(always)]
fn slot_offset(ctx: &ProbeContext) -> u64 {
    crate::cookie::get(ctx.as_ptr()) >> 32
}

#[inline(always)]
fn slot_key(tgid: u32, slot_id: i64) -> u64 {
    (u64::from(tgid) << 32) | u64::from(slot_id as u32)
}

/// The `int id` member at `offset` of the struct at `address`.
#[inline(always)]
fn read_id(address: u64, offset: u64) -> Option<i64> {
    // SAFETY: the helper checks the user address and fails instead of faulting.
    match crate::read::user::<i32>(address + offset) {
        Some(id) => Some(id as i64),
        None => {
            bump(Counter::SchedReadFailed);
            None
        }
    }
}

#[inline(always)]
fn emit(kind: SchedKind, value: i64, slot: i32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return;
    }
    let record = SchedRecord {
        record_type: RecordType::Sched as u8,
        kind: kind as u8,
        _pad: 0,
        tgid,
        tid: pid_tgid as u32,
        slot,
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        task_id: value,
    };
    output::<SchedRecord>(&record, Counter::SchedEvents);
}
