//! TLS: plaintext at the library boundary. Uprobes on OpenSSL's `SSL_read[_ex]`,
//! `SSL_write[_ex]` and `SSL_do_handshake` of traced processes hand the plaintext to the same
//! emitter as a socket read or write, as a record of the connection the `SSL*` encrypts; the
//! socket's own ciphertext is not captured once the kernel has seen it is TLS.
//!
//! Tying an `SSL*` to its connection, per thread and without reading OpenSSL's structures
//! (their layout changes between versions):
//! - **Socket BIO** (the library reads and writes the fd itself: blocking servers, C++
//!   servers): the socket syscall happens inside the SSL call, so the call in flight on the
//!   thread names the connection.
//! - **Memory BIO** (Python's `ssl.SSLObject`, which asyncio and uvloop use, so uvicorn, vLLM
//!   and SGLang): ciphertext is moved between the socket and the library by the event loop.
//!   A read ties by order: the loop reads a connection's ciphertext and feeds it to that
//!   connection's `SSL*` before it reads any other socket, so an `SSL*` that reads (or
//!   handshakes) takes the connection of the thread's last TLS socket read. A write ties the
//!   other way: the ciphertext an `SSL_write` produced is the next TLS socket write of the
//!   thread, and only a connection that has no `SSL*` yet can take it.
//!
//! A tie names (fd, connection id) and is checked against the fd's connection at each use, so a
//! freed `SSL*` whose address comes back for a new connection is tied again, never misrouted.
#[cfg(not(feature = "legacy"))]
use aya_ebpf::EbpfContext;
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, uprobe, uretprobe},
    maps::{PerCpuArray, ProgramArray},
    programs::{ProbeContext, RetProbeContext},
};
use inferscope_common::{Counter, SyscallKind, TlsApi, fd_key};

use super::{
    copy::{ScratchOwner, TLS_SCRATCH},
    emit::{PendingRecord, copy_into, emit_control, emit_pending},
    tls_ties::{TIE_BY_READ_ORDER, TIE_WINDOW_NS, TLS_THREADS, now, thread_state, tie, tied},
};
use crate::{
    counters::bump,
    maps::{Inflight, Shape, ignored, traced},
};

/// 1 while a TLS probe run on this CPU builds a record in [`TLS_SCRATCH`]: a second run that
/// preempted it drops its plaintext (counted in `tls_nested`) rather than overwrite the
/// buffer under the first.
#[map]
static TLS_SCRATCH_BUSY: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[cfg(not(feature = "legacy"))]
#[inline(always)]
fn api(ctx: &impl EbpfContext) -> u8 {
    crate::cookie::get(ctx.as_ptr()) as u8
}

/// Entry of every hooked SSL function: saves its arguments for the return. The attach cookie
/// names the function ([`TlsApi`]).
#[cfg(not(feature = "legacy"))]
#[uprobe]
pub fn tls_call(ctx: ProbeContext) -> u32 {
    on_call(&ctx, api(&ctx))
}

/// Return of every hooked SSL function: ties the `SSL*` if it is not yet, and emits the
/// plaintext it moved as a read or write of its connection.
#[cfg(not(feature = "legacy"))]
#[uretprobe]
pub fn tls_return(ctx: RetProbeContext) -> u32 {
    let _ = try_return(&ctx, api(&ctx));
    0
}

/// Kernels without attach cookies (before 5.15; the build for them, feature `legacy`): the entry
/// and return programs once per hooked function, named `tls_call_c<api>` and
/// `tls_return_c<api>` (user space attaches the one for the cookie it would have passed).
macro_rules! per_function {
    ($($api:expr => $call:ident, $ret:ident;)*) => {$(
        #[cfg(feature = "legacy")]
        #[uprobe]
        pub fn $call(ctx: ProbeContext) -> u32 {
            on_call(&ctx, $api as u8)
        }

        #[cfg(feature = "legacy")]
        #[uretprobe]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            let _ = try_return(&ctx, $api as u8);
            0
        }
    )*};
}

per_function! {
    TlsApi::Read => tls_call_c0, tls_return_c0;
    TlsApi::ReadEx => tls_call_c1, tls_return_c1;
    TlsApi::Write => tls_call_c2, tls_return_c2;
    TlsApi::WriteEx => tls_call_c3, tls_return_c3;
    TlsApi::Handshake => tls_call_c4, tls_return_c4;
}

#[inline(always)]
fn on_call(ctx: &ProbeContext, api: u8) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    let Some(state) = thread_state(pid_tgid) else {
        return 0;
    };
    // SAFETY: a map value pointer of this thread's own entry; only this thread's programs
    // write it (a racing LRU eviction can only lose the state, which then ties nothing).
    let state = unsafe { &mut *state };
    let ssl = ctx.arg::<u64>(0).unwrap_or(0);
    if state.live == 1 && api == TlsApi::Handshake as u8 && state.ssl == ssl {
        // A handshake the library runs inside a read or write of the same `SSL*`: the outer
        // call keeps the slot.
        return 0;
    }
    state.ssl = ssl;
    state.buf = ctx.arg::<u64>(1).unwrap_or(0);
    state.out = if api == TlsApi::ReadEx as u8 || api == TlsApi::WriteEx as u8 {
        ctx.arg::<u64>(3).unwrap_or(0)
    } else {
        0
    };
    state.api = api;
    state.live = 1;
    state.ts_enter_ns = now();
    0
}

