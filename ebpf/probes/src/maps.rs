//! Every map has a fixed size; user space may resize EVENTS at load time.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use inferscope_common::{
    COUNTER_SLOTS, ConnEntry, MAX_CAPTURE_BYTES, PORT_WORDS, SyscallKind, SyscallRecord,
    TARGET_WORDS,
};

/// Processes (tgid) whose socket syscalls are captured, one bit per tgid; written by user-space
/// discovery. Every syscall of every process asks it, and an array lookup is inlined by the
/// verifier where a hash lookup is a helper call (~55 ns here).
#[map]
pub static TARGETS: Array<u64> = Array::with_max_entries(TARGET_WORDS, 0);

#[inline(always)]
pub fn traced(tgid: u32) -> bool {
    match TARGETS.get(tgid >> 6) {
        Some(word) => (*word >> (tgid & 63)) & 1 != 0,
        None => false,
    }
}

/// Starts tracing `tgid` from the kernel (see `adopt`). A plain read-modify-write: user space
/// writes these words the same way, and a lost race only leaves the process to discovery,
/// which sets the bit again when it attaches.
#[inline(always)]
pub fn trace(tgid: u32) {
    if let Some(word) = TARGETS.get_ptr_mut(tgid >> 6) {
        // SAFETY: a plain u64 map value.
        unsafe { *word |= 1u64 << (tgid & 63) };
    }
}

/// Local TCP ports whose incoming segments are timestamped (the traced servers' listen ports),
/// one bit per port: every received segment on the host asks it (inlined array lookup).
#[map]
pub static PORTS: Array<u64> = Array::with_max_entries(PORT_WORDS, 0);

#[inline(always)]
pub fn watched(port: u16) -> bool {
    match PORTS.get(u32::from(port) >> 6) {
        Some(word) => (*word >> (port & 63)) & 1 != 0,
        None => false,
    }
}

/// Processes whose fds the kernel does not know (not accepted since the agent attached, not
/// registered as pre-existing) are still captured, one bit per tgid: engines whose internal
/// IPC (Unix sockets, outgoing connections) the agent decodes. Elsewhere such fds are files,
/// pipes, eventfds or client sockets, and are skipped in the kernel.
#[map]
pub static UNKNOWN_FDS: Array<u64> = Array::with_max_entries(TARGET_WORDS, 0);

#[inline(always)]
pub fn captures_unknown_fds(tgid: u32) -> bool {
    match UNKNOWN_FDS.get(tgid >> 6) {
        Some(word) => (*word >> (tgid & 63)) & 1 != 0,
        None => false,
    }
}

/// Processes for which user space has issued verdicts (FD_VERDICT), one bit per tgid: the
/// verdict lookup is skipped for the others (an HTTP server's connections rarely get one).
#[map]
pub static VERDICT_PIDS: Array<u64> = Array::with_max_entries(TARGET_WORDS, 0);

/// Until when (CLOCK_MONOTONIC ns) a read may be waiting to learn its connection's socket (no
/// fexit at accept): tcp_rcv_space_adjust, which runs on every TCP read of the host, returns
/// at once outside that window. Set, never counted down: concurrent plain stores only move it
/// within the same few milliseconds.
#[map]
pub static SOCK_WANTED_UNTIL: Array<u64> = Array::with_max_entries(1, 0);

/// How long after a read's entry its socket may still be learnt. The socket matters for the
/// wire arrival of bytes that sat in the buffer before the read, and such a read returns at
/// once; a read that blocks longer returns when the bytes arrive (its own time is then the
/// arrival) and the connection learns its socket at its next read.
pub const SOCK_WANTED_NS: u64 = 10_000_000;

#[inline(always)]
pub fn want_sock(now_ns: u64) {
    if let Some(ptr) = SOCK_WANTED_UNTIL.get_ptr_mut(0) {
        // SAFETY: a plain u64 map value; racing stores all hold about the same time.
        unsafe { *ptr = now_ns + SOCK_WANTED_NS };
    }
}

