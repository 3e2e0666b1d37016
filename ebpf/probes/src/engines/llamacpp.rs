//! llama.cpp's server (tools/server): `server_task::id` is the struct's first member (an int),
//! read straight from the task the hooked functions receive. User space checks that the ids it
//! sees posted and admitted agree, and reports when they do not.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::uprobe,
    programs::ProbeContext,
};
use inferscope_common::{Counter, RecordType, SchedKind, SchedRecord};

use crate::{counters::bump, maps::TARGETS, ringbuf::output};

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

#[inline(always)]
fn emit_task(kind: SchedKind, task: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if unsafe { TARGETS.get(&tgid) }.is_none() {
        return;
    }
    let Ok(id) = (unsafe { bpf_probe_read_user(task as *const i32) }) else {
        bump(Counter::SchedReadFailed);
        return;
    };
    let record = SchedRecord {
        record_type: RecordType::Sched as u8,
        kind: kind as u8,
        _pad: 0,
        tgid,
        tid: pid_tgid as u32,
        _pad1: 0,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        task_id: id as i64,
    };
    output::<SchedRecord>(&record, Counter::SchedEvents);
}
