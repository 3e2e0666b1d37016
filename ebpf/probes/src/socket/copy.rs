use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_loop, bpf_probe_read_user},
    },
    macros::map,
    maps::HashMap,
};
use inferscope_common::{
    Counter, FLAG_CHUNK, FLAG_COPY_FAILED, FLAG_MORE, FLAG_TRUNCATED, MAX_CAPTURE_BYTES,
    MAX_CHUNKS, MAX_IOV, SyscallRecord,
};

use crate::{
    maps::{Inflight, SCRATCH, Scratch, Shape, capture_limit},
    ringbuf::output,
};

/// Set by user space where the kernel has `bpf_loop` (5.17+): iovecs past the first
/// [`MAX_IOV`] are then copied too (gRPC's C core writes a frame header and its payload as two
/// iovecs, so one write of a few frames has more than eight). A constant at load time: on older
/// kernels the verifier never walks the branch that calls it.
#[unsafe(no_mangle)]
static BPF_LOOP_IOVECS: u32 = 0;

/// Iovecs copied at most through `bpf_loop`, after the first [`MAX_IOV`] (Linux's UIO_MAXIOV).
const MAX_LOOP_IOV: u64 = 1024 - MAX_IOV as u64;

/// Processes whose engine IPC the agent decodes (vLLM's ZeroMQ sockets), tgid → the most bytes
/// of one send/recv to capture. libzmq batches queued messages into one send of 8 KiB or more
/// and sends a large message whole: for these processes a syscall is captured in
/// `MAX_CAPTURE_BYTES` records (the first flagged [`FLAG_MORE`], the rest [`FLAG_CHUNK`]) that
/// user space joins again. Looked up only for a syscall that moved more than the capture limit.
#[map]
pub static LARGE_CAPTURE: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

#[inline(always)]
fn large_capture(tgid: u32) -> Option<u32> {
    // SAFETY: the limit is copied out at once; user space rewriting it meanwhile gives the old
    // or the new value, both valid limits.
    unsafe { LARGE_CAPTURE.get(tgid) }.copied()
}

