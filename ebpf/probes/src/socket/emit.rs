//! A traced syscall's record, once its payload is copied: the one place that decides what the
//! ring buffer gets (a TLS hand-shake noted, a token event batched, a compact write behind a
//! filling ring, or the full record and its chunks), shared by the syscall exits and the TLS
//! probes; and the control records (close, shutdown, TLS) that move no bytes.
use core::mem::size_of;

use aya_ebpf::helpers::bpf_ktime_get_ns;
use inferscope_common::{
    CONN_SHARED, CONN_TLS, CompactWriteRecord, ConnEntry, Counter, FLAG_COPY_FAILED,
    FLAG_TRUNCATED, MAX_CAPTURE_BYTES, RecordType, SyscallKind, SyscallRecord, fd_key,
};

use super::{
    copy::{ScratchOwner, copy_payload},
    tls_ties,
    token::{TokenWriter, Verdict},
};
use crate::{
    counters::bump,
    maps::{Inflight, Scratch},
    ringbuf::{PRESSURE_PREFIX, PRESSURE_WHOLE, output, output_bytes},
};

/// What `exit_syscall` leaves `exit_record` (and `tls_return` leaves `tls_record`): the call,
/// and how much of its payload now sits in the caller's scratch.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PendingRecord {
    inflight: Inflight,
    ret: i64,
    captured: u64,
    tgid: u32,
    tid: u32,
    flags: u16,
    _pad: [u8; 6],
}

impl PendingRecord {
    /// The call of thread `pid_tgid`, with [`copy_into`]'s answer.
    #[inline(always)]
    pub(super) fn new(inflight: Inflight, ret: i64, copied: (usize, u16), pid_tgid: u64) -> Self {
        Self {
            inflight,
            ret,
            captured: copied.0 as u64,
            tgid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
            flags: copied.1,
            _pad: [0; 6],
        }
    }
}

/// The record of a call handed over in `pending`, its payload already in `scratch`.
#[inline(always)]
pub(super) fn emit_pending(
    pending: &PendingRecord,
    owner: ScratchOwner,
    scratch: &mut Scratch,
) -> Result<bool, i32> {
    // The copy never captures more than a record holds; the bound is restated for the
    // verifier, which sees a number from a map.
    let captured = if pending.captured > MAX_CAPTURE_BYTES as u64 {
        MAX_CAPTURE_BYTES
    } else {
        pending.captured as usize
    };
    emit_copied(
        pending.tgid,
        pending.tid,
        pending.inflight.fd,
        pending.ret,
        &pending.inflight,
        owner,
        scratch,
        (captured, pending.flags),
    )
}

/// Writes the syscall's record, with up to the capture limit of the bytes it moved, built in
/// `scratch` (the caller's own per-CPU buffer, which `owner` names), in one program
/// (`exit_accept`'s; the others hand over between [`copy_into`] and [`emit_pending`]). True when
/// the rest of a large capture is due ([`super::copy::emit_due_chunks`], at the end of the
/// program).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn emit_syscall(
    tgid: u32,
    tid: u32,
    fd: i32,
    ret: i64,
    inflight: &Inflight,
    owner: ScratchOwner,
    scratch: &mut Scratch,
) -> Result<bool, i32> {
    let copied = copy_into(inflight, ret, &mut scratch.payload);
    emit_copied(tgid, tid, fd, ret, inflight, owner, scratch, copied)
}

/// Copies up to the capture limit of the bytes the syscall moved into `payload`: (bytes
/// captured, record flags), cuts and failed reads counted.
#[inline(always)]
pub(super) fn copy_into(
    inflight: &Inflight,
    ret: i64,
    payload: &mut [u8; 2 * MAX_CAPTURE_BYTES],
) -> (usize, u16) {
    let mut captured = 0usize;
    let mut flags = 0u16;
    if ret > 0 && inflight.kind != SyscallKind::Accept as u8 {
        let copy = copy_payload(inflight, ret as u64, payload);
        captured = copy.captured;
        if copy.truncated {
            flags |= FLAG_TRUNCATED;
            bump(Counter::PayloadTruncated);
        }
        if copy.failed {
            flags |= FLAG_COPY_FAILED;
            bump(Counter::CopyFailed);
        }
    }
    (captured, flags)
}

