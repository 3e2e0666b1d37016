//! llama.cpp's server (tools/server): `server_task::id` is the struct's first member (an int),
//! read straight from the task the hooked functions receive. User space checks that the ids it
//! sees posted and admitted agree, and reports when they do not.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use inferscope_common::{Counter, RecordType, SchedKind, SchedRecord};

use crate::{counters::bump, maps::traced, ringbuf::output};

/// `server_queue::post(std::vector<server_task>&&, bool)`, called by the HTTP thread that read
/// the request: the first task's id (a request with n > 1 completions posts several).
#[uprobe]
pub fn llamacpp_post_tasks(ctx: ProbeContext) -> u32 {
    // SysV: rdi = this, rsi = the vector (begin pointer first).
    if let Some(vector) = ctx.arg::<u64>(1) {
        match unsafe { bpf_probe_read_user(vector as *const u64) } {
            Ok(begin) => emit_task(SchedKind::TaskPosted, begin),
            Err(_) => bump(Counter::SchedReadFailed),
        }
    }
    0
}

/// `server_context_impl::launch_slot_with_task(server_slot&, server_task&&)`: admission.
#[uprobe]
pub fn llamacpp_admit(ctx: ProbeContext) -> u32 {
    // rdi = this, rsi = slot, rdx = task.
    if let Some(task) = ctx.arg::<u64>(2) {
        emit_task(SchedKind::TaskAdmitted, task);
    }
    0
}

/// `llama_decode(llama_context*, llama_batch)`: the batch (a struct larger than 16 bytes) is
/// passed in memory on the stack, `n_tokens` first, just above the return address.
#[uprobe]
pub fn llamacpp_decode_begin(ctx: ProbeContext) -> u32 {
    let sp = unsafe { (*ctx.regs).rsp };
    let tokens = match unsafe { bpf_probe_read_user((sp + 8) as *const i32) } {
        Ok(n) => n as i64,
        Err(_) => -1,
    };
    emit(SchedKind::StepBegin, tokens);
    0
}

/// `llama_process(...)`: newer builds' step entry point; its batch is opaque.
#[uprobe]
pub fn llamacpp_process_begin(_ctx: ProbeContext) -> u32 {
    emit(SchedKind::StepBegin, -1);
    0
}

/// Return of either step function.
#[uretprobe]
pub fn llamacpp_step_end(ctx: RetProbeContext) -> u32 {
    let rc: i64 = ctx.ret::<i32>() as i64;
    emit(SchedKind::StepEnd, rc);
    0
}

#[inline(always)]
fn emit_task(kind: SchedKind, task: u64) {
    let Ok(id) = (unsafe { bpf_probe_read_user(task as *const i32) }) else {
        bump(Counter::SchedReadFailed);
        return;
    };
    emit(kind, id as i64);
}

#[inline(always)]
fn emit(kind: SchedKind, value: i64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return;
    }
    let id = value;
    let record = SchedRecord {
        record_type: RecordType::Sched as u8,
        kind: kind as u8,
        _pad: 0,
        tgid,
        tid: pid_tgid as u32,
        _pad1: 0,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        task_id: id,
    };
    output::<SchedRecord>(&record, Counter::SchedEvents);
}