#[inline(always)]
pub fn clear_sock_wanted() {
    if let Some(ptr) = SOCK_WANTED_UNTIL.get_ptr_mut(0) {
        // SAFETY: as in `want_sock`.
        unsafe { *ptr = 0 };
    }
}

#[inline(always)]
pub fn sock_wanted_until() -> u64 {
    SOCK_WANTED_UNTIL.get(0).copied().unwrap_or(0)
}

/// Per (tgid, fd): the connection id user space wants ignored (not an HTTP server connection;
/// 0 for an fd the kernel does not know). It applies only while the fd still holds that
/// connection. LRU so leaked entries can never fill it.
#[map]
pub static FD_VERDICT: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// Per (tgid, fd): the connection the fd holds, from its accept (or dup) on, for an fd whose
/// slot in [`CONN_SLOTS`] another fd holds; user space adds the connections that predate the
/// agent here. Removed at close. LRU: a process that exits with open connections leaves
/// entries the next ones push out.
#[map]
pub static CONNS: LruHashMap<u64, ConnEntry> = LruHashMap::with_max_entries(65536, 0);

/// The connections the kernel saw accepted (or dup'd), by a hash of (tgid, fd), each tagged
/// with its key: every read and write of a traced process asks which connection its fd holds,
/// and an array access is inlined by the verifier where [`CONNS`]' lookup is a helper call
/// (~50 ns here). An fd whose slot another fd of a traced process holds goes to [`CONNS`]. A
/// connection is in its slot when the slot names it, else in [`CONNS`] (or unknown). A slot
/// of a process no longer traced (it exited: its fds closed without close(2)) is taken over.
#[map]
pub static CONN_SLOTS: Array<ConnSlot> = Array::with_max_entries(CONN_SLOT_COUNT, 0);

const CONN_SLOT_COUNT: u32 = 1 << 16;

/// A slot of [`CONN_SLOTS`]: the connection fd `key` (`fd_key`) holds
/// (0: free).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ConnSlot {
    key: u64,
    entry: ConnEntry,
    /// The fd's record numbers ([`crate::conn_seq`]), here while the slot names the fd: one
    /// lookup the verifier inlines per record instead of a hash lookup.
    seq: ConnSeq,
}

#[inline(always)]
fn conn_slot(key: u64) -> Option<*mut ConnSlot> {
    // The top bits of a multiplicative hash: tgid and fd both spread over the slots.
    let index = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as u32;
    CONN_SLOTS.get_ptr_mut(index & (CONN_SLOT_COUNT - 1))
}

/// An fd's record numbers (see [`crate::conn_seq`]): kept here, in the map values that hold
/// them, so the maps need nothing from the numbering.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ConnSeq {
    /// Number of the next write record on this fd.
    pub next_write: u32,
    /// Records lost on this fd whose payload began with `HTTP/` (a response head).
    pub lost_heads: u32,
    /// Number of the next read record on this fd.
    pub next_read: u32,
    pub _pad: u32,
}

/// The record numbers of fd `key` if its slot names it ([`ConnSlot::seq`]).
#[inline(always)]
pub fn slot_seq(key: u64) -> Option<*mut ConnSeq> {
    let slot = conn_slot(key)?;
    // SAFETY: a map value pointer from the lookup; the tag is read once.
    unsafe { (core::ptr::read_volatile(&(*slot).key) == key).then(|| &mut (*slot).seq as *mut _) }
}

/// The connection fd `key` (`fd_key`) holds, if the kernel knows one: a pointer into its map
/// value, valid for the program's run, for changing it in place ([`conn_entry`] copies it).
#[inline(always)]
pub fn conn(key: u64) -> Option<*mut ConnEntry> {
    if let Some(slot) = conn_slot(key) {
        // SAFETY: a map value pointer from the lookup; the tag is read once.
        unsafe {
            if core::ptr::read_volatile(&(*slot).key) == key {
                return Some(&mut (*slot).entry);
            }
        }
    }
    CONNS.get_ptr_mut(key)
}

