#[cfg(not(feature = "legacy"))]
use aya_ebpf::macros::tracepoint;
use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_loop, bpf_probe_read_user},
    },
    macros::map,
    maps::{HashMap, PerCpuArray, ProgramArray},
    programs::TracePointContext,
};
use inferscope_common::{
    Counter, FLAG_CHUNK, FLAG_COPY_FAILED, FLAG_MORE, FLAG_TRUNCATED, MAX_CAPTURE_BYTES,
    MAX_CHUNKS, MAX_IOV, SyscallRecord,
};

use crate::{
    bound::at_most,
    counters::bump,
    maps::{Inflight, SCRATCH, Scratch, Shape, capture_limit},
    ringbuf::output_bytes,
};

/// Whether this build walks in `bpf_loop` (5.17+): iovec arrays are then walked in it, so every
/// iovec is copied, not only the first [`MAX_IOV`] (gRPC's C core writes a frame header and its
/// payload as two iovecs, so one write of a few frames has more than eight), and a
/// large-capture process's sends and receives past one record are captured in chunk series
/// (grpcio reads up to 64 KiB at once). The build for older kernels (feature `legacy`) has no
/// `bpf_loop` call at all: a program that names a `bpf_loop` callback is refused by kernels
/// before 5.13 (they do not know a function's address as an instruction operand), and an
/// unrolled chunk series took 5.10's verifier past its budget. The agent picks the build by
/// whether the kernel has `bpf_loop`.
const LOOPS: bool = cfg!(not(feature = "legacy"));

/// Iovecs copied at most through `bpf_loop` (Linux's UIO_MAXIOV).
const MAX_LOOP_IOV: u64 = 1024;

/// Processes whose engine IPC the agent decodes (vLLM's ZeroMQ sockets) or that serve HTTP/2
/// (a cut read loses the framing and HPACK state of the rest of the connection), tgid → the most bytes
/// of one send/recv to capture. libzmq batches queued messages into one send of 8 KiB or more
/// and sends a large message whole: for these processes a syscall is captured in
/// `MAX_CAPTURE_BYTES` records (the first flagged [`FLAG_MORE`], the rest [`FLAG_CHUNK`]) that
/// user space joins again. Looked up only for a syscall that moved more than the capture limit.
/// Where the TLS probes build their records: apart from the syscall programs' buffer, because
/// a uprobe program runs with only migration disabled and may be preempted (PREEMPT kernels)
/// by a task whose syscall programs then use the CPU's buffer.
#[map]
pub(super) static TLS_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static LARGE_CAPTURE: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

#[inline(always)]
fn large_capture(tgid: u32) -> Option<u32> {
    // SAFETY: the limit is copied out at once; user space rewriting it meanwhile gives the old
    // or the new value, both valid limits.
    unsafe { LARGE_CAPTURE.get(tgid) }.copied()
}

/// From now on `tgid`'s sends and receives are captured whole (up to the chunk series' most),
/// unless user space already set its limit: a read opened with HTTP/2's client preface, whose
/// client's next frames arrive before user space could say so itself.
#[inline(always)]
pub fn capture_large_from_now(tgid: u32) {
    const BPF_NOEXIST: u64 = 1;
    let limit = (MAX_CHUNKS * MAX_CAPTURE_BYTES) as u32;
    // A full map (user space's limits for 1,024 processes) leaves the process as it was.
    let _ = LARGE_CAPTURE.insert(tgid, limit, BPF_NOEXIST);
}

/// Whether a syscall of this shape can be captured past one record: a plain buffer always,
/// an iovec array where the kernel has `bpf_loop` (the chunk series walks the array in it).
#[inline(always)]
fn chunkable(shape: Shape) -> bool {
    match shape {
        Shape::Buffer => true,
        Shape::Iovec | Shape::Msghdr => looping_iovecs(),
        Shape::None => false,
    }
}

#[inline(always)]
fn looping_iovecs() -> bool {
    LOOPS
}

