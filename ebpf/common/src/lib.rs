//! Records that cross the kernel/user boundary. Both sides compile this crate, so a layout change
//! breaks the build instead of silently corrupting the stream. Every record starts with a
//! one-byte [`RecordType`] so the reader can dispatch on the ring buffer's raw bytes.
#![no_std]

/// Largest payload prefix one syscall record can carry. The per-CPU scratch buffer is twice this
/// so that the verifier can prove `offset < MAX && len <= MAX` stays in bounds.
pub const MAX_CAPTURE_BYTES: usize = 8192;
/// Queued ring-buffer bytes past which the kernel's adaptive capture cuts response writes (the
/// agent is behind; it is woken every 256 KiB queued and drains a healthy ring to near empty):
/// an eighth of the ring, so that most of it fills with cut records and a stall lasts longer
/// before records are lost, but never under 1 MiB (a busy healthy agent may lag that much, and
/// cutting costs response fields) unless that is more than a quarter of a small ring.
pub fn pressure_bytes(ring_bytes: u32) -> u32 {
    const FLOOR: u32 = 1 << 20;
    (ring_bytes / 8).max(FLOOR).min(ring_bytes / 4)
}

/// iovec entries copied per readv/writev/sendmsg/recvmsg (later entries are counted as truncated).
pub const MAX_IOV: usize = 8;

/// Words of the traced-process bitmap (one bit per tgid): covers PID_MAX_LIMIT (2^22) on 64-bit.
pub const TARGET_WORDS: u32 = 1 << 16;
/// Words of the watched-port bitmap (one bit per TCP port).
pub const PORT_WORDS: u32 = 1 << 10;

/// Leading byte of every ring-buffer record.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordType {
    Syscall = 1,
    Segment = 2,
    Sched = 3,
    UserProbe = 4,
    /// A [`CompactWriteRecord`]: a response write captured behind a filling ring buffer.
    CompactWrite = 5,
    /// An [`AdoptRecord`]: the kernel began tracing a process at its accept on a watched port.
    Adopted = 6,
    /// A [`SockStateRecord`]: a TCP state change of a socket on a watched port.
    SockState = 8,
    /// A [`GpuLaunchRecord`]: a kernel or graph launch seen by a uprobe on the CUDA driver or
    /// runtime.
    GpuLaunch = 9,
    /// A [`GpuNameRecord`]: the driver handed out a kernel handle under a name.
    GpuName = 10,
    /// A [`TokenBatchRecord`]: consecutive token events of one connection, sent as one record.
    TokenBatch = 11,
}

/// Which socket operation a [`SyscallRecord`] describes.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallKind {
    Accept = 1,
    Read = 2,
    Write = 3,
    Close = 4,
    /// dup/dup2/dup3: never emitted, only kept between entry and exit in the kernel.
    Dup = 5,
    /// shutdown(2) of a connection's sending side by the server (`ret` holds `how`): what the
    /// server reads after it is the client's last bytes, drained before the close, never
    /// answered.
    Shutdown = 6,
    /// The connection's bytes are TLS records (the kernel saw a record header where HTTP would
    /// begin): from here on its socket reads and writes are not captured (ciphertext), only
    /// their ends (EOF, errors); its plaintext comes from uprobes on the process's TLS library
    /// as Read and Write records of the same connection. Carries no payload. `ret` 1 instead
    /// tells that the server's TLS handshake on the connection completed (the request that
    /// follows arrived after the handshake's segments).
    Tls = 7,
}

impl SyscallKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Accept),
            2 => Some(Self::Read),
            3 => Some(Self::Write),
            4 => Some(Self::Close),
            6 => Some(Self::Shutdown),
            7 => Some(Self::Tls),
            _ => None,
        }
    }
}

/// The payload prefix is shorter than what the syscall moved (capture limit or iovec limit).
pub const FLAG_TRUNCATED: u16 = 1;
/// Copying from user memory failed; the payload is absent though the syscall moved bytes.
pub const FLAG_COPY_FAILED: u16 = 2;
/// More records of the same syscall follow (a large send of a process with large captures,
/// see `LARGE_CAPTURE`), each a [`FLAG_CHUNK`] record of this thread.
pub const FLAG_MORE: u16 = 4;
/// This record continues the previous syscall record of its thread at byte `chunk_offset`.
pub const FLAG_CHUNK: u16 = 8;
/// Most records one syscall of a large-capture process is split into: up to
/// `MAX_CHUNKS * MAX_CAPTURE_BYTES` (128 KiB) of one send or receive.
pub const MAX_CHUNKS: usize = 16;

/// The kernel saw this connection accepted (or user space registered it as pre-existing): the
/// record's `conn_id` names it, whatever fd number it has now.
pub const CONN_KNOWN: u32 = 1;
/// A TCP socket: fexit on inet_csk_accept saw the accept return it, or tcp_rcv_space_adjust
/// saw a read of it; `sock` is its address.
pub const CONN_INET: u32 = 2;
/// The connection existed before the agent attached: user space found it in /proc and
/// registered it; it has no socket address, so arrivals join by peer address.
pub const CONN_PREEXISTING: u32 = 4;
/// The fd was duplicated (dup/dup2/dup3): several fds name this connection.
pub const CONN_SHARED: u32 = 8;
/// The connection speaks TLS (see [`SyscallKind::Tls`]): its Read and Write records hold the
/// plaintext the TLS library handed over, not the socket's bytes.
pub const CONN_TLS: u32 = 16;