pub struct Copied {
    pub captured: usize,
    pub truncated: bool,
    pub failed: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Iovec {
    base: u64,
    len: u64,
}

// struct user_msghdr: msg_name, msg_namelen (padded), msg_iov, msg_iovlen, ...
const MSG_IOV: u64 = 16;
const MSG_IOVLEN: u64 = 24;

#[inline(always)]
fn read_user<T: Copy>(addr: u64) -> Option<T> {
    let mut value = core::mem::MaybeUninit::<T>::uninit();
    // SAFETY: the destination is `size_of::<T>()` writable bytes; the helper checks the user
    // address and fails (rc != 0) instead of faulting.
    let rc = unsafe {
        bpf_probe_read_user(
            value.as_mut_ptr().cast(),
            core::mem::size_of::<T>() as u32,
            addr as *const _,
        )
    };
    if rc == 0 {
        // SAFETY: the helper filled all of it, and T is only ever a plain-integer type (u64,
        // Iovec) for which any bytes are a valid value.
        Some(unsafe { value.assume_init() })
    } else {
        None
    }
}

/// Copies `len` bytes of user memory to `payload[offset..]`. The caller keeps
/// `offset < MAX_CAPTURE_BYTES` and `len <= MAX_CAPTURE_BYTES`, which fits the 2×MAX buffer.
#[inline(always)]
fn copy_at(payload: &mut [u8; 2 * MAX_CAPTURE_BYTES], offset: usize, src: u64, len: usize) -> bool {
    if offset >= MAX_CAPTURE_BYTES || len > MAX_CAPTURE_BYTES {
        return false;
    }
    // SAFETY: offset < MAX and len <= MAX (checked above) keep the destination inside the 2×MAX
    // buffer; the helper checks the user address and fails instead of faulting.
    let rc = unsafe {
        bpf_probe_read_user(
            payload.as_mut_ptr().add(offset).cast(),
            len as u32,
            src as *const _,
        )
    };
    rc == 0
}

/// Copies up to the capture limit of the `moved` bytes the syscall transferred.
#[inline(always)]
pub fn copy_payload(
    inflight: &Inflight,
    moved: u64,
    payload: &mut [u8; 2 * MAX_CAPTURE_BYTES],
) -> Copied {
    let mut limit = capture_limit();
    if moved > limit as u64
        && inflight.shape == Shape::Buffer
        && large_capture((bpf_get_current_pid_tgid() >> 32) as u32).is_some()
    {
        limit = MAX_CAPTURE_BYTES;
    }
    let mut out = Copied {
        captured: 0,
        truncated: false,
        failed: false,
    };
    let (iov_addr, iovcnt) = match inflight.shape {
        Shape::Buffer => {
            let len = if moved > limit as u64 {
                limit
            } else {
                moved as usize
            };
            if copy_at(payload, 0, inflight.ptr, len) {
                out.captured = len;
            } else {
                out.failed = true;
            }
            out.truncated = (out.captured as u64) < moved;
            return out;
        }
        Shape::Iovec => (inflight.ptr, inflight.iovcnt),
        Shape::Msghdr => {
            let Some(iov) = read_user::<u64>(inflight.ptr + MSG_IOV) else {
                out.failed = true;
                out.truncated = true;
                return out;
            };
            let Some(cnt) = read_user::<u64>(inflight.ptr + MSG_IOVLEN) else {
                out.failed = true;
                out.truncated = true;
                return out;
            };
            (iov, cnt)
        }
        Shape::None => return out,
    };

    let mut remaining = moved;
    let mut offset = 0usize;
    for i in 0..MAX_IOV {
        if i as u64 >= iovcnt || remaining == 0 || offset >= limit {
            break;
        }
        let Some(iov) = read_user::<Iovec>(iov_addr + (i as u64) * 16) else {
            out.failed = true;
            break;
        };
        let mut len = iov.len;
        if len > remaining {
            len = remaining;
        }
        let room = (limit - offset) as u64;
        if len > room {
            len = room;
        }
        if len > 0 {
            if !copy_at(payload, offset, iov.base, len as usize) {
                out.failed = true;
                break;
            }
            offset += len as usize;
        }
        // Bytes of this iovec past the capture window still count as moved.
        remaining -= if iov.len > remaining {
            remaining
        } else {
            iov.len
        };
    }
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at
    // load time from being folded to the compiled-in default.
    let looping = unsafe { core::ptr::read_volatile(&BPF_LOOP_IOVECS) } != 0;
    if looping && iovcnt > MAX_IOV as u64 && remaining > 0 && offset < limit && !out.failed {
        let mut state = IovLoop {
            iov_addr,
            iovcnt,
            remaining,
            offset: offset as u64,
            limit: limit as u64,
            failed: 0,
        };
        let count = if iovcnt - MAX_IOV as u64 > MAX_LOOP_IOV {
            MAX_LOOP_IOV
        } else {
            iovcnt - MAX_IOV as u64
        };
        // SAFETY: the callback is a static function of the program; its context is `state`,
        // on this stack frame for the whole call.
        unsafe {
            bpf_loop(
                count as u32,
                copy_iov_step as *mut c_void,
                (&mut state as *mut IovLoop).cast(),
                0,
            );
        }
        offset = state.offset as usize;
        out.failed = state.failed != 0;
    }
    out.captured = offset;
    out.truncated = (offset as u64) < moved;
    out
}

/// The copy of iovecs [`MAX_IOV`].. through `bpf_loop`: the verifier checks the callback once,
/// not once per iovec as an unrolled loop.
#[repr(C)]
struct IovLoop {
    iov_addr: u64,
    iovcnt: u64,
    remaining: u64,
    offset: u64,
    limit: u64,
    failed: u64,
}

/// One iovec (the `i`-th after the first [`MAX_IOV`]) into the per-CPU scratch payload, after
/// the bytes already copied; 1 stops the loop.
#[inline(never)]
extern "C" fn copy_iov_step(i: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes back the context `copy_payload` gave it: an `IovLoop` on its
    // stack, alive and not otherwise borrowed during the call.
    let state = unsafe { &mut *ctx.cast::<IovLoop>() };
    let index = MAX_IOV as u64 + u64::from(i);
    if index >= state.iovcnt || state.remaining == 0 || state.offset >= state.limit {
        return 1;
    }
    let Some(iov) = read_user::<Iovec>(state.iov_addr + index * 16) else {
        state.failed = 1;
        return 1;
    };
    let mut len = if iov.len > state.remaining {
        state.remaining
    } else {
        iov.len
    };
    let room = state.limit - state.offset;
    if len > room {
        len = room;
    }
    if len > 0 {
        // The same per-CPU scratch the caller fills (this program's, not preempted: it runs
        // with preemption off until the record is out).
        let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
            state.failed = 1;
            return 1;
        };
        // SAFETY: the map value is valid for the program's run; only this call touches it now.
        let payload = unsafe { &mut (*scratch).payload };
        if !copy_at(payload, state.offset as usize, iov.base, len as usize) {
            state.failed = 1;
            return 1;
        }
        state.offset += len;
    }
    state.remaining -= if iov.len > state.remaining {
        state.remaining
    } else {
        iov.len
    };
    0
}