/// Which per-CPU scratch buffer a record is built in: the syscall programs' (`SCRATCH`) or the
/// TLS probes' (`TLS_SCRATCH`). A `bpf_loop` callback cannot be handed a map value, so it looks
/// its buffer up again: the iovec and chunk walks fill `SCRATCH`, [`tls_chunk_step`] (TLS
/// plaintext, one buffer) `TLS_SCRATCH`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ScratchOwner {
    Syscall = 0,
    Tls = 1,
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

/// Copies `len` bytes of user memory to `payload[offset..]`. The caller keeps
/// `offset < MAX_CAPTURE_BYTES` and `len <= MAX_CAPTURE_BYTES`, which fits the 2×MAX buffer.
#[inline(always)]
pub(super) fn copy_at(
    payload: &mut [u8; 2 * MAX_CAPTURE_BYTES],
    offset: usize,
    src: u64,
    len: usize,
) -> bool {
    if offset >= MAX_CAPTURE_BYTES || len > MAX_CAPTURE_BYTES {
        return false;
    }
    // Restated at the call for 5.10's and 6.1's verifiers, which lose the bounds checked above
    // when the compiler keeps the values on the stack (`crate::bound`); no value changes.
    let (offset, len) = (
        at_most::<{ MAX_CAPTURE_BYTES as u32 - 1 }>(offset),
        at_most::<{ MAX_CAPTURE_BYTES as u32 }>(len),
    );
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
            let Some(iov) = crate::read::user::<u64>(inflight.ptr + MSG_IOV) else {
                out.failed = true;
                out.truncated = true;
                return out;
            };
            let Some(cnt) = crate::read::user::<u64>(inflight.ptr + MSG_IOVLEN) else {
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
        let Some(iov) = crate::read::user::<Iovec>(iov_addr + (i as u64) * 16) else {
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
    if LOOPS && iovcnt > MAX_IOV as u64 && remaining > 0 && offset < limit && !out.failed {
        let mut state = IovLoop {
            iov_addr,
            buf: 0,
            iovcnt,
            remaining,
            skip: 0,
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
    /// The iovec array; 0 for a plain buffer (`buf`, the syscall's whole length: chunk walks
    /// only).
    iov_addr: u64,
    buf: u64,
    iovcnt: u64,
    /// Bytes the syscall moved that the walk has not passed yet.
    remaining: u64,
    /// Bytes to pass over before copying: where a chunk starts (chunk walks only).
    skip: u64,
    /// Bytes copied so far, and the most to copy.
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
    let Some(iov) = crate::read::user::<Iovec>(state.iov_addr + index * 16) else {
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

/// The `i`-th iovec of a chunk's walk (a plain buffer is one iovec): its part past `skip`, up
/// to the chunk's limit; 1 stops the loop.
#[cfg(not(feature = "legacy"))]
#[inline(never)]
extern "C" fn walk_iov_step(i: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes back the context `chunk_series_step` gave it: an `IovLoop` on
    // its stack, alive and not otherwise borrowed during the call.
    let state = unsafe { &mut *ctx.cast::<IovLoop>() };
    let index = u64::from(i);
    if index >= state.iovcnt || state.remaining == 0 || state.offset >= state.limit {
        return 1;
    }
    let iov = if state.iov_addr == 0 {
        Iovec {
            base: state.buf,
            len: state.remaining,
        }
    } else {
        let Some(iov) = crate::read::user::<Iovec>(state.iov_addr + index * 16) else {
            state.failed = 1;
            return 1;
        };
        iov
    };
    let len = if iov.len > state.remaining {
        state.remaining
    } else {
        iov.len
    };
    state.remaining -= len;
    let passed = if len > state.skip { state.skip } else { len };
    state.skip -= passed;
    if len > passed && !copy_part(state, iov.base + passed, len - passed) {
        return 1;
    }
    0
}

/// Copies up to `len` bytes at `base` (as many as the walk's limit leaves room for) into the
/// syscall programs' scratch payload after the bytes already copied; false (flagged failed)
/// when the read fails.
#[cfg(not(feature = "legacy"))]
#[inline(always)]
fn copy_part(state: &mut IovLoop, base: u64, len: u64) -> bool {
    let room = state.limit - state.offset;
    let len = if len > room { room } else { len };
    if len == 0 {
        return true;
    }
    // The same per-CPU scratch the caller fills (the syscall programs' own: they run with
    // preemption off and do not nest on a CPU).
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        state.failed = 1;
        return false;
    };
    // SAFETY: the map value is valid for the program's run; only this call touches it now.
    let payload = unsafe { &mut (*scratch).payload };
    if !copy_at(payload, state.offset as usize, base, len as usize) {
        state.failed = 1;
        return false;
    }
    state.offset += len;
    true
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
    output_bytes::<{ (size_of::<SyscallRecord>() + MAX_CAPTURE_BYTES) as u32 }>(
        bytes,
        Counter::RecordsEmitted,
    )
}

/// Emits the syscall record in `scratch` and, for a large-capture process whose send/recv moved
/// more than one record holds, the rest of its bytes (up to the process's limit) as chunk
/// records. A chunk that cannot be copied ends the series, flagged. False when the first record
/// found no room in the ring buffer.
#[inline(always)]
pub fn emit_chunks(
    scratch: &mut Scratch,
    owner: ScratchOwner,
    captured: usize,
    inflight: &Inflight,
) -> Sent {
    let h = scratch.header;
    // A plain buffer's first record holds a record's worth; an iovec walk's, the usual capture
    // limit (the first walk stays the one every syscall takes: the verifier's budget).
    let whole_first = (captured == MAX_CAPTURE_BYTES
        || (captured > 0 && inflight.shape != Shape::Buffer))
        && chunkable(inflight.shape)
        && h.flags & FLAG_TRUNCATED != 0
        && h.flags & FLAG_COPY_FAILED == 0
        && h.ret > 0;
    let limit = if whole_first {
        large_capture(h.tgid)
    } else {
        None
    };
    let Some(limit) = limit else {
        return Sent::whole(emit(scratch, captured));
    };
    let moved = h.ret as u64;
    let total = if moved < limit as u64 {
        moved
    } else {
        limit as u64
    };
    if total <= captured as u64 {
        return Sent::whole(emit(scratch, captured));
    }
    if !LOOPS {
        // The build for kernels without `bpf_loop`: the first record only, counted.
        bump(Counter::ChunksUnsent);
        return Sent::whole(emit(scratch, captured));
    }
    scratch.header.flags = h.flags | FLAG_MORE;
    let first = emit(scratch, captured);
    if owner == ScratchOwner::Syscall {
        return Sent {
            first,
            chunks_due: defer_chunks(inflight, captured as u64, total, moved),
        };
    }
    // TLS plaintext (one buffer) is sent here, its chunks walked in `bpf_loop`: unrolled, the
    // walk took the TLS record program to two thirds of the verifier's budget.
    let mut series = BufferChunks {
        buf: inflight.ptr,
        total,
        moved,
    };
    // SAFETY: the callback is a static function of the program; its context is `series`, on
    // this stack frame for the whole call.
    unsafe {
        bpf_loop(
            (MAX_CHUNKS - 1) as u32,
            tls_chunk_step as *mut c_void,
            (&mut series as *mut BufferChunks).cast(),
            0,
        );
    }
    Sent::whole(first)
}

/// The rest of a TLS plaintext buffer, sent a record at a time by [`tls_chunk_step`].
#[repr(C)]
struct BufferChunks {
    buf: u64,
    /// Bytes to send in all, and the bytes the call moved.
    total: u64,
    moved: u64,
}

/// Chunk `i + 1` of a TLS plaintext buffer (the first record held chunk 0) into the TLS
/// scratch, whose header the first record left in place, then its record; 1 ends the series.
/// Where a chunk starts comes from the loop's index, not from state the steps carry: the
/// verifier then checks the step once, where a carried offset is a new state at every step.
#[inline(never)]
extern "C" fn tls_chunk_step(i: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes back the context `emit_chunks` gave it: a `BufferChunks` on its
    // stack, alive and not otherwise borrowed during the call.
    let series = unsafe { &*ctx.cast::<BufferChunks>() };
    if i as usize >= MAX_CHUNKS {
        return 1;
    }
    let offset = (u64::from(i) + 1) * MAX_CAPTURE_BYTES as u64;
    if offset >= series.total {
        return 1;
    }
    let Some(scratch) = TLS_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: the TLS scratch, which the calling probe holds (its busy flag) for this run.
    let scratch = unsafe { &mut *scratch };
    if send_buffer_chunk(scratch, series.buf, offset, series.total, series.moved) {
        1
    } else {
        0
    }
}

/// Sends the chunk of a plain buffer at `offset` (of `total` bytes to send, of `moved`) from
/// `scratch`, whose header the first record left in place; true when it was the last (or its
/// copy failed, which ends the series flagged).
#[inline(always)]
fn send_buffer_chunk(scratch: &mut Scratch, buf: u64, offset: u64, total: u64, moved: u64) -> bool {
    let rest = total - offset;
    let len = if rest > MAX_CAPTURE_BYTES as u64 {
        MAX_CAPTURE_BYTES
    } else {
        rest as usize
    };
    let copied = copy_at(&mut scratch.payload, 0, buf + offset, len);
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
    let n = if copied { len } else { 0 };
    scratch.header.flags = flags;
    scratch.header.chunk_offset = offset as u32;
    scratch.header.captured = n as u32;
    emit(scratch, n);
    last
}

/// What [`emit_chunks`] sent.
pub struct Sent {
    /// The first (or only) record found room in the ring buffer.
    pub first: bool,
    /// The rest of the syscall's bytes wait in [`CHUNKS_DUE`] for [`emit_due_chunks`].
    pub chunks_due: bool,
}

impl Sent {
    #[inline(always)]
    fn whole(first: bool) -> Self {
        Self {
            first,
            chunks_due: false,
        }
    }
}

/// The chunk series a syscall program still owes, set by [`emit_chunks`] and sent by
/// [`exit_chunks`], which the program tail-calls at its end.
#[map]
static CHUNKS_DUE: PerCpuArray<ChunkSeries> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn defer_chunks(inflight: &Inflight, captured: u64, total: u64, moved: u64) -> bool {
    let (iov_addr, iovcnt) = match inflight.shape {
        Shape::Buffer => (0, 1),
        Shape::Iovec => (inflight.ptr, inflight.iovcnt),
        Shape::Msghdr => match (
            crate::read::user::<u64>(inflight.ptr + MSG_IOV),
            crate::read::user::<u64>(inflight.ptr + MSG_IOVLEN),
        ) {
            (Some(iov), Some(cnt)) => (iov, cnt),
            // Nothing to walk: the series ends at once, cut.
            _ => (1, 0),
        },
        Shape::None => return false,
    };
    let Some(due) = CHUNKS_DUE.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a per-CPU map value; syscall programs do not nest on a CPU, so only this run
    // touches it until `emit_due_chunks` takes it.
    unsafe {
        *due = ChunkSeries {
            iov_addr,
            buf: inflight.ptr,
            iovcnt: if iovcnt > MAX_LOOP_IOV {
                MAX_LOOP_IOV
            } else {
                iovcnt
            },
            moved,
            total,
            offset: captured,
        };
    }
    true
}

/// The program that sends the chunk series [`emit_chunks`] left due: `exit_syscall` tail-calls
/// it as its last act. Its own program, because the series' nested walks in `exit_syscall`
/// took that program past the verifier's budget of one million instructions. Slot 0; empty (the
/// tail call fails, counted) only if user space could not load it.
#[map]
pub static CHUNK_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Hands the rest of the syscall's bytes to the chunk program; returns only if the tail call
/// failed.
#[inline(always)]
pub fn emit_due_chunks(ctx: &TracePointContext) {
    // SAFETY: a tail call to a program of the same type, with this program's own context.
    unsafe { CHUNK_PROGRAM.tail_call(ctx, crate::maps::tail_call_slot()) };
    bump(Counter::ChunksUnsent);
}

/// Sends the chunk series left due (a tail call from `exit_syscall`) into the syscall programs'
/// scratch, whose header the first record left in place. Loaded, never attached. Not in the
/// build for kernels without `bpf_loop` ([`LOOPS`]).
#[cfg(not(feature = "legacy"))]
#[tracepoint]
pub fn exit_chunks(_ctx: TracePointContext) -> u32 {
    let Some(due) = CHUNKS_DUE.get_ptr_mut(0) else {
        return 0;
    };
    // `bpf_loop` takes its context on the stack only.
    // SAFETY: as in `defer_chunks`: this run's own per-CPU value (the tail call keeps the CPU).
    let mut series = unsafe { *due };
    // SAFETY: the callback is a static function of the program; its context is `series`, on
    // this stack frame for the whole call.
    unsafe {
        bpf_loop(
            MAX_CHUNKS as u32,
            chunk_series_step as *mut c_void,
            (&mut series as *mut ChunkSeries).cast(),
            0,
        );
    }
    0
}

/// A chunk series walked in `bpf_loop`, one chunk per step: each chunk is one walk of the
/// iovec array (a plain buffer is one iovec, `iov_addr` 0) that passes over the bytes already
/// sent and copies the next record's worth into the syscall programs' scratch.
#[repr(C)]
#[derive(Clone, Copy)]
struct ChunkSeries {
    iov_addr: u64,
    buf: u64,
    iovcnt: u64,
    moved: u64,
    total: u64,
    /// Where the next chunk starts in the syscall's bytes.
    offset: u64,
}

/// One chunk: a walk of the iovecs (in a nested `bpf_loop`) that copies the next record's
/// worth into the syscall programs' scratch, then the record; 1 ends the series.
#[cfg(not(feature = "legacy"))]
#[inline(never)]
extern "C" fn chunk_series_step(_: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes back the context `emit_due_chunks` gave it: a `ChunkSeries` on
    // its stack, alive and not otherwise borrowed during the call.
    let series = unsafe { &mut *ctx.cast::<ChunkSeries>() };
    if series.offset >= series.total {
        return 1;
    }
    let rest = series.total - series.offset;
    let mut state = IovLoop {
        iov_addr: series.iov_addr,
        buf: series.buf,
        iovcnt: series.iovcnt,
        remaining: series.moved,
        skip: series.offset,
        offset: 0,
        limit: if rest > MAX_CAPTURE_BYTES as u64 {
            MAX_CAPTURE_BYTES as u64
        } else {
            rest
        },
        failed: 0,
    };
    // SAFETY: as in `copy_payload`: a static callback, its context on this stack frame.
    unsafe {
        bpf_loop(
            series.iovcnt as u32,
            walk_iov_step as *mut c_void,
            (&mut state as *mut IovLoop).cast(),
            0,
        );
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: the map value is valid for the program's run; the caller does not touch it while
    // the loop runs.
    let scratch = unsafe { &mut *scratch };
    // A failed read, or iovecs that held fewer bytes than the syscall moved, end the series
    // with what was copied, flagged.
    let cut = state.failed != 0 || state.offset < state.limit;
    let end = series.offset + state.offset;
    let mut flags = FLAG_CHUNK;
    if !cut && end < series.total {
        flags |= FLAG_MORE;
    } else if end < series.moved {
        flags |= FLAG_TRUNCATED;
    }
    if state.failed != 0 {
        flags |= FLAG_COPY_FAILED;
    }
    let len = if state.offset > MAX_CAPTURE_BYTES as u64 {
        MAX_CAPTURE_BYTES
    } else {
        state.offset as usize
    };
    scratch.header.flags = flags;
    scratch.header.chunk_offset = series.offset as u32;
    scratch.header.captured = len as u32;
    emit(scratch, len);
    series.offset = end;
    if cut { 1 } else { 0 }
}
