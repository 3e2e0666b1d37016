//! Kernel and graph launches at the CUDA driver's and runtime's entry points, and the names the
//! driver hands kernel handles out under. The attach cookie carries the entry point
//! (`GpuApi`), so one program serves every function with the same argument layout. Every read
//! of the process's memory goes through bpf_probe_read_user: a bad address fails the read and
//! never faults the engine. The probes are attached for one process each (the uprobe's own
//! filter), which may be an engine's worker that the socket layer does not trace (vLLM's
//! EngineCore), so the traced-process bitmap is not asked.
use aya_ebpf::{
    EbpfContext,
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user_str_bytes},
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, LruPerCpuHashMap, PerCpuArray},
    programs::{ProbeContext, RetProbeContext},
};
use inferscope_common::{
    Counter, GpuApi, GpuLaunchRecord, GpuNameCall, GpuNameRecord, LAUNCH_FLAG_READ_FAILED,
    LAUNCH_FLAG_SAMPLED, LAUNCH_SAMPLE_EVERY, LAUNCH_WINDOW_NS, LaunchRate, MAX_KERNEL_NAME,
    NAME_FLAG_TRUNCATED, RecordType,
};

use crate::{counters::bump, ringbuf::output};

/// Launches one process may emit per CPU and [`LAUNCH_WINDOW_NS`] before sampling starts; user
/// space sets it at load time (0: no cap).
#[unsafe(no_mangle)]
pub static LAUNCH_CAP_PER_WINDOW: u32 = 2000;

/// Per process, per CPU: launches in the current window and those skipped since the last
/// emitted record. Per CPU so that concurrent launching threads never race on one counter.
#[map]
static LAUNCH_RATE: LruPerCpuHashMap<u32, LaunchRate> = LruPerCpuHashMap::with_max_entries(4096, 0);

/// A naming call in progress, per thread: where the driver writes the handle, and its name.
#[map]
static NAME_CALLS: LruHashMap<u64, GpuNameCall> = LruHashMap::with_max_entries(4096, 0);

/// One name record being assembled per CPU (too large for the 512-byte stack).
#[map]
static NAME_SCRATCH: PerCpuArray<GpuNameRecord> = PerCpuArray::with_max_entries(1, 0);

/// `cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMem, stream, params,
/// extra)` and `cuLaunchCooperativeKernel` (same arguments less `extra`), with their `_ptsz`
/// forms: six arguments in registers, then blockZ, sharedMem and stream on the stack above the
/// return address.
#[uprobe]
pub fn cuda_launch(ctx: ProbeContext) -> u32 {
    let Some(mut record) = begin(&ctx) else {
        return 0;
    };
    let regs = regs(&ctx);
    record.handle = regs.rdi;
    record.grid = [regs.rsi as u32, regs.rdx as u32, regs.rcx as u32];
    let sp = regs.rsp;
    let block_z = read_u64(sp + 8);
    let shared = read_u64(sp + 16);
    let stream = read_u64(sp + 24);
    match (block_z, shared, stream) {
        (Some(bz), Some(sh), Some(st)) => {
            record.block = [regs.r8 as u32, regs.r9 as u32, bz as u32];
            record.shared_mem = sh as u32;
            record.stream = st;
        }
        _ => {
            record.block = [regs.r8 as u32, regs.r9 as u32, 0];
            record.flags |= LAUNCH_FLAG_READ_FAILED;
        }
    }
    finish(&record);
    0
}

/// `cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, params, extra)`: the config
/// starts with gridDimX..Z, blockDimX..Z, sharedMemBytes (u32 each), then the stream at 32.
/// `cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, args)` has the same
/// layout (its dynamicSmemBytes is a size_t at 24: its low half is read, little-endian).
#[uprobe]
pub fn cuda_launch_ex(ctx: ProbeContext) -> u32 {
    let Some(mut record) = begin(&ctx) else {
        return 0;
    };
    let regs = regs(&ctx);
    record.handle = regs.rsi;
    // SAFETY: the helper checks the user address and fails instead of faulting.
    match crate::read::user::<LaunchConfig>(regs.rdi) {
        Some(c) => {
            record.grid = [c.grid[0], c.grid[1], c.grid[2]];
            record.block = [c.block[0], c.block[1], c.block[2]];
            record.shared_mem = c.shared_mem;
            record.stream = c.stream;
        }
        None => record.flags |= LAUNCH_FLAG_READ_FAILED,
    }
    finish(&record);
    0
}

