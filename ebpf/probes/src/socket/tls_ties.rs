//! Which connection an `SSL*` belongs to (the ties the TLS probes read), and the socket side of
//! TLS: a connection's first bytes that look like a hand-shake, and the thread's socket I/O that
//! ties an untied `SSL*`. No record is written here: the socket programs and the TLS probes
//! both use it, and it uses neither.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::map, maps::LruHashMap};
use inferscope_common::{CONN_PREEXISTING, CONN_TLS, ConnEntry, Counter, TlsKey, TlsTie, fd_key};

use crate::counters::bump;

/// How long after a thread's TLS socket read an untied `SSL*` that reads may take its
/// connection, and after an untied `SSL_write` the thread's next TLS socket write may tie it.
/// The event loop does both within one callback; the bound only keeps a stale memory from
/// tying anything much later.
pub(super) const TIE_WINDOW_NS: u64 = 20_000_000;

/// One thread's TLS state: the SSL call in flight, and the memories that tie memory-BIO
/// objects (see the module doc).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TlsThread {
    pub(super) ssl: u64,
    pub(super) buf: u64,
    /// `size_t *readbytes` / `*written` of the `_ex` forms.
    pub(super) out: u64,
    pub(super) ts_enter_ns: u64,
    pub(super) api: u8,
    /// 1 from the call's entry to its return.
    pub(super) live: u8,
    pub(super) _pad: [u8; 6],
    /// An `SSL_write` (or handshake) of an untied `SSL*` returned: the thread's next TLS socket
    /// write carries its ciphertext.
    pub(super) pending_ssl: u64,
    pub(super) pending_ns: u64,
    /// The thread's last read of a TLS connection's socket.
    pub(super) read_conn: u64,
    pub(super) read_ns: u64,
    pub(super) read_fd: i32,
    pub(super) _pad1: u32,
}

/// Per thread (pid_tgid). LRU: a thread that exits leaves an entry the next ones push out, and
/// every memory in it is bounded in time.
#[map]
pub(super) static TLS_THREADS: LruHashMap<u64, TlsThread> = LruHashMap::with_max_entries(16384, 0);

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
pub(super) const TIE_BY_WRITE_ORDER: u32 = 1;

pub(super) const TIE_BY_READ_ORDER: u32 = 2;

pub(super) const TIE_IN_CALL: u32 = 3;

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
pub(super) fn thread_state(pid_tgid: u64) -> Option<*mut TlsThread> {
    if let Some(ptr) = TLS_THREADS.get_ptr_mut(pid_tgid) {
        return Some(ptr);
    }
    TLS_THREADS.insert(pid_tgid, EMPTY, 0).ok()?;
    TLS_THREADS.get_ptr_mut(pid_tgid)
}

#[inline(always)]
pub(super) fn now() -> u64 {
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    unsafe { bpf_ktime_get_ns() }
}

/// The connection `ssl` is tied to, if the fd still holds it and no other `SSL*` replaced it.
#[inline(always)]
pub(super) fn tied(tgid: u32, ssl: u64) -> Option<(i32, ConnEntry)> {
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
pub(super) fn live_conn(tgid: u32, fd: i32, conn_id: u64) -> Option<ConnEntry> {
    let conn = crate::maps::conn_entry(fd_key(tgid, fd))?;
    (conn.id == conn_id).then_some(conn)
}

/// Ties `ssl` to the TLS connection `conn_id` on `fd` with evidence of `level`, unless that
/// connection has another live `SSL*` tied as surely or more. A weaker tie it replaces is
/// dropped.
#[inline(always)]
pub(super) fn tie(
    tgid: u32,
    ssl: u64,
    fd: i32,
    conn_id: u64,
    level: u32,
) -> Option<(i32, ConnEntry)> {
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
