//! Ring-buffer bytes → typed events. The kernel wrote them, but lengths are still checked: a
//! layout mismatch must surface as a counted error, never as a panic or an out-of-bounds read.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The kind of a captured syscall, for callers outside the agent (fuzz targets, benchmarks).
pub use inferscope_common::SyscallKind as Kind;
use inferscope_common::{
    AdoptRecord, CompactWriteRecord, FLAG_CHUNK, FLAG_COPY_FAILED, FLAG_MORE, FLAG_TRUNCATED,
    RecordType, SchedKind, SchedRecord, SegmentRecord, SockStateRecord, SyscallKind, SyscallRecord,
    TOKEN_BATCH_MAX, TokenBatchEntry, TokenBatchRecord, USER_FLAG_READ_FAILED, UserProbeRecord,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RecordError {
    #[error("ring-buffer record shorter than its header")]
    Short,
    #[error("unknown ring-buffer record type")]
    UnknownType,
    #[error("unknown syscall kind")]
    UnknownKind,
    #[error("payload length disagrees with the record size")]
    BadLength,
}

impl RecordError {
    /// The agent counter this failure is counted in.
    pub(crate) fn counter(&self) -> inferscope_model::Counter {
        use inferscope_model::Counter;

        match self {
            RecordError::Short => Counter::RecordShort,
            RecordError::UnknownType => Counter::RecordUnknownType,
            RecordError::UnknownKind => Counter::RecordUnknownKind,
            RecordError::BadLength => Counter::RecordBadLength,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct SyscallEvent<'a> {
    pub kind: SyscallKind,
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    pub ts_enter_ns: u64,
    pub ts_exit_ns: u64,
    /// Bytes moved, the accepted fd, 0 for EOF, or -errno.
    pub ret: i64,
    pub truncated: bool,
    pub copy_failed: bool,
    /// The connection's id, from the kernel (0: an fd the kernel does not know as one).
    pub conn_gen: u64,
    /// `CONN_*` flags of that connection.
    pub conn_flags: u32,
    /// The connection's `struct sock` address (0: unknown).
    pub sock: u64,
    /// The record's number among its fd's records of its direction (reads and writes are
    /// numbered apart), lost ones included (`None` where no kernel numbered it: tests,
    /// replays). A close carries the next write number here.
    pub conn_seq: Option<u32>,
    /// A close's next read number (`None` for every other record).
    pub read_seq: Option<u32>,
    /// Records lost on this fd so far that began a response head.
    pub lost_heads: u32,
    pub payload: &'a [u8],
    /// Chunk records of the same syscall follow (see `capture::kernel::chunks`).
    pub more: bool,
    /// This record continues its thread's previous syscall record at this byte offset.
    pub chunk_offset: Option<u32>,
    /// A write the kernel recognised as one whole token event of the connection's template
    /// and did not copy (`payload` is empty, and no byte of it counts as lost).
    pub token: bool,
}

impl SyscallEvent<'_> {
    /// What names this event's connection in user space: the kernel's connection id (its high
    /// bit is set), else the fd number (which can never collide with an id).
    pub fn conn_key(&self) -> u64 {
        if self.conn_gen != 0 {
            self.conn_gen
        } else {
            u64::from(self.fd as u32)
        }
    }

    /// The connection was seen accepted by the kernel (or registered as pre-existing).
    pub fn conn_known(&self) -> bool {
        self.conn_gen != 0 && self.conn_flags & inferscope_common::CONN_KNOWN != 0
    }

    /// Bytes the syscall moved that are not in `payload`.
    pub fn lost_bytes(&self) -> u64 {
        if self.ret > 0 && !self.token {
            (self.ret as u64).saturating_sub(self.payload.len() as u64)
        } else {
            0
        }
    }
}

/// A TCP segment with payload arriving on a traced port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub ts_ns: u64,
    pub local_port: u16,
    pub remote: IpAddr,
    pub remote_port: u16,
    pub data_len: u32,
    /// The receiving socket's `struct sock` address (0: unknown).
    pub sock: u64,
}

/// A TCP state change of a socket on a watched port: the client's FIN, or the socket's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SockState {
    pub ts_ns: u64,
    /// The socket's `struct sock` address.
    pub sock: u64,
    pub local_port: u16,
    /// Kernel TCP states (`inferscope_common::TCP_*`).
    pub old_state: u8,
    pub new_state: u8,
}