/// The TLS library function a probe sits on (its attach cookie).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsApi {
    /// `int SSL_read(SSL *ssl, void *buf, int num)`: bytes read, or <= 0.
    Read = 0,
    /// `int SSL_read_ex(SSL *ssl, void *buf, size_t num, size_t *readbytes)`: 1 and
    /// `*readbytes`, or 0.
    ReadEx = 1,
    /// `int SSL_write(SSL *ssl, const void *buf, int num)`.
    Write = 2,
    /// `int SSL_write_ex(SSL *ssl, const void *buf, size_t num, size_t *written)`.
    WriteEx = 3,
    /// `int SSL_do_handshake(SSL *ssl)` (SSL_accept and SSL_connect call it): ties a new
    /// `SSL*` to its connection before any data moves.
    Handshake = 4,
}

impl TlsApi {
    pub const ALL: [TlsApi; 5] = [
        TlsApi::Read,
        TlsApi::ReadEx,
        TlsApi::Write,
        TlsApi::WriteEx,
        TlsApi::Handshake,
    ];

    pub fn symbol(self) -> &'static str {
        match self {
            TlsApi::Read => "SSL_read",
            TlsApi::ReadEx => "SSL_read_ex",
            TlsApi::Write => "SSL_write",
            TlsApi::WriteEx => "SSL_write_ex",
            TlsApi::Handshake => "SSL_do_handshake",
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    pub fn reads(self) -> bool {
        matches!(self, TlsApi::Read | TlsApi::ReadEx)
    }

    pub fn writes(self) -> bool {
        matches!(self, TlsApi::Write | TlsApi::WriteEx)
    }
}

/// Per (tgid, `SSL*`): the connection a TLS library object was tied to (see `TLS_TIES`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsKey {
    pub ssl: u64,
    pub tgid: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsTie {
    pub conn_id: u64,
    pub fd: i32,
    /// How sure the tie is (the kernel's `TIE_*` levels): a weaker tie never replaces a
    /// stronger one of the same connection.
    pub level: u32,
}

/// What the kernel knows about the connection an fd holds, per (tgid, fd).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnEntry {
    /// Unique per connection (bit 63 set, so it never equals an fd number).
    pub id: u64,
    /// The kernel's `struct sock` address (0 when unknown): joins TCP segments to it.
    pub sock: u64,
    pub flags: u32,
    pub _pad: u32,
}

/// Bit set in every connection id, kernel- or user-assigned.
pub const CONN_ID_BIT: u64 = 1 << 63;

/// One socket syscall of a traced process, followed in the ring buffer by `captured` payload bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallRecord {
    pub record_type: u8,
    pub kind: u8,
    pub flags: u16,
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    /// CLOCK_MONOTONIC at syscall entry (bpf_ktime_get_ns).
    pub ts_enter_ns: u64,
    /// CLOCK_MONOTONIC at syscall exit.
    pub ts_exit_ns: u64,
    /// The syscall's return value: bytes moved, the new fd for accept, or -errno.
    pub ret: i64,
    /// Payload bytes that follow this header.
    pub captured: u32,
    /// `CONN_*` flags of the connection (0: an fd the kernel does not know).
    pub conn_flags: u32,
    /// The connection's id ([`ConnEntry::id`]), 0 for an fd the kernel does not know. Verdicts
    /// name it, so a late verdict never hits a reused fd number.
    pub conn_gen: u64,
    /// The connection's `struct sock` address, 0 when unknown. For a close, `ret` is 0.
    pub sock: u64,
    /// Number of this record among the fd's records of its direction (reads and writes are
    /// numbered apart, from 0 at accept), lost ones included: a jump tells user space this
    /// connection lost records. Apart, because a reading and a writing thread of one connection
    /// (HTTP/2, TLS) each number in their own order. A close carries the next write number.
    pub conn_seq: u32,
    /// Lost records on this fd so far whose payload began a response head (`HTTP/`).
    pub lost_heads: u32,
    /// For a [`FLAG_CHUNK`] record: where its payload starts in the syscall's bytes.
    pub chunk_offset: u32,
    /// For a close: the next read number (`conn_seq` holds the next write number). 0 elsewhere.
    pub read_seq: u32,
}

/// A response write on a known connection, captured while the ring buffer is filling (the agent
/// is behind): only the fields user space reads for a write, in half a [`SyscallRecord`],
/// followed by `captured` payload bytes (at most the adaptive capture's prefix). Behind a
/// stalled agent most records are token writes cut to a prefix, so their header is most of
/// the ring buffer's bytes: halving it lets twice as many requests through a stall.
/// Its thread, exit time and socket are not kept (a write's time is its entry; the
/// connection's socket came with its earlier records).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CompactWriteRecord {
    pub record_type: u8,
    /// [`FLAG_TRUNCATED`] and [`FLAG_COPY_FAILED`].
    pub flags: u8,
    /// Payload bytes that follow this header.
    pub captured: u8,
    /// `CONN_*` flags of the connection (all fit in a byte).
    pub conn_flags: u8,
    pub tgid: u32,
    pub fd: i32,
    /// Bytes the write moved (a write that failed or moved more takes a full record).
    pub ret: u32,
    /// CLOCK_MONOTONIC at syscall entry.
    pub ts_enter_ns: u64,
    /// As [`SyscallRecord::conn_gen`] (never 0 here: only known connections are compacted).
    pub conn_gen: u64,
    /// As [`SyscallRecord::conn_seq`]: compact and full records share the fd's numbering.
    pub conn_seq: u32,
    /// As [`SyscallRecord::lost_heads`].
    pub lost_heads: u32,
}

