//! tcp:tcp_probe fires in tcp_rcv_established for every segment a socket receives, before the
//! data is queued, so it stamps when a request's bytes reached the server, however late the
//! server then reads them.
use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::tracepoint, programs::TracePointContext};
use inferscope_common::{Counter, RecordType, SegmentRecord};

use crate::{ctx::field, maps::watched, ringbuf::output};

// Field offsets from /sys/kernel/tracing/events/tcp/tcp_probe/format (stable since 5.x).
const DADDR: usize = 36;
const SPORT: usize = 64;
const DPORT: usize = 66;
const FAMILY: usize = 68;
const DATA_LEN: usize = 76;
/// Offset of `skaddr` (the receiving socket, the address fexit on inet_csk_accept hands the
/// accept) in this kernel's tcp_probe record: it moved between releases, so user space reads it
/// from the tracepoint's format at load time (0: unknown, segments join by address only).
#[unsafe(no_mangle)]
static TCP_PROBE_SKADDR: u32 = 0;

#[tracepoint]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_probe(&ctx);
    0
}

#[inline(always)]
fn skaddr(ctx: &TracePointContext) -> u64 {
    let offset = unsafe { core::ptr::read_volatile(&TCP_PROBE_SKADDR) } as usize;
    if offset == 0 || offset > 4096 {
        return 0;
    }
    unsafe { ctx.read_at::<u64>(offset) }.unwrap_or(0)
}

#[inline(always)]
fn try_tcp_probe(ctx: &TracePointContext) -> Result<(), i32> {
    let data_len: u16 = field(ctx, DATA_LEN);
    if data_len == 0 {
        return Ok(());
    }
    // sport is the receiving socket's own (local) port, in host order.
    let local_port: u16 = field(ctx, SPORT);
    if !watched(local_port) {
        return Ok(());
    }
    let record = SegmentRecord {
        record_type: RecordType::Segment as u8,
        _pad0: 0,
        family: field(ctx, FAMILY),
        data_len: data_len as u32,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        local_port,
        remote_port: field(ctx, DPORT),
        _pad1: 0,
        remote_sockaddr: unsafe { ctx.read_at(DADDR)? },
        _pad2: 0,
        sock: skaddr(ctx),
    };
    output::<SegmentRecord>(&record, Counter::Segments);
    Ok(())
}