/// The head of CUDA's `CUlaunchConfig`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    _pad: u32,
    stream: u64,
}

/// `cuGraphLaunch(CUgraphExec, CUstream)` and `cudaGraphLaunch(cudaGraphExec_t, cudaStream_t)`,
/// with their `_ptsz` forms.
#[uprobe]
pub fn cuda_graph_launch(ctx: ProbeContext) -> u32 {
    let Some(mut record) = begin(&ctx) else {
        return 0;
    };
    let regs = regs(&ctx);
    record.handle = regs.rdi;
    record.stream = regs.rsi;
    finish(&record);
    0
}

/// `cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t sharedMem,
/// cudaStream_t stream)`: each 12-byte dim3 travels in two registers (x and y packed, then z),
/// so grid is rsi/rdx, block rcx/r8, args r9, then sharedMem and stream on the stack.
#[uprobe]
pub fn cudart_launch(ctx: ProbeContext) -> u32 {
    let Some(mut record) = begin(&ctx) else {
        return 0;
    };
    let regs = regs(&ctx);
    record.handle = regs.rdi;
    record.grid = [regs.rsi as u32, (regs.rsi >> 32) as u32, regs.rdx as u32];
    record.block = [regs.rcx as u32, (regs.rcx >> 32) as u32, regs.r8 as u32];
    let sp = regs.rsp;
    match (read_u64(sp + 8), read_u64(sp + 16)) {
        (Some(shared), Some(stream)) => {
            record.shared_mem = shared as u32;
            record.stream = stream;
        }
        _ => record.flags |= LAUNCH_FLAG_READ_FAILED,
    }
    finish(&record);
    0
}

/// `cuModuleGetFunction(CUfunction* out, CUmodule, const char* name)` and
/// `cuLibraryGetKernel(CUkernel* out, CUlibrary, const char* name)`; `cuKernelGetFunction(
/// CUfunction* out, CUkernel)` and `cudaGetKernel(cudaKernel_t* out, const void* stub)`: the out
/// pointer and the name (or the kernel, or the stub) are kept for the return.
#[uprobe]
pub fn cuda_name_call(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let regs = regs(&ctx);
    let call = GpuNameCall {
        out: regs.rdi,
        arg: if by_alias(cookie(ctx.as_ptr())) {
            regs.rsi
        } else {
            regs.rdx
        },
        api: cookie(ctx.as_ptr()),
        _pad: [0; 7],
    };
    let _ = NAME_CALLS.insert(pid_tgid, call, 0);
    0
}

/// The naming call returned: on success, the handle it wrote and its name leave the kernel.
#[uretprobe]
pub fn cuda_name_return(ctx: RetProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: the entry is copied out at once; this thread is the only writer of its key.
    let Some(call) = (unsafe { NAME_CALLS.get(pid_tgid) }).copied() else {
        return 0;
    };
    let _ = NAME_CALLS.remove(pid_tgid);
    let rc: i32 = ctx.ret::<i32>();
    if rc != 0 {
        return 0;
    }
    let Some(record) = NAME_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU scratch, used by one program at a time on this CPU.
    let record = unsafe { &mut *record };
    // SAFETY: the helper checks the user address and fails instead of faulting.
    let Some(handle) = crate::read::user::<u64>(call.out) else {
        bump(Counter::GpuNameReadFailed);
        return 0;
    };
    record.record_type = RecordType::GpuName as u8;
    record.api = call.api;
    record.flags = 0;
    record.tgid = (pid_tgid >> 32) as u32;
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    record.ts_ns = unsafe { bpf_ktime_get_ns() };
    record.handle = handle;
    record.name[0] = 0;
    if by_alias(call.api) {
        record.alias = call.arg;
    } else {
        record.alias = 0;
        // SAFETY: the helper checks the user address, writes at most the buffer's length and
        // fails instead of faulting.
        match unsafe { bpf_probe_read_user_str_bytes(call.arg as *const u8, &mut record.name) } {
            Ok(bytes) => {
                if bytes.len() + 1 >= MAX_KERNEL_NAME {
                    record.flags |= NAME_FLAG_TRUNCATED;
                }
            }
            Err(_) => {
                bump(Counter::GpuNameReadFailed);
                return 0;
            }
        }
    }
    output::<GpuNameRecord>(record, Counter::GpuNames);
    0
}