/// A scheduler event from an engine uprobe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedEvent {
    pub kind: SchedKind,
    pub tgid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub task_id: i64,
    /// The engine slot (sequence) the event concerns, where the hook reads one.
    pub slot: Option<u32>,
    /// Set for user-defined probes: how the event finds its request.
    pub user: Option<UserJoin>,
}

/// How a user-defined probe's event finds its HTTP request (see `capture::elf::user_probes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserJoin {
    /// The event ran on the thread that read the request; `task_id` (if any) is linked to it.
    pub by_thread: bool,
    /// `task_id` holds the id the probe read.
    pub has_id: bool,
}

/// One hit of a user-defined probe, before the spec says what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UserProbeHit {
    pub probe: u32,
    pub kind: SchedKind,
    pub tgid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub value: i64,
    /// Reading the engine's memory failed (bad offset or pointer).
    pub read_failed: bool,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum CapturedEvent<'a> {
    Syscall(SyscallEvent<'a>),
    Segment(Segment),
    SockState(SockState),
    Sched(SchedEvent),
    UserProbe(UserProbeHit),
    GpuLaunch(super::gpu_records::LaunchEvent),
    GpuName(super::gpu_records::NameEvent<'a>),
    /// Consecutive token events of one connection, sent together.
    TokenBatch(TokenBatch<'a>),
    /// The kernel began tracing `tgid` at an accept on watched port `port` (an engine
    /// restarted on its port before discovery saw it).
    Adopted {
        tgid: u32,
        port: u16,
    },
}

/// The record at the start of `bytes`, which the kernel wrote. `Pod`: any bytes are a valid
/// value, so a corrupted or misread record is wrong data, never undefined behaviour.
fn read_struct<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked above; T is Pod (every bit pattern is a value) and the read is
    // unaligned-tolerant.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

pub(crate) fn parse(bytes: &[u8]) -> Result<CapturedEvent<'_>, RecordError> {
    let record_type = *bytes.first().ok_or(RecordError::Short)?;
    if record_type == RecordType::Syscall as u8 {
        syscall(bytes)
    } else if record_type == RecordType::GpuLaunch as u8 {
        let record: inferscope_common::GpuLaunchRecord =
            read_struct(bytes).ok_or(RecordError::Short)?;
        super::gpu_records::LaunchEvent::from_record(&record)
            .map(CapturedEvent::GpuLaunch)
            .ok_or(RecordError::UnknownKind)
    } else if record_type == RecordType::GpuName as u8 {
        if bytes.len() < std::mem::size_of::<inferscope_common::GpuNameRecord>() {
            return Err(RecordError::Short);
        }
        super::gpu_records::NameEvent::parse(bytes)
            .map(CapturedEvent::GpuName)
            .ok_or(RecordError::UnknownKind)
    } else if record_type == RecordType::CompactWrite as u8 {
        compact_write(bytes)
    } else if record_type == RecordType::TokenBatch as u8 {
        TokenBatch::parse(bytes).map(CapturedEvent::TokenBatch)
    } else if record_type == RecordType::Adopted as u8 {
        let record: AdoptRecord = read_struct(bytes).ok_or(RecordError::Short)?;
        Ok(CapturedEvent::Adopted {
            tgid: record.tgid,
            port: record.local_port,
        })
    } else if record_type == RecordType::Segment as u8 || record_type == RecordType::SockState as u8
    {
        tcp(record_type, bytes)
    } else if record_type == RecordType::Sched as u8 {
        let record: SchedRecord = read_struct(bytes).ok_or(RecordError::Short)?;
        Ok(CapturedEvent::Sched(SchedEvent {
            kind: SchedKind::from_u8(record.kind).ok_or(RecordError::UnknownKind)?,
            tgid: record.tgid,
            tid: record.tid,
            ts_ns: record.ts_ns,
            task_id: record.task_id,
            slot: u32::try_from(record.slot).ok(),
            user: None,
        }))
    } else if record_type == RecordType::UserProbe as u8 {
        let record: UserProbeRecord = read_struct(bytes).ok_or(RecordError::Short)?;
        Ok(CapturedEvent::UserProbe(UserProbeHit {
            probe: record.probe,
            kind: SchedKind::from_u8(record.kind).ok_or(RecordError::UnknownKind)?,
            tgid: record.tgid,
            tid: record.tid,
            ts_ns: record.ts_ns,
            value: record.value,
            read_failed: record.flags & USER_FLAG_READ_FAILED != 0,
        }))
    } else {
        Err(RecordError::UnknownType)
    }
}

/// The TCP layer's records: a received segment (for arrival times), a socket state change.
fn tcp(record_type: u8, bytes: &[u8]) -> Result<CapturedEvent<'_>, RecordError> {
    if record_type == RecordType::Segment as u8 {
        let record: SegmentRecord = read_struct(bytes).ok_or(RecordError::Short)?;
        Ok(CapturedEvent::Segment(Segment {
            ts_ns: record.ts_ns,
            local_port: record.local_port,
            remote: sockaddr_ip(record.family, &record.remote_sockaddr),
            remote_port: record.remote_port,
            data_len: record.data_len,
            sock: record.sock,
        }))
    } else if record_type == RecordType::SockState as u8 {
        let record: SockStateRecord = read_struct(bytes).ok_or(RecordError::Short)?;
        Ok(CapturedEvent::SockState(SockState {
            ts_ns: record.ts_ns,
            sock: record.sock,
            local_port: record.local_port,
            old_state: record.old_state,
            new_state: record.new_state,
        }))
    } else {
        Err(RecordError::UnknownType)
    }
}