/// [`emit_syscall`] once the payload is in `scratch`: `copied` is [`copy_into`]'s answer.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn emit_copied(
    tgid: u32,
    tid: u32,
    fd: i32,
    ret: i64,
    inflight: &Inflight,
    owner: ScratchOwner,
    scratch: &mut Scratch,
    copied: (usize, u16),
) -> Result<bool, i32> {
    let kind = inflight.kind;
    let (captured, flags) = copied;
    if (kind == SyscallKind::Read as u8 || kind == SyscallKind::Write as u8)
        && inflight.conn_id != 0
        && inflight.conn_flags & CONN_TLS == 0
        && tls_ties::looks_like_tls(&scratch.payload, captured)
        && tls_ties::may_begin_tls(
            fd_key(tgid, fd),
            kind == SyscallKind::Write as u8,
            inflight.conn_flags,
            &scratch.payload,
            captured,
        )
    {
        let pid_tgid = (u64::from(tgid) << 32) | u64::from(tid);
        let write = kind == SyscallKind::Write as u8;
        if let Some(conn) = tls_ties::detected(pid_tgid, fd, inflight.conn_id, write) {
            // Not a data record: the fd's record numbers do not move.
            let _ = emit_control(SyscallKind::Tls, tgid, tid, fd, 0, conn, (0, 0), 0);
        }
        return Ok(false);
    }
    // A read that opens with HTTP/2's client preface (`PRI `): the process serves HTTP/2. A
    // client sends its first calls right behind the preface, before user space has seen it; a
    // cut read of them would lose the connection's framing and HPACK state.
    if kind == SyscallKind::Read as u8 && captured >= 4 && {
        let p = &scratch.payload;
        p[0] == b'P' && p[1] == b'R' && p[2] == b'I' && p[3] == b' '
    } {
        super::copy::capture_large_from_now(tgid);
    }
    // A write that opens a response head (`HTTP/`): read once, before emitting may reuse the
    // scratch payload for later chunks.
    let head = kind == SyscallKind::Write as u8 && captured >= 5 && {
        let p = &scratch.payload;
        p[0] == b'H' && p[1] == b'T' && p[2] == b'T' && p[3] == b'P' && p[4] == b'/'
    };
    let mut arm = false;
    if inflight.conn_id != 0
        && (kind == SyscallKind::Read as u8 || (kind == SyscallKind::Write as u8 && ret <= 0))
    {
        // A read (the client's end of file or reset, a pipelined request) or a failed write
        // may end the response in user space: the token events before it go first.
        super::token::flush_connection(fd_key(tgid, fd), inflight.conn_id);
    }
    if kind == SyscallKind::Write as u8 && inflight.conn_id != 0 && ret > 0 {
        let key = fd_key(tgid, fd);
        if head {
            super::token::on_head(tgid, key, inflight.conn_id);
        } else if let Some(template) = super::token::lookup(key, inflight.conn_id) {
            let whole = flags == 0 && captured as i64 == ret;
            match super::token::classify(
                template,
                inflight.conn_id,
                &scratch.payload,
                captured,
                whole,
            ) {
                Verdict::Token => {
                    let writer = TokenWriter {
                        tgid,
                        fd,
                        conn_gen: inflight.conn_id,
                        conn_flags: inflight.conn_flags,
                    };
                    super::token::batch(template, key, &writer, inflight.ts_enter_ns, ret as u32);
                    return Ok(false);
                }
                Verdict::Arm => arm = whole,
                Verdict::Miss => super::token::flush(template, key),
            }
        }
    }
    // Adaptive capture: behind a filling ring, response writes other than heads keep only a
    // prefix (counted as truncation) under a half-size header, so a stalled agent loses token
    // text, not requests.
    if kind == SyscallKind::Write as u8
        && !head
        && !arm
        && ret > 0
        && ret <= u32::MAX as i64
        && crate::ringbuf::may_cut(tgid, fd, inflight)
        && crate::ringbuf::under_pressure()
    {
        return emit_compact(tgid, fd, ret as u32, captured, flags, inflight, scratch)
            .map(|_| false);
    }
    // A write's time is its entry or its transmission (user space reads no other): one clock
    // read fewer. A read whose arguments were taken at its exit was stamped there.
    let ts_exit = if kind == SyscallKind::Write as u8 || inflight.at_exit != 0 {
        inflight.ts_enter_ns
    } else {
        // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
        unsafe { bpf_ktime_get_ns() }
    };
    let key = fd_key(tgid, fd);
    let (conn_seq, lost_heads) = if kind == SyscallKind::Accept as u8 {
        crate::conn_seq::reset(key);
        (0, 0)
    } else {
        crate::conn_seq::take(key, kind == SyscallKind::Write as u8)
    };
    scratch.header = SyscallRecord {
        record_type: RecordType::Syscall as u8,
        kind,
        flags,
        tgid,
        tid,
        fd,
        ts_enter_ns: inflight.ts_enter_ns,
        ts_exit_ns: ts_exit,
        ret,
        captured: captured as u32,
        conn_flags: inflight.conn_flags,
        conn_gen: inflight.conn_id,
        sock: inflight.sock,
        conn_seq,
        lost_heads,
        chunk_offset: 0,
        read_seq: 0,
    };
    let sent = super::copy::emit_chunks(scratch, owner, captured, inflight);
    if !sent.first {
        crate::conn_seq::lost(key, head);
    } else if arm {
        super::token::arm(key, inflight.conn_id);
    }
    Ok(sent.chunks_due)
}