#[inline(always)]
fn try_return(ctx: &RetProbeContext, api: u8) -> Result<(), i32> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !traced(tgid) {
        return Ok(());
    }
    let state = TLS_THREADS.get_ptr_mut(pid_tgid).ok_or(0)?;
    // SAFETY: this thread's own entry (see `tls_call`).
    let state = unsafe { &mut *state };
    if state.live == 0 || state.api != api {
        // The return of a handshake nested in a read or write, or of a call that began before
        // the probes were attached.
        return Ok(());
    }
    state.live = 0;
    let rc: i32 = ctx.ret::<i32>();
    let bytes: u64 = if api == TlsApi::Read as u8 || api == TlsApi::Write as u8 {
        if rc > 0 { rc as u64 } else { 0 }
    } else if (api == TlsApi::ReadEx as u8 || api == TlsApi::WriteEx as u8) && rc == 1 {
        // SAFETY: the helper checks the user address and fails instead of faulting.
        crate::read::user::<u64>(state.out).unwrap_or(0)
    } else {
        0
    };
    let ssl = state.ssl;
    let ts = now();
    let mut conn = tied(tgid, ssl);
    if conn.is_none() {
        let reads = api == TlsApi::Read as u8 || api == TlsApi::ReadEx as u8;
        let handshake = api == TlsApi::Handshake as u8;
        if (reads || handshake)
            && state.read_conn != 0
            && ts.saturating_sub(state.read_ns) <= TIE_WINDOW_NS
        {
            conn = tie(tgid, ssl, state.read_fd, state.read_conn, TIE_BY_READ_ORDER);
        }
        if conn.is_none() && !reads {
            state.pending_ssl = ssl;
            state.pending_ns = ts;
        }
    }
    if let Some((_, c)) = conn {
        // The read this `SSL*` consumed, and any ciphertext pending before a tied write, are
        // no evidence for another one.
        if c.id == state.read_conn {
            state.read_conn = 0;
        }
        if api == TlsApi::Write as u8 || api == TlsApi::WriteEx as u8 {
            state.pending_ssl = 0;
        }
    }
    if api == TlsApi::Handshake as u8 && rc == 1 {
        if let Some((fd, conn)) = conn {
            // Not a data record: the fd's record numbers do not move.
            let _ = emit_control(
                SyscallKind::Tls,
                tgid,
                pid_tgid as u32,
                fd,
                1,
                conn,
                (0, 0),
                0,
            );
        }
        return Ok(());
    }
    if bytes == 0 {
        return Ok(());
    }
    let Some((fd, conn)) = conn else {
        bump(Counter::TlsUntied);
        return Ok(());
    };
    if ignored(tgid, fd_key(tgid, fd), conn.id) {
        return Ok(());
    }
    let writes = api == TlsApi::Write as u8 || api == TlsApi::WriteEx as u8;
    let inflight = Inflight {
        ts_enter_ns: state.ts_enter_ns,
        ptr: state.buf,
        iovcnt: 0,
        fd,
        kind: if writes {
            SyscallKind::Write as u8
        } else {
            SyscallKind::Read as u8
        },
        shape: Shape::Buffer,
        live: 0,
        wants_sock: 0,
        conn_id: conn.id,
        sock: conn.sock,
        conn_flags: conn.flags,
        at_exit: 0,
        owner: 0,
    };
    bump(Counter::TlsRecords);
    let busy = TLS_SCRATCH_BUSY.get_ptr_mut(0).ok_or(0)?;
    let scratch = TLS_SCRATCH.get_ptr_mut(0).ok_or(0)?;
    let pending = TLS_PENDING.get_ptr_mut(0).ok_or(0)?;
    // SAFETY: per-CPU map values, valid for the maps' life; the busy flag makes this run (and
    // the `tls_record` it tail-calls, which clears it) the only user of the scratch buffer and
    // the hand-over (runs on one CPU do not interleave except by preemption, which the flag
    // catches).
    unsafe {
        if *busy != 0 {
            bump(Counter::TlsNested);
            return Ok(());
        }
        *busy = 1;
        let copied = copy_into(&inflight, bytes as i64, &mut (*scratch).payload);
        *pending = PendingRecord::new(inflight, bytes as i64, copied, pid_tgid);
        TLS_RECORD_PROGRAM.tail_call(ctx, crate::maps::tail_call_slot());
        *busy = 0;
    }
    bump(Counter::RecordsUnsent);
    Ok(())
}

/// What `tls_return` hands `tls_record`, apart from the syscall programs' hand-over: a uprobe
/// run may be preempted by a task whose syscall programs then run on this CPU.
#[map]
static TLS_PENDING: PerCpuArray<PendingRecord> = PerCpuArray::with_max_entries(1, 0);

/// `tls_record`, slot 0: the plaintext's record, apart from the probe that ties it to its
/// connection and copies it, for the verifier's budget (as `exit_record`). User space fills the
/// slot before it attaches any TLS probe.
#[map]
pub static TLS_RECORD_PROGRAM: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The second half of a TLS library call's return (a tail call from `tls_return`): its
/// plaintext's record, from the payload already in the TLS scratch. Loaded, never attached.
#[uretprobe]
pub fn tls_record(_ctx: RetProbeContext) -> u32 {
    let Some(busy) = TLS_SCRATCH_BUSY.get_ptr_mut(0) else {
        return 0;
    };
    if let (Some(pending), Some(scratch)) = (TLS_PENDING.get_ptr(0), TLS_SCRATCH.get_ptr_mut(0)) {
        // SAFETY: per-CPU map values that `tls_return` filled and holds (busy) for this run;
        // the hand-over is read in place. TLS plaintext is sent whole (its chunks never wait).
        let _ = unsafe { emit_pending(&*pending, ScratchOwner::Tls, &mut *scratch) };
    }
    // SAFETY: the per-CPU flag `tls_return` set; this run ends its use of the buffer.
    unsafe { *busy = 0 };
    0
}