/// A copy of the connection fd `key` holds, if the kernel knows one (a racing close or accept on
/// another CPU can only give the old or the new connection, which verdicts and user space
/// tolerate).
#[inline(always)]
pub fn conn_entry(key: u64) -> Option<ConnEntry> {
    // SAFETY: a map value pointer from the lookup, copied out at once.
    conn(key).map(|entry| unsafe { *entry })
}

/// Fd `key` now holds connection `entry` (an accept, a dup): its slot if free, already its
/// own or left by a process no longer traced, else [`CONNS`].
#[inline(always)]
pub fn insert_conn(key: u64, entry: ConnEntry) {
    if let Some(slot) = conn_slot(key) {
        // SAFETY: a map value pointer from the lookup. The entry is written before the tag,
        // so a reader that sees the tag reads this entry.
        unsafe {
            let held = core::ptr::read_volatile(&(*slot).key);
            if held == key || held == 0 || !traced((held >> 32) as u32) {
                (*slot).entry = entry;
                // A new connection on the fd (accept) or a new fd (dup) numbers from 0.
                (*slot).seq = ConnSeq::default();
                core::ptr::write_volatile(&mut (*slot).key, key);
                // Two colliding accepts on two CPUs in the same instant may interleave their
                // stores: then neither keeps the slot and both go to the hash.
                if core::ptr::read_volatile(&(*slot).key) == key
                    && core::ptr::read_volatile(&(*slot).entry.id) == entry.id
                {
                    // A registration user space made for this fd (an older connection) goes.
                    let _ = CONNS.remove(key);
                    return;
                }
                if core::ptr::read_volatile(&(*slot).key) == key {
                    core::ptr::write_volatile(&mut (*slot).key, 0);
                }
            }
        }
    }
    let _ = CONNS.insert(key, entry, 0);
}

/// Fd `key` holds no connection any more (close).
#[inline(always)]
pub fn remove_conn(key: u64) {
    if let Some(slot) = conn_slot(key) {
        // SAFETY: a map value pointer from the lookup.
        unsafe {
            if core::ptr::read_volatile(&(*slot).key) == key {
                core::ptr::write_volatile(&mut (*slot).key, 0);
            }
        }
    }
    let _ = CONNS.remove(key);
}

/// Close records of known connections that did not fit in the ring buffer, by connection id:
/// user space takes them once it has read the ring empty, so a connection whose last records
/// and close were all dropped still learns its end, and the record numbers and lost heads its
/// close carries (answered requests it would never see counted otherwise). LRU: beyond 4,096
/// waiting, the oldest go, and their connections end only at shutdown (`events_lost`).
#[map]
pub static LOST_CLOSES: LruHashMap<u64, SyscallRecord> = LruHashMap::with_max_entries(4096, 0);

/// Per (tgid, fd): the connection id user space found carrying engine IPC (a ZeroMQ tcp://
/// connection the engine accepted), which the adaptive capture must never cut. Applies only
/// while the fd holds that connection; LRU so leaked entries can never fill it.
#[map]
pub static KEEP_WHOLE: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// Per connection id, for connections held by several fds (dup): how many. The connection ends
/// when the last one closes.
#[map]
pub static CONN_REFS: LruHashMap<u64, u32> = LruHashMap::with_max_entries(16384, 0);

/// Whether user space asked to ignore connection `id` on fd `key` of `tgid`.
#[inline(always)]
pub fn ignored(tgid: u32, key: u64, id: u64) -> bool {
    let any = match VERDICT_PIDS.get(tgid >> 6) {
        Some(word) => (*word >> (tgid & 63)) & 1 != 0,
        None => false,
    };
    if !any {
        return false;
    }
    // SAFETY: the verdict is copied out at once; user space rewriting it meanwhile gives the old or
    // the new verdict, either valid.
    match unsafe { FD_VERDICT.get(key) } {
        Some(ignored_id) => *ignored_id == id,
        None => false,
    }
}