/// Writes header plus `captured` payload bytes as one ring-buffer record; false when the ring
/// buffer had no room.
#[inline(always)]
pub fn emit(scratch: &Scratch, captured: usize) -> bool {
    let len = if captured > MAX_CAPTURE_BYTES {
        MAX_CAPTURE_BYTES
    } else {
        captured
    };
    let size = core::mem::size_of::<SyscallRecord>() + len;
    // SAFETY: the header plus at most MAX_CAPTURE_BYTES of payload lies inside the scratch
    // value, which `scratch` borrows for the slice's whole life.
    let bytes =
        unsafe { core::slice::from_raw_parts((scratch as *const Scratch).cast::<u8>(), size) };
    output::<[u8]>(bytes, Counter::RecordsEmitted)
}

/// Emits the syscall record in `scratch` and, for a large-capture process whose send/recv moved
/// more than one record holds, the rest of its bytes (up to the process's limit) as chunk
/// records. A chunk that cannot be copied ends the series, flagged. False when the first record
/// found no room in the ring buffer.
#[inline(always)]
pub fn emit_chunks(scratch: &mut Scratch, captured: usize, inflight: &Inflight) -> bool {
    let h = scratch.header;
    let whole_first = captured == MAX_CAPTURE_BYTES
        && inflight.shape == Shape::Buffer
        && h.flags & FLAG_TRUNCATED != 0
        && h.flags & FLAG_COPY_FAILED == 0
        && h.ret > 0;
    let limit = if whole_first {
        large_capture(h.tgid)
    } else {
        None
    };
    let Some(limit) = limit else {
        return emit(scratch, captured);
    };
    let moved = h.ret as u64;
    let total = if moved < limit as u64 {
        moved
    } else {
        limit as u64
    };
    if total <= MAX_CAPTURE_BYTES as u64 {
        return emit(scratch, captured);
    }
    scratch.header.flags = h.flags | FLAG_MORE;
    let first = emit(scratch, captured);
    let mut offset = MAX_CAPTURE_BYTES as u64;
    for _ in 1..MAX_CHUNKS {
        if offset >= total {
            break;
        }
        let rest = total - offset;
        let len = if rest > MAX_CAPTURE_BYTES as u64 {
            MAX_CAPTURE_BYTES
        } else {
            rest as usize
        };
        let copied = copy_at(&mut scratch.payload, 0, inflight.ptr + offset, len);
        let last = offset + len as u64 >= total || !copied;
        let mut flags = FLAG_CHUNK;
        if !last {
            flags |= FLAG_MORE;
        } else if total < moved || !copied {
            flags |= FLAG_TRUNCATED;
        }
        if !copied {
            flags |= FLAG_COPY_FAILED;
        }
        scratch.header.flags = flags;
        scratch.header.chunk_offset = offset as u32;
        let n = if copied { len } else { 0 };
        scratch.header.captured = n as u32;
        emit(scratch, n);
        if !copied {
            break;
        }
        offset += len as u64;
    }
    first
}