/// Bytes of one side (prefix or suffix) of a [`StreamTemplate`], in 8-byte words.
pub const TEMPLATE_WORDS: usize = 32;
/// Bytes of one side of a [`StreamTemplate`].
pub const TEMPLATE_BYTES: usize = TEMPLATE_WORDS * 8;
/// Longest token text (the bytes between a template's prefix and suffix) the kernel checks.
pub const TOKEN_TEXT_MAX: usize = 64;
/// Longest write the kernel summarises as a token event.
pub const TOKEN_WRITE_MAX: usize = 2 * TEMPLATE_BYTES + TOKEN_TEXT_MAX + 16;

/// What one streamed token event of a connection looks like, from user space (which decoded
/// such events in full first): the chunk's data is `prefix`, then 1 to [`TOKEN_TEXT_MAX`]
/// bytes of token text without a `"`, then `suffix`. A mask byte of 0xff must match, 0 is free
/// (bytes that differ between responses: ids, timestamps; and the tail of the last word).
/// A connection's copy sits in one of two slots its id picks, valid for connection `conn_gen`
/// on fd `key` only; the process's (user space's) has both 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StreamTemplate {
    pub conn_gen: u64,
    /// Changes with every install: a reader that sees it change knows the value under it was
    /// rewritten while it compared.
    pub version: u32,
    pub prefix_len: u16,
    pub suffix_len: u16,
    /// Kernel-owned: 0 after a response head or a write the template did not match, 1 once
    /// the next write went out whole (the first body write carries the response's id, which
    /// user space reads once per response).
    pub armed: u8,
    pub _pad: [u8; 7],
    /// Kernel-owned: the (tgid, fd) ([`fd_key`]) of the connection holding the slot.
    pub key: u64,
    pub prefix: [u64; TEMPLATE_WORDS],
    pub prefix_mask: [u64; TEMPLATE_WORDS],
    pub suffix: [u64; TEMPLATE_WORDS],
    pub suffix_mask: [u64; TEMPLATE_WORDS],
    /// Kernel-owned: the connection's token events not yet sent (zero in user space's copy).
    pub batch: TokenBatch,
}

/// Token events a [`TokenBatch`] holds before it is sent.
pub const TOKEN_BATCH_MAX: usize = 32;

/// Consecutive token events of one connection, written as one record: 8 bytes per token
/// instead of a 48-byte record each. Each event keeps its own time to the nanosecond and its
/// size, which is all user space reads of a token event; the record goes out ahead of any other
/// record of the connection (a write that is not a token event, a failed write, a read, a
/// response head, shutdown, close), when it is full, or with the event that finds it spanning
/// the agent's poll period (not while the ring is past its pressure mark).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenBatchRecord {
    pub record_type: u8,
    /// Events that follow (1 to [`TOKEN_BATCH_MAX`]).
    pub count: u8,
    /// `CONN_*` flags of the connection (all fit in a byte).
    pub conn_flags: u8,
    pub _pad0: u8,
    pub tgid: u32,
    pub fd: i32,
    pub _pad1: u32,
    /// As [`SyscallRecord::conn_gen`].
    pub conn_gen: u64,
    /// CLOCK_MONOTONIC at the first event's write entry; each event's offset is from it.
    pub first_ts_ns: u64,
    /// As [`SyscallRecord::conn_seq`]: one number for the whole batch, taken when it is sent.
    pub conn_seq: u32,
    /// As [`SyscallRecord::lost_heads`].
    pub lost_heads: u32,
}

/// One token event of a [`TokenBatchRecord`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenBatchEntry {
    /// Nanoseconds from the batch's `first_ts_ns` to this write's entry.
    pub offset_ns: u32,
    /// Bytes the write moved.
    pub bytes: u32,
}

/// A [`TokenBatchRecord`] and room for its events, in the order they go into the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TokenBatch {
    pub header: TokenBatchRecord,
    pub entries: [TokenBatchEntry; TOKEN_BATCH_MAX],
}

const _: () = assert!(
    TOKEN_BATCH_MAX <= u8::MAX as usize
        && TOKEN_BATCH_MAX.is_power_of_two()
        && core::mem::size_of::<TokenBatchRecord>() == 40
        && core::mem::offset_of!(TokenBatch, entries) == core::mem::size_of::<TokenBatchRecord>()
        && TOKEN_WRITE_MAX <= u32::MAX as usize
);