/// Syscall arguments saved at entry, consumed at exit: for a thread whose slot in
/// [`INFLIGHT_SLOTS`] another thread's live entry holds, keyed by pid_tgid. A thread's entry is
/// rewritten in place at each syscall and only marked consumed at exit: a hash update costs
/// ~170 ns and a delete ~130 ns here, a lookup ~55 ns. Entries go when the thread exits
/// (`thread_exit`).
#[map]
pub static INFLIGHT: HashMap<u64, Inflight> = HashMap::with_max_entries(16384, 0);

/// Slots of in-flight syscalls by the low bits of the thread id, each tagged with its thread
/// (`owner`): an array lookup the verifier inlines, where [`INFLIGHT`]'s hash lookup is a helper
/// call, twice per syscall. A thread takes its slot when it owns it or the slot holds no live
/// entry; two threads 65,536 ids apart both mid-syscall put the second in [`INFLIGHT`]. The
/// entry of a thread is in its slot when the slot names it, else in [`INFLIGHT`].
#[map]
pub static INFLIGHT_SLOTS: Array<Inflight> = Array::with_max_entries(INFLIGHT_SLOT_COUNT, 0);

const INFLIGHT_SLOT_COUNT: u32 = 1 << 16;

#[inline(always)]
fn inflight_slot(pid_tgid: u64) -> Option<*mut Inflight> {
    INFLIGHT_SLOTS.get_ptr_mut((pid_tgid as u32) & (INFLIGHT_SLOT_COUNT - 1))
}

/// This thread's in-flight entry (live or consumed), wherever it is.
#[inline(always)]
pub fn inflight_entry(pid_tgid: u64) -> Option<*mut Inflight> {
    if let Some(slot) = inflight_slot(pid_tgid) {
        // SAFETY: a map value pointer from the lookup; the tag is read once (a colliding
        // thread rewriting the slot meanwhile leaves a tag that is not ours).
        if unsafe { core::ptr::read_volatile(&(*slot).owner) } == pid_tgid {
            return Some(slot);
        }
    }
    INFLIGHT.get_ptr_mut(pid_tgid)
}

/// Saves this thread's entry at syscall entry: its slot if the slot names it or holds no live
/// entry, else [`INFLIGHT`]. False when [`INFLIGHT`] is full.
#[inline(always)]
pub fn save_inflight(pid_tgid: u64, mut inflight: Inflight) -> bool {
    inflight.owner = pid_tgid;
    if let Some(slot) = inflight_slot(pid_tgid) {
        // SAFETY: a map value pointer from the lookup. Only the owner writes a slot it owns;
        // two colliding threads taking a free slot at the same instant is the one race (the
        // later store wins, the other's exit finds neither entry and emits nothing).
        unsafe {
            if (*slot).owner == pid_tgid || (*slot).live == 0 {
                *slot = inflight;
                return true;
            }
        }
    }
    if let Some(entry) = INFLIGHT.get_ptr_mut(pid_tgid) {
        // SAFETY: only this thread reads or writes its entry (entry, exit and thread exit all
        // run in its context), so a plain store cannot race.
        unsafe { *entry = inflight };
        return true;
    }
    INFLIGHT.insert(pid_tgid, inflight, 0).is_ok()
}

/// The thread exited: its slot (if it names it) and its [`INFLIGHT`] entry go.
#[inline(always)]
pub fn forget_inflight(pid_tgid: u64) {
    if let Some(slot) = inflight_slot(pid_tgid) {
        // SAFETY: a map value pointer from the lookup; only its owner clears it.
        unsafe {
            if (*slot).owner == pid_tgid {
                (*slot).owner = 0;
                (*slot).live = 0;
            }
        }
    }
    // Looked up first: most exiting threads never made a traced syscall, and a lookup is
    // cheaper than a delete that misses.
    // SAFETY: only whether an entry exists is read, not its value.
    if unsafe { INFLIGHT.get(pid_tgid) }.is_some() {
        let _ = INFLIGHT.remove(pid_tgid);
    }
}

