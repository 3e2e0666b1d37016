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
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::{LruHashMap, PerCpuArray, ProgramArray},
    programs::{ProbeContext, RetProbeContext},
};
use inferscope_common::{
    CONN_PREEXISTING, CONN_TLS, ConnEntry, Counter, SyscallKind, TlsApi, TlsKey, TlsTie, fd_key,
};

use super::{
    copy::ScratchOwner,
    enter::emit_control,
    exit::{PendingRecord, copy_into, emit_pending},
};
use crate::{
    counters::bump,
    maps::{Inflight, Scratch, Shape, ignored, traced},
};

/// Where the TLS probes build their records: apart from the syscall programs' buffer, because
/// a uprobe program runs with only migration disabled and may be preempted (PREEMPT kernels)
/// by a task whose syscall programs then use the CPU's buffer.
#[map]
pub(super) static TLS_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// 1 while a TLS probe run on this CPU builds a record in [`TLS_SCRATCH`]: a second run that
/// preempted it drops its plaintext (counted in `tls_nested`) rather than overwrite the
/// buffer under the first.
#[map]
static TLS_SCRATCH_BUSY: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// How long after a thread's TLS socket read an untied `SSL*` that reads may take its
/// connection, and after an untied `SSL_write` the thread's next TLS socket write may tie it.
/// The event loop does both within one callback; the bound only keeps a stale memory from
/// tying anything much later.
const TIE_WINDOW_NS: u64 = 20_000_000;

/// One thread's TLS state: the SSL call in flight, and the memories that tie memory-BIO
/// objects (see the module doc).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TlsThread {
    ssl: u64,
    buf: u64,
    /// `size_t *readbytes` / `*written` of the `_ex` forms.
    out: u64,
    ts_enter_ns: u64,
    api: u8,
    /// 1 from the call's entry to its return.
    live: u8,
    _pad: [u8; 6],
    /// An `SSL_write` (or handshake) of an untied `SSL*` returned: the thread's next TLS socket
    /// write carries its ciphertext.
    pending_ssl: u64,
    pending_ns: u64,
    /// The thread's last read of a TLS connection's socket.
    read_conn: u64,
    read_ns: u64,
    read_fd: i32,
    _pad1: u32,
}

/// Per thread (pid_tgid). LRU: a thread that exits leaves an entry the next ones push out, and
/// every memory in it is bounded in time.
#[map]
static TLS_THREADS: LruHashMap<u64, TlsThread> = LruHashMap::with_max_entries(16384, 0);

/// Per (tgid, `SSL*`): the connection it encrypts.
#[map]
static TLS_TIES: LruHashMap<TlsKey, TlsTie> = LruHashMap::with_max_entries(65536, 0);