/// A TCP segment with payload that reached a traced listening port (tcp:tcp_probe). It tells
/// when a request's bytes arrived, before a busy server got around to reading them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SegmentRecord {
    pub record_type: u8,
    pub _pad0: u8,
    /// AF_INET or AF_INET6.
    pub family: u16,
    pub data_len: u32,
    pub ts_ns: u64,
    pub local_port: u16,
    pub remote_port: u16,
    pub _pad1: u32,
    /// The remote address as the tracepoint gives it: a `sockaddr_in` or `sockaddr_in6`.
    pub remote_sockaddr: [u8; 28],
    pub _pad2: u32,
    /// The receiving socket's `struct sock` address: joins the segment to its connection.
    pub sock: u64,
}

/// tcp:tcp_probe's field offsets in the layout most kernels have (sockaddr_in6-sized addresses,
/// then sport, dport, family, mark and data_len). User space reads the real offsets from the
/// tracepoint's format; when they are these, the program loads the fields in place (the
/// verifier allows only constant offsets into a tracepoint's record), else through a helper
/// call per field.
pub mod tcp_probe_layout {
    pub const DADDR: u32 = 36;
    pub const SPORT: u32 = 64;
    pub const DPORT: u32 = 66;
    pub const FAMILY: u32 = 68;
    pub const DATA_LEN: u32 = 76;
}

/// `TCP_CLOSE_WAIT` of the kernel's TCP states: the peer sent its FIN.
pub const TCP_CLOSE_WAIT: i32 = 8;
/// `TCP_CLOSE`: the socket is gone (after the server's close, or reset by the peer).
pub const TCP_CLOSE: i32 = 7;

/// A TCP state change of a socket on a watched port (sock:inet_sock_set_state), only the
/// changes user space uses: into `TCP_CLOSE_WAIT` and into `TCP_CLOSE`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockStateRecord {
    pub record_type: u8,
    pub old_state: u8,
    pub new_state: u8,
    pub _pad0: u8,
    pub local_port: u16,
    pub _pad1: u16,
    pub ts_ns: u64,
    /// The socket's `struct sock` address: joins the change to its connection.
    pub sock: u64,
}

/// A process discovery had not (yet) traced accepted a connection on a watched port (an engine
/// restarted on its port): the kernel traces it from that accept on, so its first requests are
/// not lost while the agent's /proc rescan catches up; the record asks user space to attach now.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AdoptRecord {
    pub record_type: u8,
    pub _pad0: u8,
    pub local_port: u16,
    pub tgid: u32,
    pub ts_ns: u64,
}

/// What an engine's scheduler did, seen by a uprobe.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedKind {
    /// The thread that read an HTTP request handed the engine a task (its id).
    TaskPosted = 1,
    /// The scheduler gave the task a slot: prefill starts.
    TaskAdmitted = 2,
    /// An engine step (one forward pass over the batch) starts; `task_id` carries the batch's
    /// token count, or -1 where the ABI does not expose it.
    StepBegin = 3,
    /// The step returned; `task_id` carries its return code.
    StepEnd = 4,
    /// The engine produced a request's first token (user-defined probes).
    FirstToken = 5,
    /// The engine finished a request (user-defined probes).
    Finish = 6,
    /// The engine took a running request off the device (user-defined probes).
    Preempt = 7,
    /// No slot was free: the engine parked the task (its id) until one frees.
    TaskDeferred = 8,
    /// A slot (its id in `slot`) finished with its request and became free.
    SlotReleased = 9,
    /// A slot freed and the engine moved a parked task back to its queue (`slot` names the slot).
    DeferredRequeued = 10,
}

impl SchedKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::TaskPosted),
            2 => Some(Self::TaskAdmitted),
            3 => Some(Self::StepBegin),
            4 => Some(Self::StepEnd),
            5 => Some(Self::FirstToken),
            6 => Some(Self::Finish),
            7 => Some(Self::Preempt),
            8 => Some(Self::TaskDeferred),
            9 => Some(Self::SlotReleased),
            10 => Some(Self::DeferredRequeued),
            _ => None,
        }
    }
}

/// One scheduler event from a uprobe on the engine.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SchedRecord {
    pub record_type: u8,
    pub kind: u8,
    pub _pad: u16,
    pub tgid: u32,
    pub tid: u32,
    /// The engine's slot (sequence) the event concerns, or -1.
    pub slot: i32,
    pub ts_ns: u64,
    /// The engine's own task id (or, for steps, the value named by the kind), or -1.
    pub task_id: i64,
}

/// Probes a user-defined probe spec may hold (the kernel's configuration array size).
pub const MAX_USER_PROBES: u32 = 64;
/// Pointer dereferences a user-defined probe may chain before its final read.
pub const MAX_DEREFS: usize = 4;
/// Longest string id a user-defined probe reads (hashed in the kernel).
pub const MAX_ID_STRING: usize = 64;

/// Where a user-defined probe's value comes from.
pub const USER_SOURCE_NONE: u8 = 0;
/// Argument register `reg` (0..=5: the SysV integer argument registers) of a function entry.
pub const USER_SOURCE_ARG: u8 = 1;
/// The function's return value (uretprobe).
pub const USER_SOURCE_RET: u8 = 2;