/// Whether naming call `api` resolves a handle given as its second argument (no name string).
#[inline(always)]
fn by_alias(api: u8) -> bool {
    api == GpuApi::CuKernelGetFunction as u8 || api == GpuApi::CudaGetKernel as u8
}

#[inline(always)]
fn cookie(ctx: *mut core::ffi::c_void) -> u8 {
    crate::cookie::get(ctx) as u8
}

#[inline(always)]
fn regs(ctx: &ProbeContext) -> pt_regs {
    // SAFETY: `regs` points at the probed task's saved registers, valid for the program's run
    // (x86_64 only: the agent refuses to build elsewhere).
    unsafe { core::ptr::read_volatile(ctx.regs) }
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: the helper checks the user address and fails instead of faulting.
    crate::read::user::<u64>(addr)
}

/// A launch record, or None when the process is over its launch-rate cap and this launch is not
/// the one in [`LAUNCH_SAMPLE_EVERY`] sampled.
#[inline(always)]
fn begin(ctx: &ProbeContext) -> Option<GpuLaunchRecord> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    let now = unsafe { bpf_ktime_get_ns() };
    let (flags, skipped) = admit(tgid, now)?;
    Some(GpuLaunchRecord {
        record_type: RecordType::GpuLaunch as u8,
        api: cookie(ctx.as_ptr()),
        flags,
        tgid,
        tid: pid_tgid as u32,
        ts_ns: now,
        skipped,
        ..GpuLaunchRecord::default()
    })
}

/// The launch-rate cap: (flags, launches skipped before this one), or None to skip this one.
#[inline(always)]
fn admit(tgid: u32, now: u64) -> Option<(u16, u32)> {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    let cap = unsafe { core::ptr::read_volatile(&LAUNCH_CAP_PER_WINDOW) };
    if cap == 0 {
        return Some((0, 0));
    }
    let Some(rate) = LAUNCH_RATE.get_ptr_mut(tgid) else {
        let fresh = LaunchRate {
            window_start_ns: now,
            in_window: 1,
            skipped: 0,
        };
        let _ = LAUNCH_RATE.insert(tgid, fresh, 0);
        return Some((0, 0));
    };
    // SAFETY: this CPU's copy of the process's entry; one program runs at a time per CPU.
    let rate = unsafe { &mut *rate };
    if now.wrapping_sub(rate.window_start_ns) >= LAUNCH_WINDOW_NS {
        rate.window_start_ns = now;
        rate.in_window = 0;
    }
    rate.in_window = rate.in_window.wrapping_add(1);
    let flags = if rate.skipped > 0 {
        LAUNCH_FLAG_SAMPLED
    } else {
        0
    };
    if rate.in_window <= cap || (rate.in_window - cap) % LAUNCH_SAMPLE_EVERY == 0 {
        let skipped = rate.skipped;
        rate.skipped = 0;
        return Some((flags, skipped));
    }
    rate.skipped = rate.skipped.wrapping_add(1);
    bump(Counter::GpuLaunchesSampledOut);
    None
}

#[inline(always)]
fn finish(record: &GpuLaunchRecord) {
    output::<GpuLaunchRecord>(record, Counter::GpuLaunches);
}