/// A socket syscall's full record: its header and the payload bytes captured with it.
fn syscall(bytes: &[u8]) -> Result<CapturedEvent<'_>, RecordError> {
    let header: SyscallRecord = read_struct(bytes).ok_or(RecordError::Short)?;
    let kind = SyscallKind::from_u8(header.kind).ok_or(RecordError::UnknownKind)?;
    let start = std::mem::size_of::<SyscallRecord>();
    let end = start
        .checked_add(header.captured as usize)
        .ok_or(RecordError::BadLength)?;
    let payload = bytes.get(start..end).ok_or(RecordError::BadLength)?;
    Ok(CapturedEvent::Syscall(SyscallEvent {
        kind,
        tgid: header.tgid,
        tid: header.tid,
        fd: header.fd,
        ts_enter_ns: header.ts_enter_ns,
        ts_exit_ns: header.ts_exit_ns,
        ret: header.ret,
        truncated: header.flags & FLAG_TRUNCATED != 0,
        copy_failed: header.flags & FLAG_COPY_FAILED != 0,
        conn_gen: header.conn_gen,
        conn_flags: header.conn_flags,
        sock: header.sock,
        conn_seq: Some(header.conn_seq),
        read_seq: (kind == SyscallKind::Close).then_some(header.read_seq),
        lost_heads: header.lost_heads,
        payload,
        more: header.flags & FLAG_MORE != 0,
        chunk_offset: (header.flags & FLAG_CHUNK != 0).then_some(header.chunk_offset),
        token: false,
    }))
}

/// A write the kernel captured behind a filling ring buffer: the same event as a full record,
/// without what it does not keep (thread, exit time and socket, which writes do not use).
fn compact_write(bytes: &[u8]) -> Result<CapturedEvent<'_>, RecordError> {
    let header: CompactWriteRecord = read_struct(bytes).ok_or(RecordError::Short)?;
    let start = std::mem::size_of::<CompactWriteRecord>();
    let payload = bytes
        .get(start..start + usize::from(header.captured))
        .ok_or(RecordError::BadLength)?;
    let flags = u16::from(header.flags);
    Ok(CapturedEvent::Syscall(SyscallEvent {
        kind: SyscallKind::Write,
        tgid: header.tgid,
        tid: 0,
        fd: header.fd,
        ts_enter_ns: header.ts_enter_ns,
        ts_exit_ns: header.ts_enter_ns,
        ret: i64::from(header.ret),
        truncated: flags & FLAG_TRUNCATED != 0,
        copy_failed: flags & FLAG_COPY_FAILED != 0,
        conn_gen: header.conn_gen,
        conn_flags: u32::from(header.conn_flags),
        sock: 0,
        conn_seq: Some(header.conn_seq),
        read_seq: None,
        lost_heads: header.lost_heads,
        payload,
        more: false,
        chunk_offset: None,
        token: false,
    }))
}