/// A user-defined probe's configuration, indexed by its attach cookie. The value starts as the
/// register's content; each of the `n_derefs` steps adds `derefs[i]` and loads 8 bytes there.
/// With `final_read`, the value is then read at value + `offset`: an unsigned integer of `width`
/// bytes (1, 2, 4, 8), or, with `width` 0, a string of at most `string_len` bytes whose FNV-1a
/// hash becomes the value. Without it, the value is kept, cut to `width` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserProbeConfig {
    /// A [`SchedKind`].
    pub kind: u8,
    pub source: u8,
    pub reg: u8,
    pub n_derefs: u8,
    pub width: u8,
    pub string_len: u8,
    pub final_read: u8,
    pub _pad: u8,
    pub derefs: [i32; MAX_DEREFS],
    pub offset: i32,
    pub _pad1: u32,
}

/// A user-defined probe fired, but reading its value from the engine's memory failed.
pub const USER_FLAG_READ_FAILED: u16 = 1;
/// The probe reads no value.
pub const USER_FLAG_NO_VALUE: u16 = 2;

/// One hit of a user-defined probe.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserProbeRecord {
    pub record_type: u8,
    /// A [`SchedKind`].
    pub kind: u8,
    pub flags: u16,
    pub tgid: u32,
    pub tid: u32,
    /// The probe's index in the spec (its attach cookie).
    pub probe: u32,
    pub ts_ns: u64,
    pub value: i64,
}

/// Which CUDA entry point a [`GpuLaunchRecord`] or [`GpuNameRecord`] came from (the uprobe's
/// attach cookie carries it to the program).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuApi {
    CuLaunchKernel = 1,
    CuLaunchKernelPtsz = 2,
    CuLaunchCooperativeKernel = 3,
    CuLaunchCooperativeKernelPtsz = 4,
    CuLaunchKernelEx = 5,
    CuLaunchKernelExPtsz = 6,
    CuGraphLaunch = 7,
    CuGraphLaunchPtsz = 8,
    CudaLaunchKernel = 9,
    CudaLaunchKernelPtsz = 10,
    CudaGraphLaunch = 11,
    CudaGraphLaunchPtsz = 12,
    /// `cudaLaunchKernelExC` (what C++'s `cudaLaunchKernelEx` calls): a `cudaLaunchConfig_t`
    /// laid out as the driver's `CUlaunchConfig` up to the stream.
    CudaLaunchKernelExC = 13,
    CudaLaunchKernelExCPtsz = 14,
    /// `cuModuleGetFunction`: a `CUfunction` named from its module.
    CuModuleGetFunction = 32,
    /// `cuLibraryGetKernel`: a `CUkernel` named from its library (CUDA 12 context-free loading).
    CuLibraryGetKernel = 33,
    /// `cuKernelGetFunction`: the `CUfunction` of a `CUkernel` in the current context.
    CuKernelGetFunction = 34,
    /// `cudaGetKernel` (CUDA 12.1+, the way CUDA 13 code gets kernel handles): the
    /// `cudaKernel_t` (a `CUkernel`) of a host stub, named from the stub's symbol.
    CudaGetKernel = 35,
}

impl GpuApi {
    pub const ALL: [GpuApi; 18] = [
        GpuApi::CuLaunchKernel,
        GpuApi::CuLaunchKernelPtsz,
        GpuApi::CuLaunchCooperativeKernel,
        GpuApi::CuLaunchCooperativeKernelPtsz,
        GpuApi::CuLaunchKernelEx,
        GpuApi::CuLaunchKernelExPtsz,
        GpuApi::CuGraphLaunch,
        GpuApi::CuGraphLaunchPtsz,
        GpuApi::CudaLaunchKernel,
        GpuApi::CudaLaunchKernelPtsz,
        GpuApi::CudaGraphLaunch,
        GpuApi::CudaGraphLaunchPtsz,
        GpuApi::CudaLaunchKernelExC,
        GpuApi::CudaLaunchKernelExCPtsz,
        GpuApi::CuModuleGetFunction,
        GpuApi::CuLibraryGetKernel,
        GpuApi::CuKernelGetFunction,
        GpuApi::CudaGetKernel,
    ];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.iter().copied().find(|a| *a as u8 == v)
    }

    /// The exported symbol the uprobe sits on.
    pub fn symbol(self) -> &'static str {
        match self {
            GpuApi::CuLaunchKernel => "cuLaunchKernel",
            GpuApi::CuLaunchKernelPtsz => "cuLaunchKernel_ptsz",
            GpuApi::CuLaunchCooperativeKernel => "cuLaunchCooperativeKernel",
            GpuApi::CuLaunchCooperativeKernelPtsz => "cuLaunchCooperativeKernel_ptsz",
            GpuApi::CuLaunchKernelEx => "cuLaunchKernelEx",
            GpuApi::CuLaunchKernelExPtsz => "cuLaunchKernelEx_ptsz",
            GpuApi::CuGraphLaunch => "cuGraphLaunch",
            GpuApi::CuGraphLaunchPtsz => "cuGraphLaunch_ptsz",
            GpuApi::CudaLaunchKernel => "cudaLaunchKernel",
            GpuApi::CudaLaunchKernelPtsz => "cudaLaunchKernel_ptsz",
            GpuApi::CudaGraphLaunch => "cudaGraphLaunch",
            GpuApi::CudaGraphLaunchPtsz => "cudaGraphLaunch_ptsz",
            GpuApi::CudaLaunchKernelExC => "cudaLaunchKernelExC",
            GpuApi::CudaLaunchKernelExCPtsz => "cudaLaunchKernelExC_ptsz",
            GpuApi::CuModuleGetFunction => "cuModuleGetFunction",
            GpuApi::CuLibraryGetKernel => "cuLibraryGetKernel",
            GpuApi::CuKernelGetFunction => "cuKernelGetFunction",
            GpuApi::CudaGetKernel => "cudaGetKernel",
        }
    }

    /// A graph launch (its handle is a `CUgraphExec`), not a kernel launch.
    pub fn is_graph(self) -> bool {
        matches!(
            self,
            GpuApi::CuGraphLaunch
                | GpuApi::CuGraphLaunchPtsz
                | GpuApi::CudaGraphLaunch
                | GpuApi::CudaGraphLaunchPtsz
        )
    }

    /// A naming call whose second argument is the handle it resolves (`alias`), not a name:
    /// `cuKernelGetFunction(CUfunction*, CUkernel)`, `cudaGetKernel(cudaKernel_t*, stub)`.
    pub fn names_by_alias(self) -> bool {
        matches!(self, GpuApi::CuKernelGetFunction | GpuApi::CudaGetKernel)
    }

    /// A runtime (libcudart) entry point: its kernel handle is the host stub's address.
    pub fn is_runtime(self) -> bool {
        matches!(
            self,
            GpuApi::CudaLaunchKernel
                | GpuApi::CudaLaunchKernelPtsz
                | GpuApi::CudaLaunchKernelExC
                | GpuApi::CudaLaunchKernelExCPtsz
                | GpuApi::CudaGraphLaunch
                | GpuApi::CudaGraphLaunchPtsz
        )
    }
}