/// One record being assembled per CPU: header plus room for two capture windows, so the
/// verifier can prove `offset < MAX` plus `len <= MAX` stays inside.
#[map]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// How the syscall passes its buffer.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// read/recvfrom/write/sendto: one buffer.
    Buffer = 0,
    /// readv/writev: an iovec array and its length.
    Iovec = 1,
    /// recvmsg/sendmsg: a user_msghdr that holds the iovec array.
    Msghdr = 2,
    /// accept/accept4: no payload.
    None = 3,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Inflight {
    pub ts_enter_ns: u64,
    /// Buffer, iovec array or msghdr pointer, per `shape`.
    pub ptr: u64,
    pub iovcnt: u64,
    pub fd: i32,
    pub kind: u8,
    pub shape: Shape,
    /// 1 from entry until the exit consumes it.
    pub live: u8,
    /// 1 when this read's connection has no known socket yet (see SOCK_WANTED_UNTIL).
    pub wants_sock: u8,
    /// The connection the fd held at entry (see CONNS); for accept, `sock` is filled in by
    /// fexit on inet_csk_accept.
    pub conn_id: u64,
    pub sock: u64,
    pub conn_flags: u32,
    /// 1 when the arguments were taken at the exit (no entry program ran): then `ts_enter_ns`
    /// is a read's exit time or a write's transmission (or return), and the record's time.
    pub at_exit: u32,
    /// The thread (pid_tgid) whose entry this is: set by [`save_inflight`].
    pub owner: u64,
}

impl Inflight {
    /// A live call of `kind` on `fd`, not yet stamped, of no known connection.
    #[inline(always)]
    pub fn new(kind: SyscallKind, shape: Shape, fd: i32, ptr: u64, iovcnt: u64) -> Self {
        Self {
            ts_enter_ns: 0,
            ptr,
            iovcnt,
            fd,
            kind: kind as u8,
            shape,
            live: 1,
            wants_sock: 0,
            conn_id: 0,
            sock: 0,
            conn_flags: 0,
            at_exit: 0,
            owner: 0,
        }
    }
}

#[repr(C)]
pub struct Scratch {
    pub header: SyscallRecord,
    pub payload: [u8; 2 * MAX_CAPTURE_BYTES],
}

// `copy::emit` sends the header and the payload as one slice: the payload follows the header
// with no padding between. (The token check's word loads need no alignment: `token::word_at`.)
const _: () =
    assert!(core::mem::offset_of!(Scratch, payload) == core::mem::size_of::<SyscallRecord>());

/// Payload prefix captured per syscall; user space overrides it at load time.
#[unsafe(no_mangle)]
pub static CAPTURE_BYTES: u32 = 4096;

#[inline(always)]
pub fn capture_limit() -> usize {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    let configured = unsafe { core::ptr::read_volatile(&CAPTURE_BYTES) } as usize;
    if configured > MAX_CAPTURE_BYTES {
        MAX_CAPTURE_BYTES
    } else {
        configured
    }
}

/// The slot of every tail call (0), read at run time from a map. With a key the verifier
/// cannot know, the JIT emits an indirect tail call instead of patching a direct jump into the
/// caller and tracking the caller in the program array: with the direct jumps, a program array
/// of an agent killed under load (kill -9) sometimes stayed in the kernel, emptied and
/// referenced by nothing visible, for good (6.18; reproduced by
/// `reliability::kill_9_leaves_nothing_attached` beside a CPU hog).
#[map]
static TAIL_CALL_SLOT: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn tail_call_slot() -> u32 {
    TAIL_CALL_SLOT.get(0).copied().unwrap_or(0)
}