// The compact header fits in front of the payload, and its byte-wide fields hold what they carry.
const _: () = assert!(
    size_of::<CompactWriteRecord>() <= size_of::<SyscallRecord>()
        && PRESSURE_WHOLE <= u8::MAX as usize
        && PRESSURE_PREFIX <= PRESSURE_WHOLE
        && CONN_SHARED <= u8::MAX as u32
        && FLAG_COPY_FAILED <= u8::MAX as u16
);

/// A write behind a filling ring buffer: a [`CompactWriteRecord`] with the write whole if it is
/// short, else its first `PRESSURE_PREFIX` bytes. Its header is written into the scratch just before the
/// payload, so header and payload go out as one contiguous record.
#[inline(always)]
fn emit_compact(
    tgid: u32,
    fd: i32,
    ret: u32,
    captured: usize,
    mut flags: u16,
    inflight: &Inflight,
    scratch: &mut Scratch,
) -> Result<(), i32> {
    let keep = if captured > PRESSURE_WHOLE {
        if flags & FLAG_TRUNCATED == 0 {
            flags |= FLAG_TRUNCATED;
            bump(Counter::PayloadTruncated);
        }
        PRESSURE_PREFIX
    } else {
        captured
    };
    emit_compact_record(
        tgid,
        fd,
        ret,
        keep,
        flags,
        Counter::CompactWrites,
        inflight,
        scratch,
    )
}

/// A record about a connection that moves no bytes (close, shutdown), stamped now; the record
/// back when the ring buffer had no room for it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn emit_control(
    kind: SyscallKind,
    tgid: u32,
    tid: u32,
    fd: i32,
    ret: i64,
    conn: ConnEntry,
    (conn_seq, read_seq): (u32, u32),
    lost_heads: u32,
) -> Option<SyscallRecord> {
    // SAFETY: bpf_ktime_get_ns takes no arguments and touches no memory.
    let ts = unsafe { bpf_ktime_get_ns() };
    let record = SyscallRecord {
        record_type: RecordType::Syscall as u8,
        kind: kind as u8,
        flags: 0,
        tgid,
        tid,
        fd,
        ts_enter_ns: ts,
        ts_exit_ns: ts,
        ret,
        captured: 0,
        conn_flags: conn.flags,
        conn_gen: conn.id,
        sock: conn.sock,
        conn_seq,
        lost_heads,
        chunk_offset: 0,
        read_seq,
    };
    (!output::<SyscallRecord>(&record, Counter::RecordsEmitted)).then_some(record)
}

/// Sends a [`CompactWriteRecord`] with the first `keep` bytes of the scratch payload, counting
/// `counter` once it is in the ring. The header is written into the scratch just before the
/// payload (the exit program's stack has little room left), so header and payload go out as
/// one contiguous record.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn emit_compact_record(
    tgid: u32,
    fd: i32,
    ret: u32,
    keep: usize,
    flags: u16,
    counter: Counter,
    inflight: &Inflight,
    scratch: &mut Scratch,
) -> Result<(), i32> {
    let key = fd_key(tgid, fd);
    let (conn_seq, lost_heads) = crate::conn_seq::take(key, true);
    let header = CompactWriteRecord {
        record_type: RecordType::CompactWrite as u8,
        flags: flags as u8,
        captured: keep as u8,
        conn_flags: inflight.conn_flags as u8,
        tgid,
        fd,
        ret,
        ts_enter_ns: inflight.ts_enter_ns,
        conn_gen: inflight.conn_id,
        conn_seq,
        lost_heads,
    };
    let offset = size_of::<SyscallRecord>() - size_of::<CompactWriteRecord>();
    // SAFETY: the compact header overwrites the tail of the scratch's full header, which it
    // fits (asserted above), and ends where the payload begins; `keep` is at most
    // PRESSURE_WHOLE, inside the payload.
    let bytes = unsafe {
        let base = (scratch as *mut Scratch).cast::<u8>().add(offset);
        core::ptr::write_unaligned(base.cast::<CompactWriteRecord>(), header);
        core::slice::from_raw_parts(base, size_of::<CompactWriteRecord>() + keep)
    };
    if output_bytes::<{ (size_of::<CompactWriteRecord>() + PRESSURE_WHOLE) as u32 }>(
        bytes,
        Counter::RecordsEmitted,
    ) {
        bump(counter);
    }
    Ok(())
}