/// The record stands for more launches than itself: the process was over its launch-rate cap
/// and only one launch in [`LAUNCH_SAMPLE_EVERY`] is emitted; `skipped` counts the others.
pub const LAUNCH_FLAG_SAMPLED: u16 = 1;
/// Reading the launch's arguments from the process's memory (stack or launch config) failed:
/// grid, block, shared memory or stream may be 0.
pub const LAUNCH_FLAG_READ_FAILED: u16 = 2;
/// Above the cap, one launch in this many is emitted.
pub const LAUNCH_SAMPLE_EVERY: u32 = 16;
/// The window the launch-rate cap is counted over.
pub const LAUNCH_WINDOW_NS: u64 = 100_000_000;

/// One kernel or graph launch of a traced process, at the driver's or runtime's entry: the
/// host enqueue time, never the GPU's execution (only the CUPTI shim gives device start/end).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuLaunchRecord {
    pub record_type: u8,
    /// A [`GpuApi`].
    pub api: u8,
    /// `LAUNCH_FLAG_*`.
    pub flags: u16,
    pub tgid: u32,
    pub tid: u32,
    /// Dynamic shared memory bytes of a kernel launch.
    pub shared_mem: u32,
    /// CLOCK_MONOTONIC at the call's entry.
    pub ts_ns: u64,
    /// `CUfunction` (driver), host stub address (runtime), or `CUgraphExec` (graph launches).
    pub handle: u64,
    /// `CUstream` (0: the legacy default stream).
    pub stream: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Launches of this process (on this CPU) not emitted since its previous record: the
    /// launch-rate cap's sampling.
    pub skipped: u32,
    pub _pad: u32,
}

/// Longest kernel name a [`GpuNameRecord`] carries (longer ones are cut and flagged).
pub const MAX_KERNEL_NAME: usize = 256;
/// The name filled the record: it may be cut.
pub const NAME_FLAG_TRUNCATED: u16 = 1;

/// A kernel handle the driver handed out, with its (mangled) name: `cuModuleGetFunction` and
/// `cuLibraryGetKernel` name `handle`; `cuKernelGetFunction` says `handle` (a `CUfunction`) is
/// the kernel `alias` (a `CUkernel`) and carries no name; `cudaGetKernel` says `handle` (a
/// `cudaKernel_t`) is the kernel of host stub `alias` (named from the stub's symbol).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuNameRecord {
    pub record_type: u8,
    /// A [`GpuApi`].
    pub api: u8,
    /// `NAME_FLAG_*`.
    pub flags: u16,
    pub tgid: u32,
    pub ts_ns: u64,
    pub handle: u64,
    pub alias: u64,
    /// NUL-terminated unless it fills the array.
    pub name: [u8; MAX_KERNEL_NAME],
}

/// Arguments of a naming call saved at its entry for its return (per thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuNameCall {
    /// Where the driver writes the handle.
    pub out: u64,
    /// The name's address (or, for `cuKernelGetFunction`, the `CUkernel`).
    pub arg: u64,
    pub api: u8,
    pub _pad: [u8; 7],
}

/// Per process (and CPU): the launch-rate cap's window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LaunchRate {
    pub window_start_ns: u64,
    pub in_window: u32,
    pub skipped: u32,
}