/// Per connection id: the `SSL*` tied to it and how surely, so weaker evidence never ties a
/// second one, and a tie that stronger evidence replaced is no longer used. Removed with the
/// connection's close.
#[map]
static TLS_CONN_SSL: LruHashMap<u64, ConnSsl> = LruHashMap::with_max_entries(65536, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct ConnSsl {
    ssl: u64,
    level: u32,
    _pad: u32,
}

/// Tie levels, weakest first. By write order: the thread's next TLS socket write after an
/// untied `SSL_write` (the event loop may flush another connection's buffered ciphertext
/// first). By read order: the thread's last TLS socket read before an `SSL_read` or handshake.
/// In the call: the socket syscall ran inside the SSL call (certain).
const TIE_BY_WRITE_ORDER: u32 = 1;
const TIE_BY_READ_ORDER: u32 = 2;
const TIE_IN_CALL: u32 = 3;

const EMPTY: TlsThread = TlsThread {
    ssl: 0,
    buf: 0,
    out: 0,
    ts_enter_ns: 0,
    api: 0,
    live: 0,
    _pad: [0; 6],
    pending_ssl: 0,
    pending_ns: 0,
    read_conn: 0,
    read_ns: 0,
    read_fd: -1,
    _pad1: 0,
};

#[inline(always)]
fn thread_state(pid_tgid: u64) -> Option<*mut TlsThread> {
    if let Some(ptr) = TLS_THREADS.get_ptr_mut(pid_tgid) {
        return Some(ptr);
    }
    TLS_THREADS.insert(pid_tgid, EMPTY, 0).ok()?;
    TLS_THREADS.get_ptr_mut(pid_tgid)
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    unsafe { bpf_ktime_get_ns() }
}

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

/// The connection `ssl` is tied to, if the fd still holds it and no other `SSL*` replaced it.
#[inline(always)]
fn tied(tgid: u32, ssl: u64) -> Option<(i32, ConnEntry)> {
    let key = TlsKey { ssl, tgid, _pad: 0 };
    // SAFETY: the tie is copied out at once; a racing rewrite gives the old or the new tie,
    // and either is checked against the fd's connection below.
    let tie = unsafe { TLS_TIES.get(key) }.copied()?;
    let conn = live_conn(tgid, tie.fd, tie.conn_id)?;
    // SAFETY: copied out at once, as above.
    if let Some(owner) = unsafe { TLS_CONN_SSL.get(tie.conn_id) }.copied()
        && owner.ssl != ssl
    {
        return None;
    }
    Some((tie.fd, conn))
}

/// The connection fd `fd` of `tgid` holds, if it is still `conn_id`.
#[inline(always)]
fn live_conn(tgid: u32, fd: i32, conn_id: u64) -> Option<ConnEntry> {
    let conn = crate::maps::conn_entry(fd_key(tgid, fd))?;
    (conn.id == conn_id).then_some(conn)
}

/// Ties `ssl` to the TLS connection `conn_id` on `fd` with evidence of `level`, unless that
/// connection has another live `SSL*` tied as surely or more. A weaker tie it replaces is
/// dropped.
#[inline(always)]
fn tie(tgid: u32, ssl: u64, fd: i32, conn_id: u64, level: u32) -> Option<(i32, ConnEntry)> {
    let conn = live_conn(tgid, fd, conn_id)?;
    if conn.flags & CONN_TLS == 0 {
        return None;
    }
    // SAFETY: copied out at once; a racing tie of the same connection gives either owner.
    if let Some(owner) = unsafe { TLS_CONN_SSL.get(conn_id) }.copied()
        && owner.ssl != ssl
    {
        if owner.level >= level && tied(tgid, owner.ssl).is_some_and(|(_, c)| c.id == conn_id) {
            return None;
        }
        let _ = TLS_TIES.remove(TlsKey {
            ssl: owner.ssl,
            tgid,
            _pad: 0,
        });
    }
    let key = TlsKey { ssl, tgid, _pad: 0 };
    // SAFETY: copied out at once.
    if let Some(previous) = unsafe { TLS_TIES.get(key) }.copied()
        && previous.conn_id != conn_id
    {
        // This `SSL*` named another connection (a weaker tie, or an address reused): that
        // connection no longer has it.
        // SAFETY: copied out at once.
        if unsafe { TLS_CONN_SSL.get(previous.conn_id) }.is_some_and(|o| o.ssl == ssl) {
            let _ = TLS_CONN_SSL.remove(previous.conn_id);
        }
    }
    let value = TlsTie { conn_id, fd, level };
    TLS_TIES.insert(key, value, 0).ok()?;
    let owner = ConnSsl {
        ssl,
        level,
        _pad: 0,
    };
    let _ = TLS_CONN_SSL.insert(conn_id, owner, 0);
    bump(Counter::TlsTies);
    Some((fd, conn))
}

/// A TLS connection of `tgid` closed: its `SSL*` is tied to nothing any more.
#[inline(always)]
pub fn forget_conn(tgid: u32, conn_id: u64) {
    // SAFETY: copied out at once.
    if let Some(owner) = unsafe { TLS_CONN_SSL.get(conn_id) }.copied() {
        let key = TlsKey {
            ssl: owner.ssl,
            tgid,
            _pad: 0,
        };
        // SAFETY: copied out at once.
        if unsafe { TLS_TIES.get(key) }.is_some_and(|t| t.conn_id == conn_id) {
            let _ = TLS_TIES.remove(key);
        }
        let _ = TLS_CONN_SSL.remove(conn_id);
    }
}

/// A socket read or write of a TLS connection (`conn`, on `fd`) entered on this thread: the SSL
/// call in flight is doing it (socket BIO), an untied `SSL_write`'s ciphertext is going out
/// (memory BIO), or, for a read, the thread remembers it for the `SSL*` that reads next.
#[inline(always)]
pub fn on_socket_io(pid_tgid: u64, fd: i32, conn: &ConnEntry, write: bool) {
    let tgid = (pid_tgid >> 32) as u32;
    let Some(state) = (if write {
        TLS_THREADS.get_ptr_mut(pid_tgid)
    } else {
        thread_state(pid_tgid)
    }) else {
        return;
    };
    // SAFETY: this thread's own entry (see `tls_call`).
    let state = unsafe { &mut *state };
    if state.live == 1 && state.ssl != 0 {
        if tied(tgid, state.ssl).is_none_or(|(_, c)| c.id != conn.id) {
            let _ = tie(tgid, state.ssl, fd, conn.id, TIE_IN_CALL);
        }
    } else if write && state.pending_ssl != 0 {
        if now().saturating_sub(state.pending_ns) <= TIE_WINDOW_NS
            && tied(tgid, state.pending_ssl).is_none()
        {
            let _ = tie(tgid, state.pending_ssl, fd, conn.id, TIE_BY_WRITE_ORDER);
        }
        state.pending_ssl = 0;
    }
    if !write {
        state.read_fd = fd;
        state.read_conn = conn.id;
        state.read_ns = now();
    }
}

/// Whether captured socket bytes begin with a TLS record header: a content type (change cipher
/// spec, alert, handshake, application data), then version 3.x. No HTTP request or response,
/// HTTP/2 preface or ZMTP greeting begins so.
#[inline(always)]
pub fn looks_like_tls(payload: &[u8], captured: usize) -> bool {
    captured >= 5 && (20..=23).contains(&payload[0]) && payload[1] == 3 && payload[2] <= 4
}

/// Whether these bytes can be where TLS begins on the connection: its first record of their
/// direction, and on a connection seen accepted, the client's ClientHello (a handshake
/// record, holding handshake type 1 where its body was read with its header). A connection joined mid-stream (registered at attach)
/// may show any TLS record first. Later bytes that happen to look like a record header (a
/// binary body, engine IPC) never flag a connection.
#[inline(always)]
pub fn may_begin_tls(
    key: u64,
    write: bool,
    conn_flags: u32,
    payload: &[u8],
    captured: usize,
) -> bool {
    let (next_write, next_read, _) = crate::conn_seq::next(key);
    if (write && next_write != 0) || (!write && next_read != 0) {
        return false;
    }
    if conn_flags & CONN_PREEXISTING != 0 {
        return true;
    }
    // OpenSSL on the socket reads a record's 5-byte header alone first: then the handshake
    // type is not in these bytes yet.
    !write && payload[0] == 22 && (captured < 6 || payload[5] == 1)
}

/// A known connection's socket bytes turned out to be TLS: the connection is flagged (its
/// ciphertext is no longer captured) and tied if an SSL call is doing this very syscall.
/// Whether this call flagged it (and the caller tells user space).
#[inline(always)]
pub fn detected(pid_tgid: u64, fd: i32, conn_id: u64, write: bool) -> Option<ConnEntry> {
    let tgid = (pid_tgid >> 32) as u32;
    let entry = crate::maps::conn(fd_key(tgid, fd))?;
    // SAFETY: a map value pointer from the lookup; the id check keeps a racing close's new
    // connection unflagged.
    let conn = unsafe {
        if (*entry).id != conn_id || (*entry).flags & CONN_TLS != 0 {
            return None;
        }
        (*entry).flags |= CONN_TLS;
        *entry
    };
    bump(Counter::TlsConnections);
    on_socket_io(pid_tgid, fd, &conn, write);
    Some(conn)
}