/// Token events of one connection the kernel gathered and sent as one record
/// ([`TokenBatchRecord`]): each is a write of its own, with its time and size and no payload
/// (the kernel matched it against the connection's token template).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBatch<'a> {
    header: TokenBatchRecord,
    entries: &'a [u8],
}

impl<'a> TokenBatch<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Self, RecordError> {
        let header: TokenBatchRecord = read_struct(bytes).ok_or(RecordError::Short)?;
        let count = usize::from(header.count);
        if count == 0 || count > TOKEN_BATCH_MAX {
            return Err(RecordError::BadLength);
        }
        let start = std::mem::size_of::<TokenBatchRecord>();
        let entries = bytes
            .get(start..start + count * std::mem::size_of::<TokenBatchEntry>())
            .ok_or(RecordError::BadLength)?;
        Ok(Self { header, entries })
    }

    /// The batch's token events in the order they were written. The first carries the batch's
    /// record number, the others none (they took no number of their own).
    pub(crate) fn events(&self) -> impl Iterator<Item = SyscallEvent<'static>> + '_ {
        let header = self.header;
        self.entries
            .chunks_exact(std::mem::size_of::<TokenBatchEntry>())
            .filter_map(read_struct::<TokenBatchEntry>)
            .enumerate()
            .map(move |(i, entry)| {
                let ts = header
                    .first_ts_ns
                    .saturating_add(u64::from(entry.offset_ns));
                SyscallEvent {
                    kind: SyscallKind::Write,
                    tgid: header.tgid,
                    tid: 0,
                    fd: header.fd,
                    ts_enter_ns: ts,
                    ts_exit_ns: ts,
                    ret: i64::from(entry.bytes),
                    truncated: false,
                    copy_failed: false,
                    conn_gen: header.conn_gen,
                    conn_flags: u32::from(header.conn_flags),
                    sock: 0,
                    conn_seq: (i == 0).then_some(header.conn_seq),
                    read_seq: None,
                    lost_heads: header.lost_heads,
                    payload: &[],
                    more: false,
                    chunk_offset: None,
                    token: true,
                }
            })
    }
}

const AF_INET: u16 = 2;

/// IP of a kernel `sockaddr_in`/`sockaddr_in6`; IPv4-mapped IPv6 folds to IPv4 so both views
/// of a dual-stack connection compare equal.
pub(crate) fn sockaddr_ip(family: u16, raw: &[u8; 28]) -> IpAddr {
    if family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]))
    } else {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&raw[8..24]);
        canonical_ip(IpAddr::V6(Ipv6Addr::from(octets)))
    }
}

pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syscall_bytes(captured: u32, payload: &[u8]) -> Vec<u8> {
        let header = SyscallRecord {
            record_type: RecordType::Syscall as u8,
            kind: SyscallKind::Write as u8,
            flags: FLAG_TRUNCATED,
            tgid: 7,
            tid: 8,
            fd: 3,
            ts_enter_ns: 10,
            ts_exit_ns: 20,
            ret: 100,
            captured,
            conn_flags: 0,
            chunk_offset: 0,
            conn_gen: 0,
            sock: 0,
            conn_seq: 4,
            lost_heads: 1,
            read_seq: 0,
        };
        let mut bytes = vec![0u8; std::mem::size_of::<SyscallRecord>()];
        // SAFETY: `bytes` holds exactly one record, written unaligned.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), header) };
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn parses_syscall_with_payload() {
        let bytes = syscall_bytes(5, b"hello");
        let CapturedEvent::Syscall(ev) = parse(&bytes).unwrap() else {
            panic!("expected syscall")
        };
        assert_eq!(ev.payload, b"hello");
        assert_eq!(ev.kind, SyscallKind::Write);
        assert!(ev.truncated);
        assert_eq!(ev.lost_bytes(), 95);
        assert_eq!((ev.conn_seq, ev.lost_heads), (Some(4), 1));
    }

    #[test]
    fn parses_an_adoption_and_refuses_a_short_one() {
        let record = AdoptRecord {
            record_type: RecordType::Adopted as u8,
            _pad0: 0,
            local_port: 8080,
            tgid: 4242,
            ts_ns: 1,
        };
        let mut bytes = vec![0u8; std::mem::size_of::<AdoptRecord>()];
        // SAFETY: `bytes` holds exactly one record, written unaligned.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), record) };
        let Ok(CapturedEvent::Adopted { tgid, port }) = parse(&bytes) else {
            panic!("expected an adoption")
        };
        assert_eq!((tgid, port), (4242, 8080));
        bytes.pop();
        assert!(parse(&bytes).is_err());
    }

    #[test]
    fn parses_a_compact_write_as_a_write() {
        let header = CompactWriteRecord {
            record_type: RecordType::CompactWrite as u8,
            flags: FLAG_TRUNCATED as u8,
            captured: 4,
            conn_flags: inferscope_common::CONN_KNOWN as u8,
            tgid: 7,
            fd: 3,
            ret: 270,
            ts_enter_ns: 10,
            conn_gen: 1 << 63 | 5,
            conn_seq: 9,
            lost_heads: 2,
        };
        let mut bytes = vec![0u8; std::mem::size_of::<CompactWriteRecord>()];
        // SAFETY: `bytes` holds exactly one record, written unaligned.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), header) };
        bytes.extend_from_slice(b"10e\r");
        let CapturedEvent::Syscall(ev) = parse(&bytes).unwrap() else {
            panic!("expected syscall")
        };
        assert_eq!(ev.kind, SyscallKind::Write);
        assert_eq!(ev.payload, b"10e\r");
        assert_eq!(ev.lost_bytes(), 266);
        assert!(ev.truncated && ev.conn_known());
        assert_eq!(
            (ev.ts_enter_ns, ev.ret, ev.conn_key()),
            (10, 270, 1 << 63 | 5)
        );
        assert_eq!((ev.conn_seq, ev.lost_heads), (Some(9), 2));
        // A payload shorter than it claims is refused, as for full records.
        bytes.pop();
        assert_eq!(parse(&bytes).unwrap_err(), RecordError::BadLength);
        assert_eq!(parse(&bytes[..20]).unwrap_err(), RecordError::Short);
    }

    fn token_batch_bytes(count: u8, entries: &[(u32, u32)]) -> Vec<u8> {
        let header = TokenBatchRecord {
            record_type: RecordType::TokenBatch as u8,
            count,
            conn_flags: inferscope_common::CONN_KNOWN as u8,
            tgid: 7,
            fd: 3,
            conn_gen: 1 << 63 | 5,
            first_ts_ns: 1_000_000,
            conn_seq: 12,
            lost_heads: 1,
            ..Default::default()
        };
        let mut bytes = vec![0u8; std::mem::size_of::<TokenBatchRecord>()];
        // SAFETY: `bytes` holds exactly one header, written unaligned.
        unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast(), header) };
        for &(offset_ns, size) in entries {
            bytes.extend_from_slice(&offset_ns.to_ne_bytes());
            bytes.extend_from_slice(&size.to_ne_bytes());
        }
        bytes
    }

    #[test]
    fn a_token_batch_is_its_token_events_with_their_own_times() {
        let bytes = token_batch_bytes(3, &[(0, 270), (41_000, 271), (u32::MAX, 9)]);
        let CapturedEvent::TokenBatch(batch) = parse(&bytes).unwrap() else {
            panic!("expected a token batch")
        };
        let events: Vec<_> = batch.events().collect();
        assert_eq!(events.len(), 3);
        let times: Vec<_> = events.iter().map(|e| e.ts_enter_ns).collect();
        assert_eq!(
            times,
            [1_000_000, 1_041_000, 1_000_000 + u64::from(u32::MAX)]
        );
        assert!(events.iter().all(|e| e.token
            && e.kind == SyscallKind::Write
            && e.payload.is_empty()
            && e.lost_bytes() == 0
            && e.conn_key() == 1 << 63 | 5
            && e.conn_known()
            && e.ts_exit_ns == e.ts_enter_ns));
        assert_eq!(
            events.iter().map(|e| e.ret).collect::<Vec<_>>(),
            [270, 271, 9]
        );
        // The batch took one record number: its first event carries it.
        assert_eq!(
            events.iter().map(|e| e.conn_seq).collect::<Vec<_>>(),
            [Some(12), None, None]
        );
    }

    #[test]
    fn a_token_batch_whose_count_lies_is_refused() {
        let two = [(0, 1), (5, 1)];
        assert_eq!(
            parse(&token_batch_bytes(3, &two)).unwrap_err(),
            RecordError::BadLength
        );
        assert_eq!(
            parse(&token_batch_bytes(0, &two)).unwrap_err(),
            RecordError::BadLength
        );
        let many = vec![(0, 1); 40];
        assert_eq!(
            parse(&token_batch_bytes(40, &many)).unwrap_err(),
            RecordError::BadLength
        );
        assert_eq!(
            parse(&token_batch_bytes(2, &two)[..30]).unwrap_err(),
            RecordError::Short
        );
    }

    #[test]
    fn rejects_lying_lengths_and_garbage() {
        assert_eq!(
            parse(&syscall_bytes(50, b"hi")).unwrap_err(),
            RecordError::BadLength
        );
        assert_eq!(parse(&[]).unwrap_err(), RecordError::Short);
        assert_eq!(parse(&[99, 1, 2]).unwrap_err(), RecordError::UnknownType);
        assert_eq!(parse(&[1, 1, 2]).unwrap_err(), RecordError::Short);
        // GPU launch and name records: cut short, or naming an entry point that does not exist.
        assert_eq!(parse(&[9, 1, 2]).unwrap_err(), RecordError::Short);
        assert_eq!(parse(&[10, 32, 0]).unwrap_err(), RecordError::Short);
        let mut launch = [0u8; 72];
        launch[0] = 9;
        launch[1] = 200;
        assert_eq!(parse(&launch).unwrap_err(), RecordError::UnknownKind);
        launch[1] = inferscope_common::GpuApi::CuGraphLaunch as u8;
        assert!(matches!(parse(&launch), Ok(CapturedEvent::GpuLaunch(l)) if l.api.is_graph()));
    }

    #[test]
    fn kernel_names_end_at_their_nul_or_the_record() {
        let size = std::mem::size_of::<inferscope_common::GpuNameRecord>();
        let mut raw = vec![0u8; size];
        raw[0] = 10;
        raw[1] = inferscope_common::GpuApi::CuModuleGetFunction as u8;
        raw[32..38].copy_from_slice(b"gemm\0x");
        let Ok(CapturedEvent::GpuName(name)) = parse(&raw) else {
            panic!("a name record");
        };
        assert_eq!(name.name, b"gemm");
        // No NUL at all (a name that filled the record): the whole array, nothing beyond.
        raw[32..].fill(b'a');
        raw.extend_from_slice(b"beyond");
        let Ok(CapturedEvent::GpuName(name)) = parse(&raw) else {
            panic!("a name record");
        };
        assert_eq!(name.name.len(), inferscope_common::MAX_KERNEL_NAME);
    }

    #[test]
    fn ipv4_mapped_addresses_fold_to_ipv4() {
        let mut raw = [0u8; 28];
        raw[18] = 0xff;
        raw[19] = 0xff;
        raw[20..24].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(sockaddr_ip(10, &raw), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let mut raw4 = [0u8; 28];
        raw4[4..8].copy_from_slice(&[10, 1, 2, 3]);
        assert_eq!(
            sockaddr_ip(2, &raw4),
            IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3))
        );
    }
}