/// FNV-1a, 64-bit: how string ids become integers (same on both sides).
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Indices into the per-CPU counter array. Every drop and truncation in the kernel lands here.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Records written to the ring buffer.
    RecordsEmitted = 0,
    /// Records lost because the ring buffer was full.
    RingbufFull = 1,
    /// Syscall records whose payload was cut at the capture limit.
    PayloadTruncated = 2,
    /// bpf_probe_read_user failed.
    CopyFailed = 3,
    /// The in-flight syscall map was full at entry; that syscall is not captured.
    InflightMapFull = 4,
    /// Segment records emitted.
    Segments = 5,
    /// Scheduler (uprobe) records emitted.
    SchedEvents = 6,
    /// A uprobe could not read the engine's memory where it expected its task.
    SchedReadFailed = 7,
    /// Connections the kernel saw accepted by a traced process.
    ConnsAccepted = 8,
    /// Reads/writes on fds that are no known connection, skipped in the kernel (files, pipes,
    /// eventfds, sockets the process did not accept).
    UnknownFdSkipped = 9,
    /// Connections whose TCP socket was learnt at their first read (no fexit at accept).
    SockFromRead = 10,
    /// fds duplicated (dup/dup2/dup3) onto a known connection.
    ConnsDuplicated = 11,
    /// Response writes emitted as a [`CompactWriteRecord`] (the ring buffer was filling).
    CompactWrites = 12,
    /// TCP state changes (peer FIN, socket gone) emitted for watched ports.
    SockStates = 13,
    /// Processes the kernel began tracing at their bind of (or accept on) a watched port
    /// ([`AdoptRecord`]).
    ProcessesAdopted = 14,
    /// GPU launch records emitted (uprobes on the CUDA driver and runtime).
    GpuLaunches = 15,
    /// GPU launches not emitted: their process was over its launch-rate cap (sampled; the
    /// records that were emitted carry how many each stands for).
    GpuLaunchesSampledOut = 16,
    /// Kernel handles named (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction).
    GpuNames = 17,
    /// A naming call's return could not read the handle or name it produced.
    GpuNameReadFailed = 18,
    /// Response writes summarised as a token event, counted when their [`TokenBatch`] is sent
    /// (with `RecordsEmitted - TokenBatches`, the syscalls the kernel captured).
    TokenEvents = 19,
    /// Response writes on a connection with a [`StreamTemplate`] that did not match it (a
    /// different event, or not one whole chunk): captured in full.
    TokenTemplateMisses = 20,
    /// Connections whose socket bytes turned out to be TLS ([`SyscallKind::Tls`]).
    TlsConnections = 21,
    /// Plaintext reads and writes emitted from the TLS library probes.
    TlsRecords = 22,
    /// TLS library objects (`SSL*`) tied to the connection they encrypt.
    TlsTies = 23,
    /// TLS reads and writes with plaintext that no traced connection could be tied to (the
    /// process's own client connections, or a connection caught mid-stream whose first write
    /// came before its first read): not captured.
    TlsUntied = 24,
    /// TLS library calls whose plaintext was dropped because another TLS probe run was using
    /// this CPU's scratch buffer (uprobe programs may be preempted on PREEMPT kernels).
    TlsNested = 25,
    /// Large captures whose chunks after the first record were not sent: the tail call to the
    /// chunk program failed (it could not be loaded).
    ChunksUnsent = 26,
    /// Syscalls (or TLS library calls) whose record was not sent: the tail call to the record
    /// program failed (user space installs it before attaching, so this stays 0).
    RecordsUnsent = 27,
    /// [`TokenBatchRecord`]s sent.
    TokenBatches = 28,
    /// Response heads whose connection found both its [`StreamTemplate`] slots held by other
    /// live connections: its writes are captured in full, as without a template.
    TokenSlotsBusy = 29,
    /// TCP writes whose bytes were still queued at their return (cork, autocork, a full
    /// congestion window), or whose socket could not be read, or whose paced socket (BBR, fq)
    /// had set its next departure after the return: stamped at their return, not at their
    /// transmission (see the eBPF crate's `socket/xmit.rs`).
    WritesStampedAtReturn = 30,
}

pub const COUNTER_SLOTS: u32 = 31;

/// Bytes of `struct tcp_sock` a write's exit reads at once for its transmit stamp (the eBPF
/// crate's `socket/xmit.rs`): user space leaves the stamp off where `write_seq`, `snd_nxt` and
/// `tcp_wstamp_ns` span more.
pub const XMIT_WINDOW: usize = 128;

/// The immediate of a `bpf_rdonly_cast` kfunc call as the eBPF object holds it: aya 0.14
/// resolves no kfunc calls, so the programs emit the call with this marker and user space
/// writes the kernel's BTF id of `bpf_rdonly_cast` over it before loading (or, where the kernel
/// has none, a register move: the programs then never take that path).
pub const KFUNC_RDONLY_CAST_MARKER: u32 = 0x6b66_7263;

impl Counter {
    pub const ALL: [Counter; 31] = [
        Counter::RecordsEmitted,
        Counter::RingbufFull,
        Counter::PayloadTruncated,
        Counter::CopyFailed,
        Counter::InflightMapFull,
        Counter::Segments,
        Counter::SchedEvents,
        Counter::SchedReadFailed,
        Counter::ConnsAccepted,
        Counter::UnknownFdSkipped,
        Counter::SockFromRead,
        Counter::ConnsDuplicated,
        Counter::CompactWrites,
        Counter::SockStates,
        Counter::ProcessesAdopted,
        Counter::GpuLaunches,
        Counter::GpuLaunchesSampledOut,
        Counter::GpuNames,
        Counter::GpuNameReadFailed,
        Counter::TokenEvents,
        Counter::TokenTemplateMisses,
        Counter::TlsConnections,
        Counter::TlsRecords,
        Counter::TlsTies,
        Counter::TlsUntied,
        Counter::TlsNested,
        Counter::ChunksUnsent,
        Counter::RecordsUnsent,
        Counter::TokenBatches,
        Counter::TokenSlotsBusy,
        Counter::WritesStampedAtReturn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::RecordsEmitted => "records_emitted",
            Counter::RingbufFull => "ringbuf_full_drops",
            Counter::PayloadTruncated => "payload_truncated",
            Counter::CopyFailed => "copy_failed",
            Counter::InflightMapFull => "inflight_map_full",
            Counter::Segments => "segments",
            Counter::SchedEvents => "sched_events",
            Counter::SchedReadFailed => "sched_read_failed",
            Counter::ConnsAccepted => "conns_accepted",
            Counter::UnknownFdSkipped => "unknown_fd_skipped",
            Counter::SockFromRead => "conn_sock_from_read",
            Counter::ConnsDuplicated => "conns_duplicated",
            Counter::CompactWrites => "compact_writes",
            Counter::SockStates => "sock_states",
            Counter::ProcessesAdopted => "processes_adopted",
            Counter::GpuLaunches => "gpu_launches",
            Counter::GpuLaunchesSampledOut => "gpu_launches_sampled_out",
            Counter::GpuNames => "gpu_names",
            Counter::GpuNameReadFailed => "gpu_name_read_failed",
            Counter::TokenEvents => "token_events",
            Counter::TokenTemplateMisses => "token_template_misses",
            Counter::TlsConnections => "tls_connections",
            Counter::TlsRecords => "tls_records",
            Counter::TlsTies => "tls_ties",
            Counter::TlsUntied => "tls_untied",
            Counter::TlsNested => "tls_nested",
            Counter::ChunksUnsent => "chunks_unsent",
            Counter::RecordsUnsent => "records_unsent",
            Counter::TokenBatches => "token_batches",
            Counter::TokenSlotsBusy => "token_slots_busy",
            Counter::WritesStampedAtReturn => "writes_stamped_at_return",
        }
    }
}

/// Key for per-(process, fd) maps.
#[inline(always)]
pub fn fd_key(tgid: u32, fd: i32) -> u64 {
    ((tgid as u64) << 32) | (fd as u32 as u64)
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain repr(C) integers and byte arrays with explicit padding fields.
    unsafe impl aya::Pod for super::SyscallRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CompactWriteRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TokenBatchRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TokenBatchEntry {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SegmentRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SockStateRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AdoptRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SchedRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UserProbeConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UserProbeRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnEntry {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::GpuLaunchRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::GpuNameRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StreamTemplate {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TlsKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TlsTie {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn layouts_are_stable() {
        assert_eq!(core::mem::size_of::<SyscallRecord>(), 80);
        assert_eq!(core::mem::size_of::<CompactWriteRecord>(), 40);
        assert_eq!(core::mem::size_of::<SegmentRecord>(), 64);
        assert_eq!(core::mem::size_of::<ConnEntry>(), 24);
        assert_eq!(core::mem::size_of::<TokenBatchRecord>(), 40);
        assert_eq!(core::mem::size_of::<TokenBatch>(), 40 + 8 * TOKEN_BATCH_MAX);
        assert_eq!(
            core::mem::size_of::<StreamTemplate>(),
            32 + 4 * TEMPLATE_BYTES + core::mem::size_of::<TokenBatch>()
        );
        assert_eq!(core::mem::size_of::<SchedRecord>(), 32);
        assert_eq!(core::mem::size_of::<UserProbeRecord>(), 32);
        assert_eq!(core::mem::size_of::<UserProbeConfig>(), 32);
        assert_eq!(core::mem::size_of::<GpuLaunchRecord>(), 72);
        assert_eq!(core::mem::size_of::<GpuNameRecord>(), 32 + MAX_KERNEL_NAME);
        assert_eq!(core::mem::offset_of!(SegmentRecord, remote_sockaddr), 24);
    }

    #[test]
    fn pressure_starts_at_an_eighth_of_large_rings_and_a_quarter_of_small_ones() {
        const MIB: u32 = 1 << 20;
        assert_eq!(pressure_bytes(16 * MIB), 2 * MIB);
        assert_eq!(pressure_bytes(64 * MIB), 8 * MIB);
        assert_eq!(pressure_bytes(8 * MIB), MIB);
        assert_eq!(pressure_bytes(MIB), MIB / 4);
    }

    #[test]
    fn fd_key_keeps_process_and_fd_apart() {
        assert_ne!(fd_key(1, 2), fd_key(2, 1));
        assert_eq!(fd_key(7, 3) >> 32, 7);
    }
}
